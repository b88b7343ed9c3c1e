"""`laminar bench relay`: weight propagation along the relay chain on a local multi-node Ray cluster.

Measures, for one version of --mb megabytes: the time from publish to complete-and-verified at each relay of the
chain (pipelined, and with one chunk per version as the store-and-forward reference), the trainer's stall per
publish with 1, 2 and --relays relays, and a rollout's pull into a numpy and a torch buffer. Writes
DIR/relay.json and DIR/relay.png.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import time
from pathlib import Path
from typing import Any

import numpy as np


def _start_cluster(num_workers: int) -> Any:
    import ray
    from ray.cluster_utils import Cluster

    node = {"num_cpus": 1, "object_store_memory": 100 << 20, "node_ip_address": "127.0.0.1"}
    cluster = Cluster(initialize_head=True, head_node_args={**node, "include_dashboard": False})
    for _ in range(num_workers):
        cluster.add_node(**node)
    ray.init(address=cluster.address, log_to_driver=False)
    cluster.wait_for_nodes()
    return cluster


def _run_chain(
    head: str,
    workers: list[str],
    nbytes: int,
    chunk_bytes: int,
    versions: int,
    warmup: int,
    tls: bool = False,
    local_shm: bool = True,
) -> dict[str, Any]:
    """Publish `versions` versions through master -> workers; per version, wait for the last relay."""
    import ray

    from laminar.engine.layout import WeightLayout
    from laminar.relay.chain import build_chain, relay_on_node
    from laminar.relay.publisher import WeightPublisher
    from laminar.relay.relay import RelaySettings

    settings = RelaySettings.for_run(chunk_bytes=chunk_bytes, tls=tls)
    relays = [relay_on_node(head, "bench-master", settings, local_shm=local_shm)]
    relays += [relay_on_node(n, f"bench-{i}", settings, local_shm=local_shm) for i, n in enumerate(workers)]
    build_chain(relays)
    pub = WeightPublisher(relays[0])
    w = np.random.default_rng(0).integers(0, 256, size=nbytes, dtype=np.uint8)
    stalls, reach, receive = [], [], []
    try:
        for v in range(1, versions + 1):
            w[:8] = v  # a different version each time, at no cost
            stall = pub.publish(v, w, WeightLayout.raw(nbytes))
            ray.get([r.wait_version.remote(v, 300) for r in relays], timeout=600)
            stats = ray.get([r.stats.remote() for r in relays], timeout=60)
            t0 = pub.publish_times[v]
            if v > warmup:
                stalls.append(stall)
                reach.append([s["versions"][v]["t_complete"] - t0 for s in stats])
                receive.append([s["versions"][v]["t_complete"] - s["versions"][v]["t_begin"] for s in stats])
        pulls = _pull_times(relays[-1], nbytes) if workers else {}
    finally:
        pub.close()
        for r in relays:
            ray.get(r.shutdown.remote(), timeout=30)
            ray.kill(r)
    per_relay = [statistics.median(col) for col in zip(*reach)]
    # Each relay's own rate: bytes over the time from its BEGIN to complete and verified (for the master, the
    # copy and checksum out of the trainer's slot; for the others, one hop of the chain).
    per_hop = [nbytes / statistics.median(col) / 1e9 for col in zip(*receive)]
    return {
        "relays_after_master": len(workers),
        "chunk_bytes": chunk_bytes,
        "stall_s": stalls,
        "stall_median_s": statistics.median(stalls),
        "stall_min_s": min(stalls),
        "reach_s_by_version": reach,
        "reach_median_s": per_relay,  # index 0 is the master relay
        "receive_gb_per_s": per_hop,
        "pulls": pulls,
    }


def _pull_times(relay: Any, nbytes: int, repeats: int = 5) -> dict[str, float]:
    """A rollout's pull between batches: map the slot and copy into its own buffer (numpy, then torch), per
    pull (`pull_latest`) and through mappings kept across pulls (`SlotReader`)."""
    import torch

    from laminar.relay.pull import SlotReader, pull_latest

    np_dst = np.empty(nbytes, dtype=np.uint8)
    np_dst.fill(0)
    th_dst = torch.zeros(nbytes, dtype=torch.uint8)

    def into_numpy(buf: np.ndarray, layout: Any, version: int) -> None:
        np.copyto(np_dst, buf)

    def into_torch(buf: np.ndarray, layout: Any, version: int) -> None:
        th_dst.copy_(torch.from_numpy(buf))

    out: dict[str, float] = {}
    if torch.cuda.is_available():  # the engine's pull: registered slot mappings, copied to the GPU
        gpu = torch.empty(nbytes, dtype=torch.uint8, device="cuda")

        def into_cuda(buf: np.ndarray, layout: Any, version: int) -> None:
            gpu.copy_(torch.from_numpy(buf), non_blocking=True)
            torch.cuda.synchronize()

        pinned = SlotReader(relay, pin=None)
        try:
            out["cuda_kept_map_s"] = statistics.median(
                pinned.pull(into_cuda, None)[1] for _ in range(repeats)
            )
        finally:
            pinned.close()
    reader = SlotReader(relay, pin=False)
    try:
        for how, pull in (
            ("map_per_pull", lambda fn: pull_latest(relay, fn, None)),
            ("kept_map", reader.pull),
        ):
            for name, fn in (("numpy", into_numpy), ("torch", into_torch)):
                runs = []
                for _ in range(repeats):
                    got = pull(fn) if how == "map_per_pull" else pull(fn, None)
                    assert got is not None
                    runs.append(got[1])
                out[f"{name}_{how}_s"] = statistics.median(runs)
    finally:
        reader.close()
    return out


def _security_costs(nbytes: int, chunk_bytes: int, repeats: int = 50) -> dict[str, float]:
    """What authentication adds: one handshake on loopback, one version's digest, and the chunk checksum's
    rate (CRC32C now; zlib's CRC32, the earlier check, beside it)."""
    import secrets
    import socket
    import zlib

    from laminar.relay import wire
    from laminar.relay.relay import Relay
    from laminar.relay.slots import num_chunks

    secret = secrets.token_bytes(32)
    relay = Relay("bench-handshake", secret=secret, host="127.0.0.1")
    relay.set_upstream("bench-peer")
    times = []
    try:
        for _ in range(repeats):
            t = time.perf_counter()
            with socket.create_connection(relay.address(), timeout=10) as sock:
                wire.offer_handshake(sock, secret, "bench-peer")
            times.append(time.perf_counter() - t)
    finally:
        relay.shutdown()
    crcs = list(range(num_chunks(nbytes, chunk_bytes)))
    blob = wire.encode_layout({"nbytes": nbytes})
    t = time.perf_counter()
    for _ in range(repeats):
        wire.version_digest(secret, 1, nbytes, chunk_bytes, blob, crcs)
    digest_s = (time.perf_counter() - t) / repeats
    data = np.random.default_rng(0).integers(0, 256, size=min(nbytes, 256 << 20), dtype=np.uint8)
    rates = {}
    for name, fn in (("crc32c", wire.checksum), ("zlib_crc32", zlib.crc32)):
        t = time.perf_counter()
        fn(data)
        rates[name] = data.nbytes / (time.perf_counter() - t) / 1e9
    return {
        "handshake_median_s": statistics.median(times),
        "version_digest_s": digest_s,
        "checksum_gb_per_s_one_thread": rates["crc32c"],
        "zlib_crc32_gb_per_s_one_thread": rates["zlib_crc32"],
    }


def _tcp_link_gbps(nbytes: int) -> float:
    """The link itself: one TCP stream on loopback, sendfile from shared memory into recv_into (no relay)."""
    import socket
    import threading

    from laminar.relay import wire
    from laminar.relay.slots import ShmBuffer, new_buffer_path

    src = ShmBuffer(new_buffer_path("bench-tcp", 0), nbytes)
    src.array[:] = 1
    dst = np.empty(nbytes, dtype=np.uint8)
    server = socket.create_server(("127.0.0.1", 0))
    took: list[float] = []

    def receive() -> None:
        conn, _ = server.accept()
        with conn:
            wire.recv_into_exact(conn, memoryview(dst))
            conn.sendall(b"k")

    try:
        for _ in range(3):
            t = threading.Thread(target=receive)
            t.start()
            with socket.create_connection(server.getsockname()[:2]) as sock:
                t0 = time.perf_counter()
                sock.sendfile(_FileNo(src.fd), 0, nbytes)  # type: ignore[arg-type]
                wire.recv_exact(sock, 1)
                took.append(time.perf_counter() - t0)
            t.join()
    finally:
        server.close()
        src.close()
    return nbytes / statistics.median(took) / 1e9


class _FileNo:
    def __init__(self, fd: int):
        self._fd = fd

    def fileno(self) -> int:
        return self._fd


def _plot(result: dict[str, Any], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 3, figsize=(15, 4.2))
    full, sf = result["pipelined"], result.get("store_and_forward")
    pos = list(range(len(full["reach_median_s"])))
    labels = ["master", *[f"relay {i}" for i in pos[1:]]]
    axes[0].plot(
        pos, full["reach_median_s"], "o-", label=f"pipelined ({full['chunk_bytes'] >> 20} MiB chunks)"
    )
    if sf:
        axes[0].plot(pos, sf["reach_median_s"], "s--", label="store and forward (1 chunk)")
    axes[0].set_xticks(pos, labels)
    axes[0].set_ylabel("publish -> complete and verified (s)")
    axes[0].set_title(f"{result['mb']} MB version along the chain")
    axes[0].legend()
    ns = sorted(result["stall_by_relays"], key=int)
    axes[1].bar([str(n) for n in ns], [result["stall_by_relays"][n] * 1e3 for n in ns])
    axes[1].set_xlabel("relays after the master")
    axes[1].set_ylabel("trainer stall per publish (ms, median)")
    axes[1].set_title("publish stall")
    pulls = full["pulls"]
    axes[2].bar(
        [k.removesuffix("_s").replace("_", "\n", 1) for k in pulls], [v * 1e3 for v in pulls.values()]
    )
    axes[2].set_ylabel("pull time (ms, median)")
    axes[2].set_title("rollout pull from its node's relay")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def main(argv: list[str]) -> int:
    p = argparse.ArgumentParser(prog="laminar bench relay", description=__doc__)
    p.add_argument("--mb", type=int, default=200, help="version size in MB (default 200)")
    p.add_argument("--relays", type=int, default=4, help="relays after the master, one per node (default 4)")
    p.add_argument("--chunk-mb", type=float, default=4.0, help="chunk size along the chain (default 4)")
    p.add_argument("--versions", type=int, default=5, help="measured versions per configuration (default 5)")
    p.add_argument("--warmup", type=int, default=3, help="versions first published unmeasured (default 3)")
    p.add_argument("--no-store-and-forward", action="store_true", help="skip the one-chunk reference chain")
    p.add_argument("--tls", action="store_true", help="also measure the pipelined chain over TLS (relay.tls)")
    p.add_argument("--out", default="runs/relay", help="output folder (default runs/relay)")
    args = p.parse_args(argv)
    if args.relays < 1 or args.mb < 1:
        p.error(f"--relays ({args.relays}) and --mb ({args.mb}) must be at least 1")

    # Before Ray is imported: its constants read these once. Loopback keeps the bootstrap address on 127.0.0.1.
    os.environ.setdefault("RAY_AUTH_MODE", "disabled")
    os.environ.setdefault("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER", "0")
    import ray

    nbytes = args.mb * 1_000_000
    chunk = int(args.chunk_mb * (1 << 20))
    total = args.versions + args.warmup
    cluster = _start_cluster(args.relays)
    try:
        head = ray.get_runtime_context().get_node_id()
        workers = [n["NodeID"] for n in ray.nodes() if n["Alive"] and n["NodeID"] != head][: args.relays]
        result: dict[str, Any] = {
            "mb": args.mb,
            "relays": args.relays,
            "machine": {
                "cpus": os.cpu_count(),
                "platform": platform.platform(),
                "python": platform.python_version(),
                "loadavg_at_start": os.getloadavg(),
            },
            "definitions": {
                "reach_median_s": "publish call -> version complete, checksummed and its digest verified at each "
                "relay; [0] is the master",
                "receive_gb_per_s": "bytes / (complete - BEGIN) at each relay: the master's copy, then each hop",
                "tcp_link_gb_per_s": "one plain TCP stream on the same loopback, sendfile -> recv_into",
                "stall": "WeightPublisher.publish wall time (copy into the trainer's shm slot + async notify)",
            },
            "transport": "Ray nodes of one machine (ray.cluster_utils.Cluster): 'pipelined' copies between relays "
            "through shared memory, as relays of one machine do; 'pipelined_tcp' sends every chunk over loopback "
            "TCP, as relays of different machines do",
        }
        t = time.time()
        result["pipelined"] = _run_chain(head, workers, nbytes, chunk, total, args.warmup)
        print(
            f"pipelined chain of {args.relays}: reach (s) {np.round(result['pipelined']['reach_median_s'], 3)}"
        )
        if not args.no_store_and_forward:
            result["store_and_forward"] = _run_chain(head, workers, nbytes, nbytes, total, args.warmup)
            print(
                f"store-and-forward: reach (s) {np.round(result['store_and_forward']['reach_median_s'], 3)}"
            )
        # The same chain with every hop over TCP, as between machines (one relay per machine): the hop rate
        # against the plain TCP stream's.
        result["pipelined_tcp"] = _run_chain(
            head, workers, nbytes, chunk, total, args.warmup, local_shm=False
        )
        print(f"pipelined over TCP: reach (s) {np.round(result['pipelined_tcp']['reach_median_s'], 3)}")
        if args.tls:
            result["pipelined_tls"] = _run_chain(head, workers, nbytes, chunk, total, args.warmup, tls=True)
            print(f"pipelined over TLS: reach (s) {np.round(result['pipelined_tls']['reach_median_s'], 3)}")
        stall = {args.relays: result["pipelined"]["stall_median_s"]}
        stall_min = {args.relays: result["pipelined"]["stall_min_s"]}
        for n in sorted({0, 1, 2} - {args.relays}):
            if n < args.relays:
                run = _run_chain(head, workers[:n], nbytes, chunk, total, args.warmup)
                stall[n], stall_min[n] = run["stall_median_s"], run["stall_min_s"]
        result["stall_by_relays"] = {str(k): v for k, v in sorted(stall.items())}
        result["stall_min_by_relays"] = {str(k): v for k, v in sorted(stall_min.items())}
        reach = result["pipelined"]["reach_median_s"]
        result["last_over_first_relay"] = reach[-1] / reach[1]
        result["last_over_master"] = reach[-1] / reach[0]
        hops = result["pipelined_tcp"]["receive_gb_per_s"][1:]
        result["tcp_link_gb_per_s"] = _tcp_link_gbps(nbytes)
        result["hop_over_link"] = [h / result["tcp_link_gb_per_s"] for h in hops]
        result["security"] = _security_costs(nbytes, chunk)
        result["bench_wall_s"] = time.time() - t
    finally:
        ray.shutdown()
        cluster.shutdown()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "relay.json").write_text(json.dumps(result, indent=2))
    _plot(result, out / "relay.png")
    print(
        f"reach (s) {np.round(result['pipelined']['reach_median_s'], 3)}; receive GB/s "
        f"{np.round(result['pipelined']['receive_gb_per_s'], 2)} (one TCP stream: {result['tcp_link_gb_per_s']:.2f}); "
        f"security {result['security']}\n"
        f"last/first relay {result['last_over_first_relay']:.2f}x, last/master {result['last_over_master']:.2f}x; "
        f"stall by relays (ms) { {k: round(v * 1e3, 1) for k, v in result['stall_by_relays'].items()} }; "
        f"pull {result['pipelined']['pulls']}; wrote {out / 'relay.json'} and {out / 'relay.png'}"
    )
    return 0
