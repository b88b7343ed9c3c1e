import json
import random

import numpy as np
import pytest

from laminar.data.dataset import DatasetError, load_jsonl
from laminar.data.tasks import ReverseTask, TaskCodec, build_tokenizer, save_tokenizer
from laminar.rewards.reverse import reverse_reward


def test_response_lengths_are_long_tailed():
    task = ReverseTask()
    rng = random.Random(0)
    lengths = np.array([len(TaskCodec().encode_answer(task.make_row(rng)["answer"])) for _ in range(20000)])
    assert np.percentile(lengths, 99) >= 5 * np.median(lengths)
    assert lengths.max() <= task.max_response_tokens()


def test_codec_round_trip_and_reward_of_the_true_answer(tmp_path):
    codec = TaskCodec()
    row = ReverseTask().rows(1, seed=3)[0]
    ids = codec.encode_prompt(row["prompt"])
    assert ids[0] == codec.bos_id and codec.tokenizer.convert_tokens_to_ids("=") == ids[-1]
    answer = codec.encode_answer(row["answer"])
    assert answer[-1] == codec.eos_id
    assert reverse_reward(codec.decode(answer + [5, 6]), row) == 1.0  # text after EOS is ignored
    save_tokenizer(build_tokenizer(), tmp_path)
    assert TaskCodec.from_dir(tmp_path).encode_prompt(row["prompt"]) == ids


def test_jsonl_rows_are_checked_by_row_and_field(tmp_path):
    p = tmp_path / "d.jsonl"
    p.write_text(json.dumps({"prompt": "1 2 ="}) + "\n\n" + json.dumps({"prompt": ""}) + "\n")
    with pytest.raises(DatasetError, match="row 2: field 'prompt' is empty"):
        load_jsonl(p)
    p.write_text('{"prompt": "1 ="}\n{"prompt": \n')
    with pytest.raises(DatasetError, match="row 1: not valid JSON"):
        load_jsonl(p)
    with pytest.raises(FileNotFoundError, match="does not exist"):
        load_jsonl(tmp_path / "missing.jsonl")
    p.write_text('{"prompt": "1 ="}\n')
    assert load_jsonl(p) == [{"prompt": "1 =", "data_source": "", "ground_truth": None, "extra_info": {}}]
