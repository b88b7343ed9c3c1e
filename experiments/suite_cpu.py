"""Where the test suite's CPU goes, by process: a pytest plugin that samples every process's CPU time four times a
second while the session runs and writes, at its end, the CPU-seconds of each kind of process (a Ray actor by its
class, Ray's own daemons, reward workers, pytest itself) and the native libraries each kind loaded.

    PYTHONPATH=experiments SUITE_CPU_OUT=cpu.txt .venv/bin/python -m pytest -p suite_cpu tests/schedules/

The numbers behind the README's paragraph on the suite's time (a run of the real runtime: about 24 CPU-s, 17 of
them imports). Processes that lived before the session (kernel threads, the sandbox) count all their CPU since
they started: read the Ray and pytest rows.
"""

from __future__ import annotations

import collections
import os
import threading
import time

import psutil

LIBS = ("libtorch_cpu", "tokenizers", "pyarrow", "jinja2")
_seen: dict[tuple[int, float], tuple[float, str]] = {}
_libs: dict[str, set[str]] = collections.defaultdict(set)
_stop = threading.Event()


def _kind(p: psutil.Process) -> str:
    try:
        cmd = p.cmdline()
    except (psutil.Error, OSError):
        return "?"
    if not cmd:
        return "kernel:" + p.name()
    text = " ".join(cmd)
    if text.startswith("ray::"):
        return text.split()[0].split(".")[0]  # ray::ReplicaActor.stop -> ray::ReplicaActor
    for key in (
        "default_worker",
        "gcs_server",
        "dashboard",
        "log_monitor",
        "runtime_env",
        "raylet",
        "pytest",
    ):
        if key in text:
            return key
    return os.path.basename(cmd[0])[:40]


def _poll() -> None:
    while not _stop.is_set():
        for p in psutil.process_iter():
            try:
                t = p.cpu_times()
                key = (p.pid, p.create_time())
                kind = _kind(p)
                old = _seen.get(key)
                if old and (kind == "?" or (old[1].startswith("ray::") and not kind.startswith("ray::"))):
                    kind = old[1]  # a worker keeps the name of the actor it became
                _seen[key] = (t.user + t.system, kind)
                if kind.startswith("ray::"):
                    with open(f"/proc/{p.pid}/maps") as f:
                        maps = f.read()
                    _libs[kind].update(lib for lib in LIBS if lib in maps)
            except (psutil.Error, OSError):
                pass
        time.sleep(0.25)


def pytest_sessionstart(session) -> None:
    threading.Thread(target=_poll, daemon=True).start()


def pytest_sessionfinish(session) -> None:
    _stop.set()
    total: dict[str, list[float]] = collections.defaultdict(lambda: [0.0, 0])
    for cpu, kind in _seen.values():
        total[kind][0] += cpu
        total[kind][1] += 1
    lines = ["cpu_s  processes  kind  (native libraries loaded)"]
    for kind, (cpu, n) in sorted(total.items(), key=lambda kv: -kv[1][0])[:40]:
        libs = f"  ({', '.join(sorted(_libs[kind]))})" if _libs.get(kind) else ""
        lines.append(f"{cpu:7.1f}  {n:4d}  {kind}{libs}")
    with open(os.environ.get("SUITE_CPU_OUT", "suite-cpu.txt"), "w") as f:
        f.write("\n".join(lines) + "\n")
