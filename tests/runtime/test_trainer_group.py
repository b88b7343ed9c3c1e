"""The trainer group's background load: `wait_loaded` returns once every rank has its policy, and a load that
outlasts its timeout takes the group down with a message that says what to change."""

from __future__ import annotations

import pytest
import ray

from laminar.runtime.trainer_group import TrainerGroup


@ray.remote(num_cpus=0)
class Rank:
    def load(self, seconds: float) -> None:
        import time

        time.sleep(seconds)  # stands in for a policy that takes this long to load

    def ping(self) -> str:
        return "ok"


def test_a_load_that_outlasts_its_timeout_names_the_fix(ray_cluster):
    quick, slow = Rank.remote(), Rank.remote()
    group = TrainerGroup([quick], loading=[quick.load.remote(0.0)])
    group.wait_loaded(timeout=30)
    assert group.loading == [] and ray.get(quick.ping.remote(), timeout=30) == "ok"
    group = TrainerGroup([slow], loading=[slow.load.remote(60.0)])
    with pytest.raises(RuntimeError, match=r"did not load its policy within 1s .*run.timeout_s"):
        group.wait_loaded(timeout=1)
    with pytest.raises(ray.exceptions.RayActorError):  # the group was taken down
        ray.get(slow.ping.remote(), timeout=30)
    ray.kill(quick)
