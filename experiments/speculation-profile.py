"""`laminar bench engine` under cProfile, with the time of every garbage collection: where a speculation mode's
host time goes (`results/speculation/README.md`, "On a model whose samples share little text").

    python3 experiments/speculation-profile.py --speculation auto --model /tmp/smol --task chain \
        --batch-sizes 64 --new-tokens 512 --workload tail --out OUT

The arguments are `laminar bench engine`'s; it prints the collections (count, seconds, how many of the oldest
generation) and the functions with the most time of their own, then the engine's by cumulative time.
"""

from __future__ import annotations

import cProfile
import gc
import io
import pstats
import sys
import time

from laminar.bench.engine import main

collections = {"count": 0, "seconds": 0.0, "oldest": 0}
_started = [0.0]


def _time_collection(phase: str, info: dict) -> None:
    if phase == "start":
        _started[0] = time.perf_counter()
        return
    collections["count"] += 1
    collections["seconds"] += time.perf_counter() - _started[0]
    collections["oldest"] += info["generation"] == 2


def _stats(profile: cProfile.Profile, order: str, *restrict: object) -> str:
    out = io.StringIO()
    pstats.Stats(profile, stream=out).sort_stats(order).print_stats(*restrict)
    return out.getvalue()


if __name__ == "__main__":
    gc.callbacks.append(_time_collection)
    profile = cProfile.Profile()
    profile.enable()
    main(sys.argv[1:])
    profile.disable()
    print("garbage collections", collections)
    print(_stats(profile, "tottime", 25))
    print(_stats(profile, "cumulative", "speculative|drafter|engine.py", 25))
