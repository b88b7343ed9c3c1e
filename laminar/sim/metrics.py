"""Turn a finished simulation into the report (design section 9 names), over the window after warm-up."""

from __future__ import annotations

from typing import Any

from laminar.data import staleness
from laminar.sim.cluster import Cluster
from laminar.sim.replica import Busy

ACTIVITIES = (
    "decode",
    "prefill",
    "reprefill",
    "weights",
    "repack",
    "tool_wait",
)  # tool_wait: only parked requests


def summarise(c: Cluster, wall_s: float | None = None) -> dict[str, Any]:
    cfg, rec = c.cfg, c.record
    start = rec.window_start
    t0, t1 = start["time"], rec.step_end[-1]
    window = max(t1 - t0, 1e-9)
    replicas = len(c.replicas)
    delta = Busy()
    for r, before in zip(c.replicas, start["busy"]):
        for name in Busy.__slots__:
            setattr(delta, name, getattr(delta, name) + getattr(r.busy, name) - getattr(before, name))
    rollout_s = window * replicas
    breakdown = {name: getattr(delta, name) / rollout_s for name in ACTIVITIES}
    breakdown["idle"] = max(0.0, 1.0 - sum(breakdown.values()))
    trainer_before = start["trainer"]
    trainer = {
        name: (getattr(c.trainer_time, name) - getattr(trainer_before, name)) / window
        for name in ("train", "weights", "restart")
    }
    trainer["waiting"] = max(0.0, 1.0 - sum(trainer.values()))
    tokens = sum(rec.step_tokens[cfg.warmup_steps :])
    repacks, moved, released, split = (
        a - b for a, b in zip((rec.repacks, rec.moved, rec.released, rec.split_groups), start["repacks"])
    )
    return {
        "schedule": cfg.schedule.name,
        "model": cfg.model,
        "gpus": cfg.gpus,
        "trainer_gpus": c.trainer_gpus,
        "rollout_replicas": replicas,
        "rollout_tp": c.spec.rollout_tp,
        "steps": cfg.steps,
        "warmup_steps": cfg.warmup_steps,
        "simulated_s": t1,
        "step_time_s": window / (cfg.steps - cfg.warmup_steps),
        "training_throughput": tokens / window,
        "training_throughput_per_gpu": tokens / window / cfg.gpus,
        "generation_throughput": delta.tokens / window,
        "gpu_utilisation": delta.decode / rollout_s,
        "mean_running_batch": delta.batch_seconds / max(delta.decode, 1e-9),
        "rollout_time": breakdown,
        "trainer_time": trainer,
        "staleness": staleness.summarise(rec.staleness),
        "reprefill_tokens": rec.reprefill_tokens - start["reprefill"],
        "max_versions_per_trajectory": rec.max_versions_per_traj,
        "preemptions": delta.preemptions,
        "repacks": {
            "count": repacks,
            "moved": moved,
            "released": released,
            "split_groups": split / repacks if repacks else 0.0,  # a repack's, on average
            "overhead_s": repacks * c.cost.repack_overhead_s,
        },
        "weight_updates": rec.weight_updates,
        "failures": {"recovered_trajectories": rec.recovered, "restarted_trajectories": rec.restarted},
        "trajectories": {"finished": rec.finished, "consumed": rec.consumed},
        **({"wall_s": wall_s} if wall_s is not None else {}),
    }
