"""How busy the machine's cores were during each test: a pytest plugin that reads /proc/stat before and after every
test and writes, at the session's end, each test's wall time, busy core-seconds and idle core-seconds (the
heaviest first) with the session's totals. The totals bound what running tests side by side could save: the
session cannot end sooner than its busy core-seconds over the cores.

    PYTHONPATH=experiments SUITE_IDLE_OUT=idle.txt .venv/bin/python -m pytest -p suite_idle

The numbers behind the README's paragraph on the suite's time. /proc/stat counts the whole machine: anything else
running during the session counts as the suite's."""

from __future__ import annotations

import os
import time

import pytest

_rows: list[tuple[float, float, float, str]] = []


def _busy_idle() -> tuple[int, int]:
    """The machine's busy and idle clock ticks since boot (iowait counts as idle)."""
    with open("/proc/stat") as f:
        ticks = [int(v) for v in f.readline().split()[1:9]]
    idle = ticks[3] + ticks[4]
    return sum(ticks) - idle, idle


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item: pytest.Item, nextitem: pytest.Item | None):
    (busy0, idle0), t0 = _busy_idle(), time.monotonic()
    yield
    (busy1, idle1), t1 = _busy_idle(), time.monotonic()
    hz = os.sysconf("SC_CLK_TCK")
    _rows.append((t1 - t0, (busy1 - busy0) / hz, (idle1 - idle0) / hz, item.nodeid))


def pytest_sessionfinish(session: pytest.Session) -> None:
    wall, busy, idle = (sum(r[i] for r in _rows) for i in range(3))
    lines = [f"tests: {len(_rows)}, wall {wall:.1f} s, busy {busy:.1f} core-s, idle {idle:.1f} core-s"]
    lines += [
        f"{w:7.1f} s  busy {b:6.1f}  idle {i:6.1f}  {name}" for w, b, i, name in sorted(_rows, reverse=True)
    ]
    with open(os.environ.get("SUITE_IDLE_OUT", "suite-idle.txt"), "w") as f:
        f.write("\n".join(lines) + "\n")
