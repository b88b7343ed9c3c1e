"""The tool_arith task: its rows, its tokenizer's round trip of the call syntax through a model directory, the
reward that reads only what the model wrote, the warm start's demonstrations, and a model taught the call by a
short warm start making it through the replica's tool driver with the real calculator."""

from dataclasses import replace

import pytest

from laminar.config import ConfigError
from laminar.configure import load_config
from laminar.data.codec import TaskCodec, save_tokenizer
from laminar.data.records import Trajectory
from laminar.rewards.tool_arith import final_answer, tool_arith_reward
from laminar.tasks.reverse import demo_codec
from laminar.tasks.tool_arith import (
    ARGS_OPEN,
    CALL_CLOSE,
    CALL_OPEN,
    ToolArithTask,
    call_text,
    check_tokenizer,
    demonstration,
    tool_tokenizer,
)
from laminar.tools.builtin import calculator
from laminar.tools.registry import load_tools, parse_tool_call, run_tool_call
from laminar.tools.sandbox import SandboxLimits


@pytest.fixture(scope="module")
def codec(tmp_path_factory):
    """The task's tokenizer as a run loads it: saved into a directory, read back by AutoTokenizer."""
    out = tmp_path_factory.mktemp("tool-tokenizer")
    save_tokenizer(tool_tokenizer(), out)
    return TaskCodec.from_dir(out)


def test_rows_are_seeded_large_and_their_answer_is_the_expression_value():
    rows = ToolArithTask(seed=3).rows(200)
    assert rows == ToolArithTask(seed=3).rows(200) and rows != ToolArithTask(seed=4).rows(200)
    ops = set()
    for r in rows:
        expression = r["extra_info"]["expression"]
        assert r["prompt"] == f"{expression}=" and r["answer"] == calculator(expression).text
        a, op, b = expression.partition("+") if "+" in expression else expression.partition("*")
        assert (len(a), len(b)) == ((5, 5) if op == "+" else (4, 3))
        ops.add(op)
    assert ops == {"+", "*"}
    with pytest.raises(ValueError, match="at least one digit"):
        ToolArithTask(mul_digits=(0, 3))


def test_the_call_syntax_round_trips_and_the_parser_reads_the_call(codec):
    check_tokenizer(codec)
    call = call_text("4821*937")
    ids = codec.tokenizer(call, add_special_tokens=False)["input_ids"]
    tokens = codec.tokenizer.convert_ids_to_tokens(ids)
    assert tokens[:2] == [CALL_OPEN, ARGS_OPEN] and tokens[-1] == CALL_CLOSE and len(ids) == 12
    assert codec.decode(ids) == call
    parsed = parse_tool_call(codec.decode(ids))
    assert (parsed.name, parsed.arguments, parsed.error) == ("calculator", "4821*937", "")
    result = run_tool_call(parsed, load_tools(["calculator"]), SandboxLimits())
    assert result.ok and result.text == "4517277"
    context = codec.render_tool_output(result.text)
    assert codec.decode(context) == "\n<tool_output>\n4517277\n</tool_output>\n"
    assert codec.decode(codec.encode_prompt("12+3=")) == "12+3="  # BOS is put before a prompt, then dropped


def test_a_tokenizer_without_the_call_syntax_is_refused_by_name():
    with pytest.raises(ValueError, match="does not round-trip the task's call syntax"):
        check_tokenizer(demo_codec())  # the demo's digits-only tokenizer


def test_the_reward_reads_only_what_the_model_wrote_after_the_tool():
    row = {"answer": "4517277"}
    used = f"{call_text('4821*937')}\n<tool_output>\n4517277\n</tool_output>\n"
    assert tool_arith_reward(used + "4517277", row) == 1.0
    assert tool_arith_reward(used, row) == 0.0  # the tool's output is not the model's answer
    assert tool_arith_reward(used + "4517278", row) == 0.0
    assert tool_arith_reward("4517277", row) == 1.0  # right without the tool counts too
    assert tool_arith_reward("45172770", row) == 0.0
    assert final_answer(used + " 12 ") == "12"
    with pytest.raises(KeyError, match="needs the row's 'answer'"):
        tool_arith_reward("1", {"prompt": "1+0="})


