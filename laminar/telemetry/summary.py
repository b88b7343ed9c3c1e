"""`summary.json`: the measures of design section 9 under the names the reports use."""

from __future__ import annotations

from collections import Counter
from typing import Any

import numpy as np

from laminar.data.staleness import summarise

# the replicas' speculation counters (`EngineStats`, in each replica snapshot), summed over the replicas
SPECULATION_COUNTERS = (
    "decode_steps",
    "verify_steps",
    "draft_rows",
    "draft_tokens",
    "accepted_tokens",
    "verify_tokens",
    "draft_s",
)


def speculation_rates(counters: dict[str, Any]) -> dict[str, Any] | None:
    """Speculation counters with the share of draft tokens accepted, the tokens a verified request gained a
    step and the share of decode steps that verified; None where nothing was drafted."""
    if not counters["draft_tokens"]:
        return None
    return {
        **counters,
        "draft_s": round(counters["draft_s"], 4),
        "acceptance": round(counters["accepted_tokens"] / counters["draft_tokens"], 4),
        "tokens_per_verify": round(counters["verify_tokens"] / max(counters["draft_rows"], 1), 4),
        "verify_share": round(counters["verify_steps"] / max(counters["decode_steps"], 1), 4),
    }


def gate_summary(snapshots: list[dict[str, Any]]) -> dict[str, Any]:
    """`rollout.speculation=auto`'s gate over the replicas' last snapshots: decode steps by its decision,
    summed, and its measured ms an emitted token of each path by batch range, averaged over the replicas that
    measured it. Empty where no replica has a gate."""
    steps: Counter = Counter()
    measured: dict[str, dict[str, list[float]]] = {}
    for r in snapshots:
        steps.update(r.get("gate_steps", {}))
        for batch, paths in r.get("gate_ms_per_token", {}).items():
            for path, ms in paths.items():
                if ms is not None:
                    measured.setdefault(batch, {}).setdefault(path, []).append(ms)
    if not steps and not measured:
        return {}
    ms = {b: {p: round(float(np.mean(v)), 5) for p, v in paths.items()} for b, paths in measured.items()}
    return {"gate_steps": dict(steps), "gate_ms_per_token": ms}


def _stats(values: list[float]) -> dict[str, float]:
    if not values:
        return {"mean": 0.0, "max": 0.0}
    return {"mean": float(np.mean(values)), "max": float(np.max(values))}


def moving_average(values: list[float], window: int) -> list[float]:
    out, acc = [], 0.0
    for i, v in enumerate(values):
        acc += v
        if i >= window:
            acc -= values[i - window]
        out.append(acc / min(i + 1, window))
    return out


def errors(records: list[dict[str, Any]]) -> dict[str, Any]:
    """What went wrong and was absorbed: reward calls that failed (scored 0), replica loops that raised
    (replaced), trainer steps skipped for a non-finite loss or gradient norm."""
    reward_errors = [r for r in records if r["kind"] == "reward_error"]
    by_kind: dict[str, int] = {}
    for r in reward_errors:
        by_kind[r.get("error_kind", "raised")] = by_kind.get(r.get("error_kind", "raised"), 0) + 1
    return {
        "reward_errors": len(reward_errors),
        "reward_errors_by_kind": dict(sorted(by_kind.items())),
        "replica_errors": sum(r["kind"] == "replica_error" for r in records),
        "nonfinite_steps": sum(bool(r.get("nonfinite")) for r in records if r["kind"] == "step"),
    }


def failures(records: list[dict[str, Any]]) -> dict[str, int]:
    """`summary.json`'s `failures`, counted from the run's records, the ones `metrics.jsonl` holds: a `failure`
    record for every replica, relay, trainer or control actor (prompt pool, partial pool, buffer, manager) lost,
    and what each `recovery` placed (a dead replica's work, or moves that repack could not finish)."""
    lost = Counter(r.get("what") for r in records if r["kind"] == "failure")
    placed = [r for r in records if r["kind"] == "recovery"]
    return {
        "rollouts": lost["rollout"],
        "relays": lost["relay"],
        "trainer": lost["trainer"],
        "control": sum(lost[w] for w in ("prompt_pool", "partial_pool", "buffer", "manager")),
        "recovered_trajectories": sum(r.get("recovered", 0) for r in placed),
        "restarted_trajectories": sum(r.get("restarted", 0) for r in placed),
        "restarted_groups": sum(r.get("restarted_groups", 0) for r in placed),
        "tool_reruns": sum(r.get("tool_reruns", 0) for r in placed),
    }


