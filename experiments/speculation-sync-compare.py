"""Two runs' responses compared token for token, by trajectory id (`trajectories.jsonl`, `run.save_trajectories`):
how many are identical, where the others first differ, and the mean length in each. For sync runs of the same
seed, which sample the same prompts with the same seeds from the same weights at step 1.

    python experiments/speculation-sync-compare.py RUN_A RUN_B [STEP]

STEP (default 1): only the trajectories trained at that step. Prints one JSON object.
"""

from __future__ import annotations

import json
import statistics
import sys
from pathlib import Path


def responses(run: Path, step: int) -> dict[str, list[int]]:
    out = {}
    with open(run / "trajectories.jsonl") as f:
        for line in f:
            t = json.loads(line)
            if t.get("trained_at") == step:
                out[t["traj_id"]] = t["response_ids"]
    return out


def compare(a: dict[str, list[int]], b: dict[str, list[int]]) -> dict:
    both = sorted(set(a) & set(b))
    same = [k for k in both if a[k] == b[k]]
    firsts = []
    for k in both:
        if a[k] != b[k]:
            n = min(len(a[k]), len(b[k]))
            firsts.append(next((i for i in range(n) if a[k][i] != b[k][i]), n))
    return {
        "trajectories": len(both),
        "identical": len(same),
        "first_difference_at_median": statistics.median(firsts) if firsts else None,
        "mean_len": [statistics.mean(len(a[k]) for k in both), statistics.mean(len(b[k]) for k in both)]
        if both
        else None,
    }


if __name__ == "__main__":
    step = int(sys.argv[3]) if len(sys.argv) > 3 else 1
    result = compare(responses(Path(sys.argv[1]), step), responses(Path(sys.argv[2]), step))
    print(json.dumps({"a": sys.argv[1], "b": sys.argv[2], "step": step, **result}))
