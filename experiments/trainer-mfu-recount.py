"""The MFU of every committed `laminar bench trainer` row, counted two ways: as the rows gave it (6 x parameters
x tokens) and from the products the step runs (`laminar.bench.trainer.step_flops`: decoder layers at every
token, causal attention, the output layer at response positions, no embedding, no recomputation). Reads only
the committed JSONs; no GPU.

    .venv/bin/python experiments/trainer-mfu-recount.py  # from the repository root; writes
                                                          # results/trainer/mfu-recount.md and .json

The rows do not store their sequences' lengths. Their batches are synthetic and seeded: the warm-up step is
seed 0 and the measured steps seeds 1 to `--steps`, drawn by `synthetic_groups` from the arguments of the row's
`command` and its shape's vocabulary (the draw of the prompt's and response's random token ids depends on it).
Each row's regenerated token count is checked against its `tokens_per_step`, and its 6 x parameters x tokens
figure against its `mfu`. As in the bench, the median step is the headline: the mean FLOPs of the measured
steps over the median step's time; `*_total_time`, all the measured steps' FLOPs over their summed time.
"""

from __future__ import annotations

import json
import shlex
from pathlib import Path

from laminar.bench.trainer import PEAK_BF16_TFLOPS, parser, step_batches, step_flops
from laminar.engine.random_model import shape_config
from laminar.jsonio import write_json

HERE = Path(__file__).resolve().parents[1] / "results" / "trainer"
PARTS = ("layers", "attention", "output_layer")


def recount(path: Path) -> dict:
    row = json.loads(path.read_text())
    args = parser().parse_args(shlex.split(row["command"])[3:])  # after "laminar bench trainer"
    config = shape_config(row["shape"])
    steps = step_batches(args, config.vocab_size)[1:]
    seqs = [[(len(t.prompt_ids), len(t.response_ids)) for g in groups for t in g] for groups in steps]
    flops = [step_flops(config, s) for s in seqs]
    tokens = [sum(p + r for p, r in s) for s in seqs]
    peak = next(v for k, v in PEAK_BF16_TFLOPS.items() if k in row["machine"]) * 1e12 * row["ranks"]
    step_s, times = row["step_s_median"], row["step_s"]
    mean = sum(f.total for f in flops) / len(flops)
    old = 6 * row["params"] * row["tokens_per_step"] / step_s / peak
    return {
        "row": str(path.relative_to(HERE)),
        "shape": row["shape"],
        "params": row["params"],
        "ranks": row["ranks"],
        "machine": row["machine"],
        "contended": bool(row.get("contended")),
        "step_s_median": step_s,
        "tokens_per_step": row["tokens_per_step"],
        "tokens_regenerated": sum(tokens) / len(tokens),
        "response_share": sum(r for s in seqs for _, r in s) / sum(tokens),
        "mfu_committed": row["mfu"],
        "mfu_6nd": round(old, 4),
        "mfu": round(mean / step_s / peak, 4),
        "mfu_6nd_total_time": round(6 * row["params"] * sum(tokens) / sum(times) / peak, 4),
        "mfu_total_time": round(sum(f.total for f in flops) / sum(times) / peak, 4),
        "ratio": round(mean / (6 * row["params"] * row["tokens_per_step"]), 4),
        "model_flops_per_step": {p: round(sum(getattr(f, p) for f in flops) / len(flops)) for p in PARTS},
        "flops_share": {p: round(sum(getattr(f, p) for f in flops) / len(flops) / mean, 4) for p in PARTS},
    }


def by_shape(rows: list[dict]) -> str:
    """Why the ratio differs by shape: what 6ND charges that is not run (the embedding as a product, the
    output layer at prompt positions) against what it leaves out (attention)."""
    lines = [
        "| shape | embedding in the parameters | output layer | response share of tokens | "
        "attention in the new count | new / old |",
        "|---|---|---|---|---|---|",
    ]
    for shape in dict.fromkeys(r["shape"] for r in sorted(rows, key=lambda r: r["params"])):
        mine = [r for r in rows if r["shape"] == shape]
        config = shape_config(shape)
        ratios = sorted({r["ratio"] for r in mine})
        lines.append(
            f"| {shape} | {100 * config.vocab_size * config.hidden_size / mine[0]['params']:.1f}% | "
            f"{'tied to the embedding' if config.tie_word_embeddings else 'its own'} | "
            f"{100 * mine[0]['response_share']:.1f}% | {100 * mine[0]['flops_share']['attention']:.1f}% | "
            f"{ratios[0]:.3f}{f'-{ratios[-1]:.3f}' if len(ratios) > 1 else ''} |"
        )
    return "\n".join(lines) + "\n\n" + WHY