def summarize(
    records: list[dict[str, Any]],
    *,
    schedule: str,
    wall_s: float,
    warmup_steps: int,
    trajectories: dict[str, int],
    extra: dict[str, Any] | None = None,
) -> dict[str, Any]:
    steps = [r for r in records if r["kind"] == "step"]
    publishes = [r for r in records if r["kind"] == "publish"]
    pulls = [r for r in records if r["kind"] == "pull"]
    gens = [r for r in records if r["kind"] == "replica"]
    staleness = [s for r in steps for s in r.get("staleness", [])]
    rewards = [r["reward_mean"] for r in steps if r.get("reward_mean") is not None]
    window = max(1, min(10, len(rewards) // 5))
    ma = moving_average(rewards, window)

    # Training throughput over a window of steps after warm-up: trained tokens / wall time of that window.
    timed = steps[warmup_steps:] if len(steps) > warmup_steps + 1 else steps
    if len(timed) >= 2:
        span = timed[-1]["t"] - timed[0]["t"]
        train_tps = sum(r["tokens"] for r in timed[1:]) / span if span > 0 else 0.0
    else:
        train_tps = sum(r["tokens"] for r in steps) / wall_s if wall_s > 0 else 0.0
    # Generation throughput: response tokens over all replicas per second of wall time.
    last_by_replica: dict[int, int] = {}
    for r in gens:
        last_by_replica[r["replica"]] = max(last_by_replica.get(r["replica"], 0), r["tokens_generated"])
    gen_tokens = sum(last_by_replica.values())
    kv = [
        r["kv_blocks_used"] / r["kv_blocks_total"]
        for r in gens
        if r.get("kv_blocks_total") and r.get("busy", True)
    ]

    summary: dict[str, Any] = {
        "schedule": schedule,
        "wall_s": round(wall_s, 3),
        "trainer_steps": len(steps),
        "trained_tokens": int(sum(r["tokens"] for r in steps)),
        "train_tokens_per_s": round(train_tps, 2),
        "gen_tokens": int(gen_tokens),
        "gen_tokens_per_s": round(gen_tokens / wall_s, 2) if wall_s > 0 else 0.0,
        "reward_start": round(float(np.mean(rewards[:window])), 4) if rewards else 0.0,
        "reward_end": round(ma[-1], 4) if ma else 0.0,
        "staleness": summarise(staleness),
        "publishes": len(publishes),
        "actor_stall_s": _stats([r["stall_s"] for r in publishes]),
        "relay_propagation_s": _stats(
            [r["propagation_s"] for r in publishes if r.get("propagation_s") is not None]
        ),
        "pulls": len(pulls),
        "pull_s": _stats([r["seconds"] for r in pulls]),
        "reward_window": window,
        "kv_utilisation": round(float(np.mean(kv)), 4) if kv else 0.0,
        "trajectories": trajectories,
        **errors(records),
    }
    calls = [r["tool_calls_mean"] for r in steps if r.get("tool_calls_mean") is not None]
    if any(calls):  # a run with tool turns: how its use of the tools moved, over the reward's windows
        frac = [r["tool_call_frac"] for r in steps if r.get("tool_call_frac") is not None]
        summary["tool_calls"] = {
            "per_trajectory_start": round(float(np.mean(calls[:window])), 4),
            "per_trajectory_end": round(float(np.mean(calls[-window:])), 4),
            "trajectory_share_start": round(float(np.mean(frac[:window])), 4),
            "trajectory_share_end": round(float(np.mean(frac[-window:])), 4),
        }
        made: dict[int, tuple[int, float]] = {}  # each replica's calls and their wait for a tool worker
        for r in gens:
            if "tool_calls" in r and r["tool_calls"] >= made.get(r["replica"], (0, 0.0))[0]:
                made[r["replica"]] = (r["tool_calls"], r["tool_queued_s"])
        n = sum(c for c, _ in made.values())
        if n:  # calls that waited for one of a replica's `task.tool_workers`: the pool bounded the run
            summary["tool_calls"]["queued_s_per_call"] = round(sum(q for _, q in made.values()) / n, 4)
    last: dict[int, dict[str, Any]] = {}
    for r in gens:
        last[r["replica"]] = r
    queued = sum(r.get("queued_ahead", 0) for r in last.values())
    if queued:  # pipelined decode: how often a step was queued before the last one's tokens were known
        decode = sum(r.get("decode_steps", 0) for r in last.values())
        summary["decode_pipeline"] = {
            "queued_ahead_share": round(queued / max(decode, 1), 4),
            "dropped_rows": sum(r.get("dropped_rows", 0) for r in last.values()),
        }
    spec = speculation_rates({k: sum(r.get(k, 0) for r in last.values()) for k in SPECULATION_COUNTERS})
    if spec is not None:  # the replicas' counters summed, then each replica's own (by its id)
        by_replica = {
            str(i): speculation_rates({k: r.get(k, 0) for k in SPECULATION_COUNTERS}) for i, r in last.items()
        }
        summary["speculation"] = {
            **spec,
            **gate_summary(list(last.values())),
            "by_replica": {i: rates for i, rates in sorted(by_replica.items()) if rates is not None},
        }
    summary.update(extra or {})
    return summary
