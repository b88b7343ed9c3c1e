"""The relay chain on a multi-node Ray cluster: one relay per node, a publisher, pulls, and dead relays."""

from __future__ import annotations

import os
import signal
import threading

import numpy as np
import pytest
import ray

from laminar.engine.layout import WeightLayout
from laminar.relay.chain import build_chain, relay_on_node
from laminar.relay.publisher import WeightPublisher
from laminar.relay.pull import pull_latest
from laminar.relay.relay import RelaySettings

pytestmark = pytest.mark.timeout(180)

NBYTES = 4 << 20
CHUNK = 256 << 10


SETTINGS = RelaySettings(bytes(range(32)), chunk_bytes=CHUNK)  # a test run's secret and chunk size
Layout = WeightLayout.raw  # bytes, not a model: one flat uint8 tensor


def weights(version: int, nbytes: int = NBYTES) -> np.ndarray:
    return np.random.default_rng(version).integers(0, 256, size=nbytes, dtype=np.uint8)


def check_pull(relay, version: int) -> None:
    """Pull into a torch buffer like an engine would, and compare with what was published."""
    import torch

    target = torch.empty(NBYTES, dtype=torch.uint8)
    seen = {}

    def load(buf: np.ndarray, layout, v: int) -> None:
        target.copy_(torch.from_numpy(buf))
        seen["v"], seen["layout"] = v, layout

    got = pull_latest(relay, load, version - 1, timeout=30)
    assert got is not None and got[0] == version == seen["v"]
    assert seen["layout"].total_bytes == NBYTES
    assert np.array_equal(target.numpy(), weights(version))
    assert pull_latest(relay, load, version, timeout=30) is None  # nothing newer


@pytest.fixture(scope="module")
def nodes(ray_cluster):
    ids = [n["NodeID"] for n in ray.nodes() if n.get("Alive")]
    assert len(ids) >= 3, ids
    return ids


def place_relays(node_ids: list[str], settings: RelaySettings, *, prefix: str) -> list:
    """One relay per node, in the given order."""
    return [relay_on_node(nid, f"{prefix}-{i}", settings) for i, nid in enumerate(node_ids)]


def kill_all(relays) -> None:
    for r in relays:
        try:
            ray.get(r.shutdown.remote(), timeout=10)
        except Exception:  # noqa: BLE001 - some were killed on purpose
            pass
        ray.kill(r)


def test_every_node_relay_gets_identical_versions(nodes):
    relays = place_relays(nodes[:3], SETTINGS, prefix="ident")
    build_chain(relays)
    pub = WeightPublisher(relays[0])
    pids = {ray.get(r.ping.remote(), timeout=30)["pid"] for r in relays}
    assert len(pids) == 3
    seen: list[tuple[int, bool]] = []
    stop = threading.Event()

    def poll() -> None:  # a reader on the last node, racing the transfers
        while not stop.is_set():
            lease = ray.get(relays[-1].acquire.remote(timeout=0.05), timeout=30)
            if lease is None:
                continue
            from laminar.relay.slots import MappedView

            with MappedView(lease.path, lease.nbytes) as v:
                seen.append((lease.version, np.array_equal(v.array, weights(lease.version))))
            ray.get(relays[-1].release.remote(lease.lease_id), timeout=30)

    t = threading.Thread(target=poll)
    t.start()
    try:
        for version in range(1, 5):
            pub.publish(version, weights(version), Layout(NBYTES))
            assert ray.get([r.wait_version.remote(version, 30) for r in relays], timeout=60) == [version] * 3
            for r in relays:
                check_pull(r, version)
    finally:
        stop.set()
        t.join(timeout=30)
        pub.close()
        kill_all(relays)
    assert seen and all(ok for _, ok in seen)


