"""Generated tokens per busy second of each run's replicas, from the last snapshot of each replica in its
`metrics.jsonl` (`tokens_generated` over `busy_s`, summed over replicas): the replicas' own speed, whatever the
schedule made them wait for.   python results/schedules-tools-gpu/busy_rate.py [RUN_DIR ...]"""

import json
import sys
from pathlib import Path

HERE = Path(__file__).parent
RUNS = sorted(HERE.glob("tool-workers-32/seed*-*"))

for run in [Path(p) for p in sys.argv[1:]] or RUNS:
    last = {}
    for line in (run / "metrics.jsonl").read_text().splitlines():
        r = json.loads(line)
        if r.get("kind") == "replica":
            last[r["replica"]] = r
    tokens = sum(r["tokens_generated"] for r in last.values())
    busy = sum(r["busy_s"] for r in last.values())
    print(f"{run.name}: {tokens} tokens in {busy:.1f} busy s, {tokens / busy:.0f} a busy second")
