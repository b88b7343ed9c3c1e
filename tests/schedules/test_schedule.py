"""The schedule value built from the config, and the one loop that runs it (no Ray: a runtime stand-in)."""

from __future__ import annotations

from typing import Any

import pytest

from laminar.configure import load_config
from laminar.schedules import NAMES, Schedule
from laminar.schedules.dispatch import Dispatch

SMALL = ["rollout.replicas=3", "rollout.groups_per_batch=2", "trainer.groups_per_step=8"]
SMALL += ["buffer.capacity_groups=24", "schedule.staleness=2"]


def build(name: str, *extra: str) -> Schedule:
    return Schedule.from_config(load_config(None, [*SMALL, f"schedule.name={name}", *extra]))


def test_every_configurable_name_builds():
    assert [build(name).name for name in NAMES] == list(NAMES)


def test_baselines_take_batches_in_dispatch_order_and_push_every_version():
    ahead = {"sync": 0, "one_step": 1, "stream": 2, "partial": 2}
    for name, k in ahead.items():
        s = build(name, "repack.enabled=true")
        assert (s.in_order, s.push, s.repack) == (True, True, False), name
        assert s.dispatch.ahead == k and s.dispatch.groups_per_step == 8
        assert s.interrupt == (name == "partial")
    assert build("sync").dispatch.groups_per_batch == 3  # each batch spread over the 3 replicas
    assert build("stream").dispatch.groups_per_batch == 2  # rollout.groups_per_batch


def test_laminar_is_flow_control_and_its_ablations_are_config():
    s = build("laminar")
    # no `ahead`: new work only on the trainer's version (`schedule.max_lag` 0), up to 24 outstanding, none
    # trained more than 4 versions late (`schedule.max_staleness`)
    assert s.dispatch == Dispatch(2, 24, 8, max_lag=0, max_staleness=4)
    free = build("laminar", "schedule.max_lag=-1", "schedule.max_staleness=-1")
    assert free.dispatch == Dispatch(2, 24, 8)  # any version may work, any group run any time
    assert (s.in_order, s.push, s.interrupt, s.repack) == (False, False, False, True)
    assert build("laminar", "repack.enabled=false").repack is False
    assert build("laminar", "schedule.global_push=true").push is True


class FakeRuntime:
    """What `Schedule.run` uses of `Runtime`: the trainer's version, `take` and `train`."""

    def __init__(self, cfg: Any) -> None:
        self.cfg, self.version, self.calls = cfg, 0, []

    def take(self, count: int, group_ids: range | None = None) -> list[str]:
        self.calls.append(("take", count, None if group_ids is None else list(group_ids)))
        return [f"group-{i}" for i in range(count)]

    def train(self, groups: list[str], push: bool = False) -> dict[str, Any]:
        self.calls.append(("train", len(groups), push))
        self.version += 1
        return {"version": self.version}


@pytest.mark.parametrize(
    ("name", "extra", "ids", "push"),
    [
        ("sync", [], True, True),
        ("stream", [], True, True),
        ("laminar", [], False, False),
        ("laminar", ["schedule.global_push=true"], False, True),
    ],
)
def test_the_loop_takes_what_the_schedule_says(name, extra, ids, push):
    cfg = load_config(None, [*SMALL, f"schedule.name={name}", "trainer.groups_per_step=2", *extra])
    rt, versions = FakeRuntime(cfg), []
    Schedule.from_config(cfg).run(rt, 3, lambda m: versions.append(m["version"]))
    assert versions == [1, 2, 3]
    takes = [c for c in rt.calls if c[0] == "take"]
    expected = (
        [[0, 1], [2, 3], [4, 5]] if ids else [None] * 3
    )  # batch v by group ids, or what the buffer picks
    assert takes == [("take", 2, e) for e in expected]
    assert [c for c in rt.calls if c[0] == "train"] == [("train", 2, push)] * 3