@pytest.mark.parametrize("how", ["ray.kill", "SIGKILL"])
def test_chain_rebuilt_without_a_dead_relay(nodes, how):
    relays = place_relays(nodes[:3], SETTINGS, prefix=f"rebuild-{how}")
    relays.append(relay_on_node(nodes[2], f"rebuild-{how}-tail", SETTINGS))
    build_chain(relays)
    pub = WeightPublisher(relays[0])
    try:
        pub.publish(1, weights(1), Layout(NBYTES))
        ray.get(relays[-1].wait_version.remote(1, 30), timeout=60)
        victim = relays[1]
        if how == "ray.kill":
            ray.kill(victim, no_restart=True)
        else:
            os.kill(ray.get(victim.ping.remote(), timeout=30)["pid"], signal.SIGKILL)
        pub.publish(2, weights(2), Layout(NBYTES))  # lost past the dead relay, or not
        chain = [r for r in relays if r is not victim]  # as the supervisor relinks: the survivors, in order
        build_chain(chain)
        assert len(chain) == 3 and victim not in chain
        for version in (3, 4):
            pub.publish(version, weights(version), Layout(NBYTES))
            ray.get([r.wait_version.remote(version, 30) for r in chain], timeout=60)
        check_pull(chain[-1], 4)
        assert ray.get(chain[-1].stats.remote(), timeout=30)["latest"] == 4
    finally:
        pub.close()
        kill_all(relays)


def test_bad_publish_inputs(nodes):
    relays = place_relays(nodes[:1], SETTINGS, prefix="bad")
    pub = WeightPublisher(relays[0])
    try:
        with pytest.raises(ValueError, match="layout describes 10 bytes but the flat buffer has 12"):
            pub.publish(1, np.zeros(12, np.uint8), Layout(10))
        with pytest.raises(ValueError, match="needs their layout"):
            pub.publish(1, np.zeros(12, np.uint8))
        with pytest.raises(TypeError, match="expected a flat numpy array"):
            pub.publish(1, [1, 2, 3], Layout(3))
        pub.publish(2, np.zeros(12, np.uint8), Layout(12))
        with pytest.raises(ValueError, match="must be greater than the last published 2"):
            pub.publish(2, np.zeros(12, np.uint8), Layout(12))

        def refuse() -> None:  # the trainer's finite check, judged while the slot was written
            raise ArithmeticError("NaN")

        with pytest.raises(ArithmeticError):
            pub.publish(3, np.ones(12, np.uint8), Layout(12), check=refuse)
        assert pub.last_version == 2  # not published: version 3 may still go out
        pub.publish(3, np.ones(12, np.uint8), Layout(12))
        with pytest.raises(LookupError, match="version 5 is not among them"):
            ray.get(relays[0].acquire.remote(version=5), timeout=30)
    finally:
        pub.close()
        kill_all(relays)


def test_state_dict_publish_round_trips_through_unflatten(nodes):
    """The trainer's path: a torch state_dict in, engine-format flat bytes out at another node's relay."""
    import torch

    from laminar.engine.layout import WeightLayout
    from laminar.engine.weights import unflatten

    relays = place_relays(nodes[1:3], SETTINGS, prefix="sd")
    build_chain(relays)
    pub = WeightPublisher(relays[0])
    g = torch.Generator().manual_seed(0)
    state = {
        "model.embed_tokens.weight": torch.randn(50, 16, generator=g),
        "model.norm.weight": torch.randn(16, generator=g).to(torch.bfloat16),
        "model.layers.0.mlp.up_proj.weight": torch.randn(32, 16, generator=g),
    }
    got: dict[str, torch.Tensor] = {}

    def load(buf: np.ndarray, layout, version: int) -> None:
        got.update({k: v.clone() for k, v in unflatten(buf, layout).items()})

    # the trainer's start: the slots made (and their pages touched) before the first publish, which uses them
    pub.prepare(WeightLayout.of(state).total_bytes)
    prepared = pub.slot_paths
    assert len(prepared) == 3
    try:
        for version in (1, 2):
            state = {k: v + 1 for k, v in state.items()}
            pub.publish(version, state)
            ray.get(relays[-1].wait_version.remote(version, 30), timeout=60)
            assert pull_latest(relays[-1], load, version - 1, timeout=30)[0] == version
            assert got.keys() == state.keys()
            for k, v in state.items():
                assert got[k].dtype == v.dtype and torch.equal(got[k], v), k
        assert pub.prepare_s is not None and pub.slot_paths == prepared
        with pytest.raises(KeyError, match="model.norm.weight"):
            pub.publish(3, {k: v for k, v in state.items() if k != "model.norm.weight"})
    finally:
        pub.close()
        kill_all(relays)


