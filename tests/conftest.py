"""Shared fixtures: one Ray cluster per test process (three nodes on this machine, so one-relay-per-node and the
chain are exercised), and a tiny random model directory with the demo task's tokenizer.

`make test` runs the suite in one process. Under pytest-xdist (`-n 3 --dist loadfile`) a file's tests stay in one
process, so module fixtures (a whole run shared by its checks) are built once, and each process that runs a
cluster test starts its own cluster on its own ports, shut down when that process ends."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

os.environ.setdefault("RAY_AUTH_MODE", "disabled")
os.environ.setdefault("RAY_DEDUP_LOGS", "0")
# Keep every Ray node on loopback: Ray otherwise resolves 127.0.0.1 to the machine's outward address and the
# driver looks for a loopback-bound GCS there. Must be set before ray is imported.
os.environ.setdefault("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER", "0")

# A node of the session cluster; test_machine_loss adds nodes back with the same arguments.
WORKER_NODE = {"num_cpus": 4, "object_store_memory": 96 << 20, "node_ip_address": "127.0.0.1"}


def pytest_itemcollected(item: pytest.Item) -> None:
    """Every test on the Ray cluster is marked `cluster`: `pytest -m "not cluster"` runs the rest, a quick loop."""
    if "ray_cluster" in getattr(item, "fixturenames", ()):
        item.add_marker(pytest.mark.cluster)


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """The modules with a test on the Ray cluster run last, in their order: the cluster (a dozen processes that
    take a few hundredths of a core while idle) starts with the first of them instead of the suite's first
    tenth, and a module's tests stay together, so its module fixtures are built once."""
    on_cluster = {item.path for item in items if "ray_cluster" in item.fixturenames}
    items.sort(key=lambda item: item.path in on_cluster)


@pytest.fixture(scope="session")
def ray_cluster():
    """A head node plus two worker nodes, each with a little object store; shut down at the end."""
    import ray
    from ray.cluster_utils import Cluster

    cluster = Cluster(
        initialize_head=True,
        head_node_args={
            "num_cpus": 6,
            "object_store_memory": 96 << 20,
            "node_ip_address": "127.0.0.1",
            "include_dashboard": False,
            "dashboard_agent_listen_port": None,  # any free port: another test process may run a cluster too
            # a lost machine known dead within about 2.5 s (Ray's default: 3 s x 5 checks), so test_machine_loss
            # waits less. Only a check that fails counts, not a slow one (each has Ray's 10 s timeout), and a live
            # raylet answers its checks from its own threads however busy the cores are
            "_system_config": {"health_check_period_ms": 500, "health_check_failure_threshold": 5},
        },
    )
    for _ in range(2):
        cluster.add_node(**WORKER_NODE)
    ray.init(address=cluster.address)
    cluster.wait_for_nodes()
    yield cluster
    ray.shutdown()
    cluster.shutdown()


def task_model_dir(out: Path, hidden_size: int, layers: int, max_positions: int = 128) -> Path:
    """A random Llama over the reverse task's vocabulary, saved as a Hugging Face directory."""
    from laminar.data.codec import save_model_dir
    from laminar.tasks.reverse import demo_codec
    from tests.tiny import tiny_llama

    codec = demo_codec()
    model = tiny_llama(
        codec.vocab_size,
        hidden_size=hidden_size,
        intermediate_size=3 * hidden_size,
        num_hidden_layers=layers,
        num_attention_heads=4,
        max_position_embeddings=max_positions,
        bos_token_id=codec.bos_id,
        eos_token_id=codec.eos_id,
        pad_token_id=codec.pad_id,
    )
    return save_model_dir(model, codec, out)


@pytest.fixture(scope="session")
def tiny_model_dir(tmp_path_factory) -> Path:
    """Two layers, hidden 32: the runtime's tests need a model, not a good one."""
    return task_model_dir(tmp_path_factory.mktemp("tiny-model"), hidden_size=32, layers=2)


@pytest.fixture(scope="session")
def slower_model_dir(tmp_path_factory) -> Path:
    """Four layers, hidden 256: a batch's tail lasts long enough for the repack loop to see it."""
    return task_model_dir(
        tmp_path_factory.mktemp("slower-model"), hidden_size=256, layers=4, max_positions=160
    )
