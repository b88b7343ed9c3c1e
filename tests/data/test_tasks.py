import json
import random

import numpy as np
import pytest

from laminar.data.codec import TaskCodec, save_tokenizer
from laminar.data.dataset import DatasetError, load_file
from laminar.rewards.reverse import reverse_reward
from laminar.tasks.reverse import ReverseTask, demo_codec, demo_tokenizer


def test_response_lengths_are_long_tailed():
    task, codec = ReverseTask(), demo_codec()
    rng = random.Random(0)
    lengths = np.array([len(codec.encode_answer(task.make_row(rng)["answer"])) for _ in range(20000)])
    assert np.percentile(lengths, 99) >= 5 * np.median(lengths)
    assert lengths.max() <= task.max_response_tokens()


def test_codec_round_trip_and_reward_of_the_true_answer(tmp_path):
    codec = demo_codec()
    row = ReverseTask().rows(1, seed=3)[0]
    ids = codec.encode_prompt(row["prompt"])
    assert ids[0] == codec.bos_id and codec.tokenizer.convert_tokens_to_ids("=") == ids[-1]
    answer = codec.encode_answer(row["answer"])
    assert answer[-1] == codec.eos_id
    assert reverse_reward(codec.decode(answer + [5, 6]), row) == 1.0  # text after EOS is ignored
    save_tokenizer(demo_tokenizer(), tmp_path)
    assert TaskCodec.from_dir(tmp_path).encode_prompt(row["prompt"]) == ids


def test_jsonl_rows_are_checked_by_row_and_field(tmp_path):
    p = tmp_path / "d.jsonl"
    p.write_text(json.dumps({"prompt": "1 2 ="}) + "\n\n" + json.dumps({"prompt": ""}) + "\n")
    with pytest.raises(DatasetError, match="row 2: field 'prompt' is empty"):
        load_file(p)
    p.write_text('{"prompt": "1 ="}\n{"prompt": \n')
    with pytest.raises(DatasetError, match="row 1: not valid JSON"):
        load_file(p)
    with pytest.raises(FileNotFoundError, match="does not exist"):
        load_file(tmp_path / "missing.jsonl")
    p.write_text('{"prompt": "1 ="}\n')
    assert load_file(p) == [{"prompt": "1 =", "data_source": "", "ground_truth": None, "extra_info": {}}]


def test_the_tool_workload_scripts_long_tailed_calls_within_each_response():
    from laminar.tasks.lengths import LengthWorkload

    w = LengthWorkload(
        median=64, tool_calls_mean=2.0, tool_latency_median_s=0.5, tool_output_tokens=8, seed=1
    )
    rows = w.rows(2000)
    calls = [len(r["tool_script"]["calls_at"]) for r in rows if "tool_script" in r]
    assert 1.6 < sum(calls) / len(calls) < 2.4 and max(calls) >= 6  # geometric: a long tail of many calls
    latency = sorted(x for r in rows for x in r.get("tool_script", {}).get("latency_s", []))
    median, p99 = latency[len(latency) // 2], latency[int(len(latency) * 0.99)]
    assert 0.4 < median < 0.6 and p99 / median > 7
    for r in rows[:200]:
        script, budget = r["tool_script"], r["sampling"]["max_new_tokens"]
        k = len(script["calls_at"])
        n = budget - k * 8
        assert all(1 <= c < n for c in script["calls_at"]) and len(set(script["calls_at"])) == k
    assert "tool_script" not in LengthWorkload(median=64, seed=1).rows(5)[0]
    # a floor on the calls: every response makes one at least (a third made none above)
    assert calls.count(0) > 500
    floored = LengthWorkload(median=64, tool_calls_mean=2.0, tool_calls_min=1, seed=1).rows(2000)
    assert min(len(r["tool_script"]["calls_at"]) for r in floored) == 1


def test_the_lengths_prompt_length_comes_from_the_config():
    from laminar.configure import load_config
    from laminar.tasks.rows import train_rows

    cfg = load_config(None, ["task.name=lengths", "task.num_prompts=3", "task.length_prompt_words=40"])
    for row in train_rows(cfg):
        assert len(row["prompt"].split()) == 41  # 40 digits and " ="