def test_publisher_survives_a_dead_master_and_moves_to_a_new_one(nodes):
    master, tail = relay_on_node(nodes[0], "m-old", SETTINGS), relay_on_node(nodes[1], "m-tail", SETTINGS)
    build_chain([master, tail])
    pub = WeightPublisher(master, num_slots=2, timeout=30)
    new = None
    try:
        pub.publish(1, weights(1), Layout(NBYTES))
        ray.get(tail.wait_version.remote(1, 30), timeout=60)
        ray.kill(master, no_restart=True)
        for version in (2, 3, 4):  # training goes on; the failed hand-offs free their slots
            pub.publish(version, weights(version), Layout(NBYTES))
        new = relay_on_node(nodes[0], "m-new", SETTINGS)
        build_chain([new, tail])
        pub.set_master(new)
        # the new master holds nothing: the last version, lost with the old one, goes out again (once)
        pub.publish(4, weights(4), Layout(NBYTES))
        ray.get(tail.wait_version.remote(4, 30), timeout=60)
        check_pull(tail, 4)
        with pytest.raises(ValueError, match="greater than the last published 4"):
            pub.publish(4, weights(4), Layout(NBYTES))
        pub.publish(5, weights(5), Layout(NBYTES))
        ray.get(tail.wait_version.remote(5, 30), timeout=60)
        check_pull(tail, 5)
        pub.poll()
        assert pub.errors, "the dead master's failures are recorded"
    finally:
        pub.close()
        kill_all([r for r in (master, tail, new) if r is not None])


def test_rapid_publishes_end_at_the_newest_and_never_go_back(nodes):
    """Publishing faster than the chain moves: versions may be skipped, never reordered or torn."""
    relays = place_relays(nodes[:3], SETTINGS, prefix="rapid")
    build_chain(relays)
    pub = WeightPublisher(relays[0])
    try:
        for version in range(1, 13):
            pub.publish(version, weights(version), Layout(NBYTES))
        assert ray.get([r.wait_version.remote(12, 60) for r in relays], timeout=90) == [12] * 3
        for r in relays:
            check_pull(r, 12)
            history = ray.get(r.stats.remote(), timeout=30)["versions"]
            by_arrival = sorted(history, key=lambda v: history[v]["t_complete"])
            assert by_arrival == sorted(history) and by_arrival[-1] == 12
    finally:
        pub.close()
        kill_all(relays)


def test_slot_reader_keeps_mappings_coherent_across_versions(nodes):
    """Kept (shared, read-only) mappings of the relay's few slots always show the version just leased."""
    from laminar.relay.pull import SlotReader

    relays = place_relays(nodes[:2], SETTINGS, prefix="reader")
    build_chain(relays)
    pub = WeightPublisher(relays[0])
    reader = SlotReader(relays[-1], pin=None)
    out = np.empty(NBYTES, dtype=np.uint8)

    def load(buf: np.ndarray, layout, version: int) -> None:
        np.copyto(out, buf)

    try:
        current = None
        for version in range(1, 8):  # more versions than slots: every slot file is reused
            pub.publish(version, weights(version), Layout(NBYTES))
            ray.get(relays[-1].wait_version.remote(version, 30), timeout=60)
            got = reader.pull(load, current)
            assert got is not None and got[0] == version
            assert np.array_equal(out, weights(version)), version
            current = version
        assert reader.pull(load, current) is None
        assert len(reader._maps) <= 3
    finally:
        reader.close()
        pub.close()
        kill_all(relays)
