"""The speed-up figure of `results/speculation/README.md`: `laminar bench engine --speculation` results side by
side, one panel each (each mode's tokens/s over off's by batch size, the median run and every run, the targets).

    python experiments/speculation-plot.py OUT.png TITLE=RESULT.json [TITLE=RESULT.json ...]
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

from laminar.bench.speculation import plot_speedups

if __name__ == "__main__":
    out, *panels = sys.argv[1:]
    named = [(title, json.loads(Path(p).read_text())) for title, p in (a.split("=", 1) for a in panels)]
    if not plot_speedups(named, Path(out)):
        sys.exit("matplotlib is not installed")
    print(f"wrote {out}")