def test_demonstrations_train_the_call_and_the_answer_never_the_tool_output(codec):
    row = ToolArithTask(seed=1).rows(1)[0]
    output = calculator(row["extra_info"]["expression"]).text
    ids, mask = demonstration(codec, row, True, output)
    prompt = codec.encode_prompt(row["prompt"])
    trained = codec.decode([t for t, m in zip(ids, mask) if m])
    context = codec.decode([t for t, m in zip(ids[len(prompt) :], mask[len(prompt) :]) if not m])
    assert mask[: len(prompt)] == [0] * len(prompt) and ids[-1] == codec.eos_id
    assert trained == call_text(row["extra_info"]["expression"]) + row["answer"]
    assert context == f"\n<tool_output>\n{output}\n</tool_output>\n"
    assert tool_arith_reward(codec.decode(ids[len(prompt) :]), row) == 1.0
    direct, direct_mask = demonstration(codec, row, False, "")
    assert direct == prompt + codec.encode_answer(row["answer"]) and sum(direct_mask) == len(direct) - len(
        prompt
    )


def test_the_config_needs_the_calculator_and_the_rows_are_the_task(tmp_path):
    with pytest.raises(ConfigError, match="holds calculator when task.name=tool_arith"):
        load_config(overrides=["task.name=tool_arith"])
    cfg = load_config(overrides=["task.name=tool_arith", "task.tools=[calculator]", "task.num_prompts=5"])
    from laminar.runtime.lifetime import eval_rows
    from laminar.tasks.rows import train_rows

    rows = train_rows(cfg)
    assert len(rows) == 5 and rows[0]["ground_truth"] == rows[0]["answer"]
    assert tool_arith_reward(rows[0]["answer"], rows[0]) == 1.0
    held_out = {r["prompt"] for r in eval_rows(replace(cfg, eval=replace(cfg.eval, num_prompts=50)))}
    assert not held_out & {r["prompt"] for r in rows}


def test_tool_outputs_count_the_runs_of_context_in_a_trajectory():
    def traj(mask):
        return Trajectory("t", 0, 0, [1], [5] * len(mask), [0.0] * len(mask), 0, loss_mask=mask)

    assert traj([]).tool_outputs == 0
    assert traj([1, 1, 0, 0, 1, 0, 1]).tool_outputs == 2
    assert traj([0, 1]).tool_outputs == 1


def test_a_short_warm_start_calls_the_calculator_through_the_replicas_tool_driver(tmp_path):
    """A tiny model taught only tool demonstrations for a few steps writes a call the parser reads; the driver
    parks it, runs the real calculator and appends its output (mask 0), and the model goes on after it."""
    from laminar.engine import Engine, SamplingParams
    from laminar.tasks.warmup import WarmupConfig, warmup
    from laminar.tools.turns import ToolTurns

    cfg = WarmupConfig(
        hidden_size=32, layers=2, heads=2, intermediate_size=64, steps=60, lr=1e-2, tool_share=1.0
    )
    out = warmup(tmp_path / "w", cfg, task="tool_arith", log=False)
    codec = TaskCodec.from_dir(out)
    engine = Engine.from_pretrained(out, max_num_seqs=4, num_kv_blocks=16)
    turns = ToolTurns(
        tools=load_tools(["calculator"]),
        decode=codec.decode,
        render=codec.render_tool_output,
        max_turns=1,
    )
    rows = ToolArithTask(seed=5).rows(2)
    for i, row in enumerate(rows):
        engine.add_request(
            f"r{i}", codec.encode_prompt(row["prompt"]), SamplingParams(temperature=0.0, max_new_tokens=40)
        )
    done = {}
    while engine.has_unfinished():
        out_step = engine.step()
        done.update({f.request_id: f for f in out_step.finished})
        turns.after_step(engine, out_step)
        done.update(
            {f.request_id: f for f in turns.poll(engine, wait_s=0.0 if out_step.new_tokens else 0.05)}
        )
    turns.shutdown()
    assert turns.calls == 2 and turns.errors == 0
    for i in range(len(rows)):
        fin = done[f"r{i}"]
        mask = fin.loss_mask
        first_context = mask.index(0)
        call = parse_tool_call(codec.decode(fin.output_token_ids[:first_context]))
        assert call is not None and call.name == "calculator" and not call.error
        context = [t for t, m in zip(fin.output_token_ids, mask) if m == 0]
        value = calculator(call.arguments).text
        assert codec.decode(context) == f"\n<tool_output>\n{value}\n</tool_output>\n"
        assert mask[first_context + len(context) :] == [1] * (len(mask) - first_context - len(context))
