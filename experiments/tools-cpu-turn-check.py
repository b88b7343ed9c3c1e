"""Play `tool_arith`'s tool turn with a model directory, greedily, as a replica would: generate up to the end of
the call, run the calculator, append its output as the model's chat template renders a tool turn, generate the
answer. Counts, over held-out prompts: answers that called the tool, calls written right, outputs copied, and
answers right. Writes results/tools-cpu/turn-check-NAME.json (NAME: the model directory's name).

    python experiments/tools-cpu-turn-check.py MODEL_DIR [PROMPTS]     (default 24 prompts)
"""

from __future__ import annotations

import json
import re
import sys
from pathlib import Path

if len(sys.argv) < 2 or sys.argv[1] in ("-h", "--help"):
    print(__doc__)
    sys.exit(0 if len(sys.argv) > 1 else 2)

import torch
from transformers import AutoModelForCausalLM

from laminar.data.codec import TaskCodec
from laminar.tasks.tool_arith import CALL_CLOSE, ToolArithTask
from laminar.tools.builtin import calculator


def main() -> None:
    path = Path(sys.argv[1])
    count = int(sys.argv[2]) if len(sys.argv) > 2 else 24
    torch.set_num_threads(2)
    codec = TaskCodec.from_dir(path)
    model = AutoModelForCausalLM.from_pretrained(str(path), dtype=torch.float32).eval()

    def generate(ids: list[int], stop: str | None) -> list[int]:
        with torch.no_grad():
            out = model.generate(
                torch.tensor([ids]),
                max_new_tokens=48,
                do_sample=False,
                eos_token_id=codec.end_ids,
                pad_token_id=codec.pad_id,
                **({"stop_strings": [stop], "tokenizer": codec.tokenizer} if stop else {}),
            )
        return out[0, len(ids) :].tolist()

    counts = {"prompts": 0, "called": 0, "call_right": 0, "copied": 0, "right": 0}
    examples = []
    for row in ToolArithTask(seed=123).rows(count):
        counts["prompts"] += 1
        prompt = codec.encode_prompt(row["prompt"])
        first = generate(prompt, CALL_CLOSE)
        text = codec.decode(first)
        answer, output = text.strip(), None
        if CALL_CLOSE in text:
            counts["called"] += 1
            found = re.search(r'"arguments": "([^"]*)"', text)
            expression = found.group(1) if found else ""
            counts["call_right"] += expression == row["extra_info"]["expression"]
            output = calculator(expression).text.strip()
            answer = codec.decode(generate(prompt + first + codec.render_tool_output(output), None)).strip()
            counts["copied"] += answer == output
        counts["right"] += answer == row["answer"]
        examples.append({"prompt": row["prompt"], "first": text, "tool": output, "answer": answer})
    print(json.dumps(counts))
    out = Path(__file__).resolve().parents[1] / "results" / "tools-cpu" / f"turn-check-{path.name}.json"
    out.write_text(json.dumps({"model": str(path), **counts, "examples": examples}, indent=1) + "\n")


if __name__ == "__main__":
    main()
