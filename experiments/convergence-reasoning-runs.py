"""Where each convergence run's time went, from its run folder: one row a run, as JSON (`runs.json` beside a
`laminar bench convergence --report` folder).

    python experiments/convergence-reasoning-runs.py DIR --machine "4 x NVIDIA H200" --commit abc1234 > DIR/runs.json

DIR holds runs/SCHEDULE/seed-S/{summary.json,metrics.jsonl} (what `laminar bench convergence` writes). Per run:
the wall time and trainer steps of its summary, the mean trainer step (`step_time_s`), the trainer's busy share
(its step time over the wall time), the replicas' busy share (the growth of each replica's `busy_s` over the span
of its reports, averaged over replicas), the staleness of the trained samples, the mean reward and p99 response
length over steps, and the train/rollout log-prob mismatch (k3 KL) over steps.
"""

from __future__ import annotations

import argparse
import json
import pathlib
import statistics


def run_row(folder: pathlib.Path) -> dict:
    summary = json.loads((folder / "summary.json").read_text())
    rows = [json.loads(line) for line in (folder / "metrics.jsonl").read_text().splitlines() if line.strip()]
    steps = [r for r in rows if r.get("kind") == "step"]
    by_replica: dict[int, list[dict]] = {}
    for r in rows:
        if r.get("kind") == "replica":
            by_replica.setdefault(r["replica"], []).append(r)
    busy = [
        (rs[-1]["busy_s"] - rs[0]["busy_s"]) / (rs[-1]["t"] - rs[0]["t"])
        for rs in by_replica.values()
        if len(rs) > 1 and rs[-1]["t"] > rs[0]["t"]
    ]
    step_s = [r["step_time_s"] for r in steps]
    wall = summary["wall_s"]

    def mean_of(key: str) -> float | None:
        values = [r[key] for r in steps if r.get(key) is not None]
        return round(statistics.fmean(values), 5) if values else None

    return {
        "schedule": folder.parent.name,
        "seed": int(folder.name.removeprefix("seed-")),
        "steps": summary["trainer_steps"],
        "wall_s": wall,
        "wall_per_step_s": round(wall / max(summary["trainer_steps"], 1), 3),
        "trainer_step_s": round(statistics.fmean(step_s), 3) if step_s else None,
        "trainer_busy_share": round(sum(step_s) / wall, 3) if wall else None,
        "replicas_busy_share": round(statistics.fmean(busy), 3) if busy else None,
        "gen_tokens_per_s": summary["gen_tokens_per_s"],
        "train_tokens_per_s": summary["train_tokens_per_s"],
        "staleness": summary["staleness"],
        "reward_mean": mean_of("reward_mean"),
        "response_len_p99_mean": mean_of("response_len_p99"),
        "logprob_mismatch_kl_mean": mean_of("logprob_mismatch_kl"),
        "clip_frac_mean": mean_of("clip_frac"),
        "code": summary["code"],
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("dir", type=pathlib.Path)
    parser.add_argument("--machine", required=True)
    parser.add_argument("--commit", required=True)
    args = parser.parse_args()
    folders = sorted(p.parent for p in (args.dir / "runs").glob("*/seed-*/summary.json"))
    if not folders:
        raise SystemExit(
            f"{args.dir}/runs holds no SCHEDULE/seed-S/summary.json: point at a convergence folder"
        )
    out = {"machine": args.machine, "commit": args.commit, "runs": [run_row(f) for f in folders]}
    print(json.dumps(out, indent=1))


if __name__ == "__main__":
    main()
