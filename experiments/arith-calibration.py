"""How often a model answers `arith` problems right before any training, per level, greedy and sampled.

    python experiments/arith-calibration.py --model /work/models/smollm2-135m-instruct --count 100

Prompts go through the model's chat template; the project's engine generates (CPU unless --device cuda); the
reward is the task's own (laminar.rewards.math). Writes results/arith-calibration/calibration.json (or --out).
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import torch
from transformers import AutoTokenizer

from laminar.tasks.arith import LEVELS, ArithTask
from laminar.engine import Engine, SamplingParams
from laminar.rewards.math import default_score


def generate(
    engine: Engine, prompts: list[list[int]], temperature: float, max_new_tokens: int
) -> list[list[int]]:
    for i, ids in enumerate(prompts):
        params = SamplingParams(temperature=temperature, max_new_tokens=max_new_tokens, seed=i)
        engine.add_request(str(i), ids, params)
    out: dict[str, list[int]] = {}
    while engine.has_unfinished():
        for fin in engine.step().finished:
            out[fin.request_id] = fin.output_token_ids
    return [out[str(i)] for i in range(len(prompts))]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", required=True)
    parser.add_argument("--levels", default=",".join(map(str, LEVELS)))
    parser.add_argument("--count", type=int, default=100, help="held-out problems per level")
    parser.add_argument("--max-new-tokens", type=int, default=256)
    parser.add_argument("--device", default="cpu")
    parser.add_argument(
        "--out", default=str(Path(__file__).parents[1] / "results" / "arith-calibration" / "calibration.json")
    )
    args = parser.parse_args()

    tok = AutoTokenizer.from_pretrained(args.model)
    dtype = torch.bfloat16 if args.device == "cuda" else torch.float32
    max_len = 512  # the longest prompt (~120 tokens) plus max_new_tokens
    engine = Engine.from_pretrained(
        args.model,
        device=args.device,
        dtype=dtype,
        max_num_seqs=args.count,
        num_kv_blocks=args.count * -(-max_len // 16),  # every sequence at full length: no preemption
        max_model_len=max_len,
        use_cuda_graphs=False,
    )
    results, examples = {}, {}
    for level in (int(x) for x in args.levels.split(",")):
        rows = ArithTask(levels=(level,), seed=0).held_out_rows(args.count)
        prompts = [
            tok.apply_chat_template(r["prompt"], tokenize=True, add_generation_prompt=True, return_dict=False)
            for r in rows
        ]
        for mode, temperature in (("greedy", 0.0), ("sampled_t1", 1.0)):
            t = time.time()
            outputs = generate(engine, prompts, temperature, args.max_new_tokens)
            texts = [tok.decode(o, skip_special_tokens=True) for o in outputs]
            scores = [default_score(text, row) for text, row in zip(texts, rows)]
            results.setdefault(str(level), {})[mode] = {
                "accuracy": sum(scores) / len(scores),
                "mean_response_tokens": sum(map(len, outputs)) / len(outputs),
                "truncated": sum(len(o) >= args.max_new_tokens for o in outputs),
                "seconds": round(time.time() - t, 1),
            }
            examples.setdefault(str(level), {})[mode] = [
                {"prompt": r["prompt"][0]["content"], "truth": r["ground_truth"], "response": x, "score": s}
                for r, x, s in list(zip(rows, texts, scores))[:3]
            ]
            print(level, LEVELS[level], mode, results[str(level)][mode], flush=True)
            record = {  # written after every measurement: a long CPU run keeps what it has
                "model": args.model,
                "count_per_level": args.count,
                "max_new_tokens": args.max_new_tokens,
                "device": args.device,
                "levels": {k: LEVELS[int(k)] for k in results},
                "results": results,
                "examples": examples,
            }
            Path(args.out).write_text(json.dumps(record, indent=2) + "\n")


if __name__ == "__main__":
    main()
