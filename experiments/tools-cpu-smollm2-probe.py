"""Does SmolLM2-135M-Instruct call the calculator on `tool_arith` prompts before any training? Samples 4 answers
to each of 12 prompts (temperature 1, 48 new tokens) through the model's chat template, with no system prompt
and with one that spells out the call, and counts the answers that open a `<tool_call>`. Writes
results/tools-cpu/smollm2-probe.json (smollm2-probe-NAME.json for another model directory than the default).

    laminar model import SmolLM2-135M-Instruct.Q4_1.gguf --out runs/models/smollm2-135m-instruct
    python experiments/tools-cpu-smollm2-probe.py [MODEL_DIR]
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

if sys.argv[1:2] in (["-h"], ["--help"]):
    print(__doc__)
    sys.exit(0)

import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from laminar.tasks.tool_arith import ToolArithTask, call_text

SAMPLES, PROMPTS, NEW_TOKENS = 4, 12, 48
SYSTEMS = {
    "no system prompt": None,
    "the call spelled out": (
        "You can use a calculator. To compute an expression, write exactly "
        f"{call_text('EXPRESSION')} and wait for its output; then write only the number it gave."
    ),
}


def main() -> None:
    path = sys.argv[1] if len(sys.argv) > 1 else "runs/models/smollm2-135m-instruct"
    torch.manual_seed(0)
    torch.set_num_threads(2)
    tok = AutoTokenizer.from_pretrained(path)
    model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()
    rows = ToolArithTask(seed=3).rows(PROMPTS)
    result = {"model": path, "samples_per_prompt": SAMPLES, "prompts": PROMPTS, "variants": {}}
    for name, system in SYSTEMS.items():
        calls, examples = 0, []
        for row in rows:
            messages = ([{"role": "system", "content": system}] if system else []) + [
                {"role": "user", "content": row["prompt"]}
            ]
            ids = tok.apply_chat_template(messages, add_generation_prompt=True, return_tensors="pt")
            ids = ids if isinstance(ids, torch.Tensor) else ids["input_ids"]
            with torch.no_grad():
                out = model.generate(
                    ids,
                    max_new_tokens=NEW_TOKENS,
                    do_sample=True,
                    temperature=1.0,
                    num_return_sequences=SAMPLES,
                    pad_token_id=tok.eos_token_id,
                )
            texts = [tok.decode(o[ids.shape[1] :], skip_special_tokens=True) for o in out]
            calls += sum("<tool_call>" in t for t in texts)
            examples.append({"prompt": row["prompt"], "first_answer": texts[0]})
        result["variants"][name] = {"calls": calls, "samples": SAMPLES * len(rows), "examples": examples}
        print(f"{name}: {calls} of {SAMPLES * len(rows)} answers opened a tool call")
    name = "smollm2-probe.json" if len(sys.argv) < 2 else f"smollm2-probe-{Path(path).name}.json"
    if Path(path).name == "smollm2-135m-instruct":
        name = "smollm2-probe.json"
    (Path(__file__).resolve().parents[1] / "results" / "tools-cpu" / name).write_text(json.dumps(result, indent=1) + "\n")


if __name__ == "__main__":
    main()
