"""The greedy copy check of results/tools-cpu/README.md: play the tool turn with a tool_arith warm start directly
(generate up to </tool_call>, run the calculator, append its rendered output, generate the answer) on 120
held-out prompts, and count per operator: called, call written right, output copied, answer right.

    python results/tools-cpu/copy_check.py runs/warmup-tool-arith [TEMPERATURE]    (0 = greedy, the default)
"""
import torch, random, re, sys
from transformers import AutoModelForCausalLM
from laminar.data.codec import TaskCodec
from laminar.data.tool_arith import ToolArithTask, CALL_CLOSE
from laminar.tools.builtin import calculator
d = sys.argv[1]
codec = TaskCodec.from_dir(d)
model = AutoModelForCausalLM.from_pretrained(d).eval()
torch.manual_seed(0)
def gen(ids, stop_text=None, n=40, temp=0.0):
    out = []
    for _ in range(n):
        with torch.no_grad():
            logits = model(torch.tensor([ids + out])).logits[0, -1]
        t = int(logits.argmax()) if temp == 0 else int(torch.multinomial(torch.softmax(logits / temp, -1), 1))
        if t == codec.eos_id: break
        out.append(t)
        if stop_text and codec.decode(out).endswith(stop_text): break
    return out
rows = ToolArithTask(seed=123).rows(200)
stats = {"+": [0,0,0,0,0], "*": [0,0,0,0,0]}  # n, called, expr_ok, copy_ok(answer==tool out), right
temp = float(sys.argv[2]) if len(sys.argv) > 2 else 0.0
for r in rows[:120]:
    op = "+" if "+" in r["prompt"] else "*"
    s = stats[op]; s[0] += 1
    p = codec.encode_prompt(r["prompt"])
    a = gen(p, CALL_CLOSE, temp=temp)
    text = codec.decode(a)
    if CALL_CLOSE in text:
        s[1] += 1
        m = re.search(r'"arguments": "([^"]*)"', text)
        expr = m.group(1) if m else ""
        s[2] += expr == r["extra_info"]["expression"]
        out = calculator(expr).text
        ctx = codec.render_tool_output(out)
        ans = codec.decode(gen(p + a + ctx, temp=temp)).strip()
        s[3] += ans == out.strip()
        s[4] += ans == r["answer"]
        if op == "+" and ans != out.strip() and s[1] <= 6: print("sum copy:", r["prompt"], "tool:", out.strip(), "wrote:", ans)
    else:
        ans = text.strip()
        s[4] += ans == r["answer"]
for op, s in stats.items():
    print(op, dict(zip(["n", "called", "expr_ok", "copied", "right"], s)))
