"""The tail's share of a run's decode work, from its replicas' snapshots: for each run folder, the decode steps and
busy time its replicas spent with a running batch of at most 16 requests (where `rollout.speculation=auto` may
verify), and how many of those steps verified.

    python experiments/speculation-tail-share.py RUN_DIR [RUN_DIR ...] > tail-share.json

Each pair of consecutive snapshots of a replica (`kind: replica` in `metrics.jsonl`, a few a second) counts its
decode steps, verify steps and busy seconds at the mean of the two snapshots' running batch.
"""

from __future__ import annotations

import collections
import json
import sys
from pathlib import Path

SMALL = 16  # rollout.speculation_max_batch's default


def tail_share(run: Path) -> dict:
    by_replica: dict[int, list[dict]] = collections.defaultdict(list)
    with open(run / "metrics.jsonl") as f:
        for line in f:
            r = json.loads(line)
            if r.get("kind") == "replica":
                by_replica[r["replica"]].append(r)
    total = {"decode_steps": 0, "verify_steps": 0, "busy_s": 0.0}
    small = dict(total)
    for snaps in by_replica.values():
        for a, b in zip(snaps, snaps[1:]):
            d = {
                "decode_steps": b["decode_steps"] - a["decode_steps"],
                "verify_steps": b.get("verify_steps", 0) - a.get("verify_steps", 0),
                "busy_s": b["busy_s"] - a["busy_s"],
            }
            for k, v in d.items():
                total[k] += v
                if (a["running"] + b["running"]) / 2 <= SMALL:
                    small[k] += v
    return {
        "run": str(run),
        "total": total,
        f"running_at_most_{SMALL}": small,
        "share_of_decode_steps": small["decode_steps"] / max(total["decode_steps"], 1),
        "share_of_busy_s": small["busy_s"] / max(total["busy_s"], 1e-9),
        "verified_share_of_those_steps": small["verify_steps"] / max(small["decode_steps"], 1),
    }


if __name__ == "__main__":
    print(json.dumps([tail_share(Path(d)) for d in sys.argv[1:]], indent=1))
