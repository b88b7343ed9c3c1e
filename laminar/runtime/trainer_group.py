"""The trainer tier as one handle: `trainer.num_workers` rank actors, started, called and replaced together.

One rank is a single trainer actor. Several are an FSDP2 group: placed with a Ray placement group packed
on one machine (their publish writes into one shared-memory slot beside the master relay), or spread one rank a
machine (the ranks away from rank 0 send their rows to the master relay, which assembles them), joined in a
`torch.distributed` process group (NCCL on GPU, gloo on CPU). Every call goes to all ranks at once and returns
rank 0's answer; if any rank dies, the others are killed too (they would wait in a collective forever) and the
caller restarts the whole group from the last checkpoint, as it does a dead single trainer.
"""

from __future__ import annotations

import time
from typing import Any

import ray
from ray.util.placement_group import placement_group, remove_placement_group
from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

from laminar.config import Config
from laminar.runtime.actors import TrainerActor

DIED = (ray.exceptions.RayActorError, ray.exceptions.ActorUnavailableError)


class TrainerGroup:
    def __init__(self, ranks: list[Any], pg: Any = None, loading: list[Any] | None = None) -> None:
        self.ranks, self.pg = ranks, pg
        self.loading = loading or []  # the ranks' policy builds still running (`wait_loaded`)

    @classmethod
    def start(
        cls,
        args: dict[str, Any],
        slots: int,
        world: int,
        resources: dict[str, Any],
        timeout_s: float,
        here: dict[str, Any],
        spread: bool = False,
    ) -> TrainerGroup:
        """`args`: the trainer's constructor arguments (`trainer_args`); `resources` per rank (num_cpus,
        num_gpus); `here`: where a single rank prefers to run; `spread`: one rank a machine (else all on one).
        The ranks build their policy in the background: every rank answers `node_id` at once (`attach_master`
        once the rank's imports are done), and `wait_loaded` waits for the policy before anything else."""
        if world == 1:
            rank = TrainerActor.options(**resources, **here).remote(args, slots)
            return cls([rank], loading=[rank.load.remote()])
        bundle = {"CPU": resources["num_cpus"]} | (
            {"GPU": resources["num_gpus"]} if resources["num_gpus"] else {}
        )
        pg = placement_group([bundle] * world, strategy="STRICT_SPREAD" if spread else "STRICT_PACK")
        try:
            ray.get(pg.ready(), timeout=timeout_s)
        except ray.exceptions.GetTimeoutError as e:
            remove_placement_group(pg)
            where = (
                f"{world} machines with {bundle} free each (trainer.placement=spread: one rank a machine)"
                if spread
                else f"a machine with {world} x {bundle} free (the ranks share one machine)"
            )
            raise RuntimeError(
                f"trainer.num_workers={world}: found no {where} within {timeout_s:.0f}s; lower "
                "trainer.num_workers, change trainer.placement or free resources"
            ) from e
        ranks = [
            TrainerActor.options(
                **resources,
                scheduling_strategy=PlacementGroupSchedulingStrategy(pg, placement_group_bundle_index=i),
            ).remote(args, slots, rank=i, world=world)
            for i in range(world)
        ]
        group = cls(ranks, pg)
        try:
            host, port = ray.get(ranks[0].address.remote(), timeout=timeout_s)
        except BaseException:
            group.kill()
            raise
        group.loading = [r.join.remote(host, port) for r in ranks]
        return group

    def wait_loaded(self, timeout: float) -> None:
        """Until every rank has built its policy (a single rank's `load`, or every rank's `join`). A rank that
        fails to build it takes the group down and its error goes on."""
        if not self.loading:
            return
        try:
            ray.get(self.loading, timeout=timeout)
        except ray.exceptions.GetTimeoutError as e:
            self.kill()
            raise RuntimeError(
                f"the trainer did not load its policy within {timeout:.0f}s ({self.world} rank(s)); a larger "
                "run.timeout_s gives it longer (a model from a slow disk), or the trainer's log says why"
            ) from e
        except BaseException:
            self.kill()
            raise
        self.loading = []

    @property
    def world(self) -> int:
        return len(self.ranks)

    def call(self, method: str, *args: Any, timeout: float) -> Any:
        """`method` on every rank at once; rank 0's result. A dead rank takes the group down (raises)."""
        refs = [getattr(r, method).remote(*args) for r in self.ranks]
        deadline = time.monotonic() + timeout
        pending = list(refs)
        try:
            while pending:  # any rank's death ends the wait at once: the others may be stuck in a collective
                ready, pending = ray.wait(
                    pending, num_returns=1, timeout=max(0.0, deadline - time.monotonic())
                )
                if not ready:
                    raise ray.exceptions.GetTimeoutError(
                        f"trainer.{method}: {len(pending)} of {self.world} ranks did not answer in {timeout:.0f}s"
                    )
                ray.get(ready)
        except DIED:
            if self.world > 1:
                self.kill()
            raise
        return ray.get(refs[0])

    def call_rank0(self, method: str, *args: Any, timeout: float) -> Any:
        """A question only rank 0 answers (its node, its pid)."""
        return ray.get(getattr(self.ranks[0], method).remote(*args), timeout=timeout)

    def pids(self, timeout: float = 30.0) -> list[int]:
        return ray.get([r.pid.remote() for r in self.ranks], timeout=timeout)

    def close(self, timeout: float = 10.0) -> None:
        """Unlink the publish slots (best effort: a dead rank's are swept at the next start on its node)."""
        for r in self.ranks:
            try:
                ray.get(r.close.remote(), timeout=timeout)
            except ray.exceptions.RayError:
                pass

    def kill(self) -> None:
        for r in self.ranks:
            ray.kill(r)
        if self.pg is not None:
            remove_placement_group(self.pg)
            self.pg = None


def trainer_args(cfg: Config, model_path: str, cuda: bool) -> dict[str, Any]:
    """The trainer's constructor arguments for this run (`laminar.trainer.trainer.Trainer`): the `trainer` and
    `rollout` sections as they are, and what the run decided elsewhere (where it runs, its seed, the weights'
    dtype on the wire: bf16 for a GPU or bf16 engine)."""
    return {
        "cfg": cfg.trainer,
        "model_path": model_path,
        "rollout": cfg.rollout,
        "device": "cuda" if cuda else "cpu",
        "seed": cfg.run.seed,
        "publish_dtype": "bfloat16" if cuda or cfg.model.dtype == "bfloat16" else "",
    }