WHY = """6 x parameters x tokens charges every parameter as a product at every token. The untied 7B shape has an
embedding and an output layer of 7.2% of its parameters each: the embedding is a lookup and the output layer
runs at 92.1% of the tokens, so 6ND charges 7.2% + 7.9% x 7.2% = 7.8% too much; attention, which it leaves
out, is 1.1% of the new count: 0.933. The 0.5B and 1.5B shapes tie the two, so their parameter count holds the matrix once,
and 6ND charges it at every token as if it were the output layer: too much only at prompt positions (6.7% of
27.6% = 1.9% for 0.5B, 1.0% for 1.5B), less than the attention it leaves out (4.0% and 2.6%): 1.022 and 1.016.

"""


def table(rows: list[dict]) -> str:
    head = (
        "| row | GPUs | step (median) | tokens a step | old MFU (6ND) | **new MFU** | new / old | "
        "old, all steps | new, all steps | layers / attention / output layer |\n"
        "|---|---|---|---|---|---|---|---|---|---|\n"
    )
    lines = []
    for r in rows:
        shares = " / ".join(f"{100 * r['flops_share'][p]:.1f}%" for p in PARTS)
        where = f"{r['ranks']} x {'H200' if 'H200' in r['machine'] else 'H100'}"
        lines.append(
            f"| `{r['row']}`{' (contended)' if r['contended'] else ''} | {where} | {r['step_s_median']:.3f} s | "
            f"{r['tokens_per_step']:,.1f} | {100 * r['mfu_6nd']:.1f}% | **{100 * r['mfu']:.1f}%** | "
            f"{r['ratio']:.3f} | {100 * r['mfu_6nd_total_time']:.1f}% | {100 * r['mfu_total_time']:.1f}% | "
            f"{shares} |"
        )
    return head + "\n".join(lines) + "\n"


def main() -> None:
    rows = [
        recount(p)
        for p in sorted(HERE.glob("*/trainer.json"))
        + sorted(HERE.glob("*/*/trainer.json"))
        + sorted(HERE.glob("first-pass/*.json"))
    ]
    for r in rows:
        assert r["tokens_regenerated"] == r["tokens_per_step"], f"{r['row']}: the batches do not regenerate"
        # the committed times are rounded to 0.1 ms, which moves the fourth digit at most by one or two
        assert abs(r["mfu_6nd"] - r["mfu_committed"]) <= 2e-4, (
            f"{r['row']}: 6ND {r['mfu_6nd']} is not its mfu"
        )
    write_json(HERE / "mfu-recount.json", rows)
    (HERE / "mfu-recount.md").write_text(HEADER + by_shape(rows) + table(rows))
    print(table(rows))


HEADER = """# MFU recounted: 6 x parameters x tokens against the products the step runs

```
.venv/bin/python experiments/trainer-mfu-recount.py  # reads the committed trainer.json files; no GPU
```

Every committed `laminar bench trainer` row, its figure as committed (*old*: 6 x parameters x tokens) beside
the FLOPs of the products its step runs (*new*: `laminar.bench.trainer.step_flops`, what `mfu` means in rows
written from now on, with the old figure kept as `mfu_6nd`). Per sequence of T tokens, R of them response, one
step is 3x the forward (the backward: two products for each of the forward's):

- decoder layers: 2 T x layers x (2 h q + 2 h kv + 3 h i) forward (q, k, v, o, gate, up, down);
- attention, causal: 2 x head_dim x heads x T(T+1) forward a layer (T(T+1)/2 query-key pairs, a score and a
  weighted value each);
- output layer: 2 R h V forward, at the R positions that predict a response token only
  (`laminar/trainer/logprobs.py` takes logits nowhere else);
- embedding: a lookup, 0.

Model FLOPs, as MFU is usually defined: no recomputation is counted (activation checkpointing's second forward
in the 7B rows, FlashAttention's scores in its backward, the output layer's logits recomputed in its
backward), nor padding (`qwen0.5b-1gpu-padded`) nor the masked part of attention tiles on the diagonal.

The rows do not store their sequences' lengths: they are regenerated from each row's `command` (the bench's
batches are seeded: seeds 1 to `--steps` are the measured steps) and checked against the row's
`tokens_per_step`, exactly, and its 6ND figure against its `mfu`, to the rounding of its times. *Old* and *new*
use the row's median step (the bench's headline); *all steps* is every measured step's work over their summed
time (`mfu_total_time`). Peak: 989 TFLOP/s a card, H100 and H200 alike. The 7B rows have 25,826.5 tokens a
step and the others 30,422.2 (29,828.2 with `--steps 8`) from the same seeds: the token ids are drawn from the
shape's vocabulary, which differs, and the lengths are drawn after them.

"""


if __name__ == "__main__":
    main()
