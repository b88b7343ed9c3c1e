"""Datasets on disk: jsonl, verl's parquet and `datasets` directories load to the same normalised rows, and every
bad row stops the run before anything starts with one line naming the file, the row and the field."""

import json

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from datasets import Dataset, DatasetDict

from laminar.cli import main
from laminar.configure import load_config
from laminar.data.dataset import (
    DatasetError,
    check_ground_truths,
    check_prompts,
    load_rows,
    normalise_row,
    read_dataset_files,
    val_rows,
)
from laminar.tasks.rows import train_rows
from tests.realmodel import write_real_model_dir

VERL_ROWS = [  # verl's data preprocessing writes rows of this shape (gsm8k.py)
    {
        "data_source": "openai/gsm8k",
        "prompt": [
            {"role": "user", "content": "Natalia sold 48 clips in April and half as many in May. Total?"}
        ],
        "ability": "math",
        "reward_model": {"style": "rule", "ground_truth": "72"},
        "extra_info": {"split": "train", "index": 0},
    },
    {
        "data_source": "openai/gsm8k",
        "prompt": [
            {"role": "system", "content": "Answer briefly."},
            {"role": "user", "content": "Weng earns $12 an hour. How much for 50 minutes?"},
        ],
        "ability": "math",
        "reward_model": {"style": "rule", "ground_truth": "10"},
        "extra_info": {"split": "train", "index": 1},
    },
]
NORMALISED = [
    {
        "prompt": r["prompt"],
        "data_source": "openai/gsm8k",
        "ground_truth": r["reward_model"]["ground_truth"],
        "extra_info": r["extra_info"],
        "ability": "math",  # the row's other fields, as they are
        "reward_model": r["reward_model"],
    }
    for r in VERL_ROWS
]


def write_jsonl(path, rows):
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def test_jsonl_parquet_and_datasets_directories_load_to_the_same_rows(tmp_path):
    jsonl = write_jsonl(tmp_path / "d.jsonl", VERL_ROWS)
    parquet = tmp_path / "d.parquet"
    pq.write_table(pa.Table.from_pylist(VERL_ROWS), parquet)
    Dataset.from_list(VERL_ROWS).save_to_disk(str(tmp_path / "ds"))
    held_out = [{**VERL_ROWS[0], "reward_model": {"style": "rule", "ground_truth": "5"}}]
    DatasetDict({"train": Dataset.from_list(VERL_ROWS), "test": Dataset.from_list(held_out)}).save_to_disk(
        str(tmp_path / "dd")
    )
    for source in (jsonl, parquet, tmp_path / "ds", tmp_path / "dd"):
        assert load_rows(str(source)) == NORMALISED, source
    assert load_rows([str(jsonl), str(parquet)]) == NORMALISED * 2
    assert [r["ground_truth"] for r in load_rows(str(tmp_path / "dd"), split="test")] == ["5"]


def test_plain_rows_keep_their_answer_and_a_custom_prompt_key(tmp_path):
    p = write_jsonl(tmp_path / "q.jsonl", [{"question": "What is 2 + 3?", "answer": 5}])
    assert load_rows(str(p), prompt_key="question") == [
        {"prompt": "What is 2 + 3?", "data_source": "", "ground_truth": "5", "answer": 5, "extra_info": {}}
    ]


def test_the_run_takes_train_and_val_rows_from_the_data_section(tmp_path):
    DatasetDict(
        {"train": Dataset.from_list(VERL_ROWS), "test": Dataset.from_list(VERL_ROWS[:1])}
    ).save_to_disk(str(tmp_path / "dd"))
    cfg = load_config(None, [f"data.train_files={tmp_path / 'dd'}", f"data.val_files=[{tmp_path / 'dd'}]"])
    assert train_rows(cfg) == NORMALISED and val_rows(cfg) == NORMALISED[:1]
    demo = load_config(None, ["task.num_prompts=3"])
    assert (
        val_rows(demo) == []
        and [set(r) for r in train_rows(demo)]
        == [{"prompt", "data_source", "ground_truth", "answer", "extra_info"}] * 3
    )


BAD_ROWS = [
    ('{"question": "x"}', "row 1: missing field 'prompt'"),
    (
        '{"prompt": 3}',
        "row 1: field 'prompt' must be a string or a list of {role, content} messages, got int",
    ),
    ('{"prompt": "  "}', "row 1: field 'prompt' is empty"),
    ('{"prompt": []}', "row 1: field 'prompt' is an empty list"),
    (
        '{"prompt": [{"role": "robot", "content": "hi"}]}',
        "row 1: field 'prompt[0].role' is 'robot'; expected one of",
    ),
    (
        '{"prompt": [{"role": "user", "content": ["hi"]}]}',
        "row 1: field 'prompt[0].content' must be a string, got list",
    ),
    ('{"prompt": ["hi"]}', "row 1: field 'prompt[0]' must be a {role, content} message, got str"),
    (
        '{"prompt": [{"role": "user", "content": ""}]}',
        "row 1: field 'prompt' is empty: every message's content",
    ),
    (
        '{"prompt": "x", "reward_model": {"ground_truth": [1]}}',
        "row 1: field 'reward_model.ground_truth' must be",
    ),
    ('{"prompt": "x", "extra_info": 3}', "row 1: field 'extra_info' must be an object"),
    ('{"prompt": "x", "data_source": 3}', "row 1: field 'data_source' must be a string"),
    ('{"prompt": "x"', "row 1: not valid JSON"),
    ("[1, 2]", "row 1: expected an object"),
]


@pytest.mark.parametrize(("line", "message"), BAD_ROWS)
def test_each_bad_row_is_named_by_file_row_and_field(tmp_path, line, message):
    p = tmp_path / "bad.jsonl"
    p.write_text('{"prompt": "fine"}\n' + line + "\n")
    with pytest.raises(DatasetError) as e:
        load_rows(str(p))
    assert str(e.value).startswith(f"{p} row 1: ") and message in str(e.value)


def test_unreadable_files_are_named(tmp_path):
    (tmp_path / "broken.parquet").write_bytes(b"PAR1 not really")
    with pytest.raises(DatasetError, match=r"broken.parquet: unreadable parquet file"):
        load_rows(str(tmp_path / "broken.parquet"))
    (tmp_path / "notes.csv").write_text("prompt\nx\n")
    with pytest.raises(DatasetError, match=r"notes.csv: unknown format '.csv'; expected .jsonl, .parquet"):
        load_rows(str(tmp_path / "notes.csv"))
    (tmp_path / "empty_dir").mkdir()
    with pytest.raises(DatasetError, match=r"empty_dir: not a dataset directory"):
        load_rows(str(tmp_path / "empty_dir"))
    DatasetDict({"a": Dataset.from_list(VERL_ROWS), "b": Dataset.from_list(VERL_ROWS)}).save_to_disk(
        str(tmp_path / "dd")
    )
    with pytest.raises(DatasetError, match=r"splits \['a', 'b'\] and none of \['train'\]"):
        load_rows(str(tmp_path / "dd"))


@pytest.fixture(scope="module")
def short_model(tmp_path_factory):
    """A chat model whose context is 64 tokens, so a long prompt is easy to write."""
    return write_real_model_dir(tmp_path_factory.mktemp("short"), "chatml", max_positions=64)


def test_a_prompt_longer_than_the_context_once_templated_is_named(tmp_path, short_model):
    ok = {"prompt": "What is 12 + 30?"}
    p = write_jsonl(tmp_path / "long.jsonl", [ok, ok, {"prompt": "What is 12 + 30? " * 20}])
    cfg = load_config(None, [f"model.path={short_model}", f"data.train_files={p}"])
    with pytest.raises(
        DatasetError,
        match=r"long.jsonl row 2: field 'prompt' is \d+ tokens once encoded; the model's context",
    ):
        check_prompts(read_dataset_files(cfg), cfg, short_model)
    q = write_jsonl(tmp_path / "fits.jsonl", [ok])
    cfg = load_config(
        None,
        [f"model.path={short_model}", f"data.train_files={q}", "rollout.kv_blocks=4", "rollout.block_size=4"],
    )
    with pytest.raises(DatasetError, match=r"fits.jsonl row 0: .* the replicas' KV cache .* is 16 tokens"):
        check_prompts(read_dataset_files(cfg), cfg, short_model)


def test_laminar_train_stops_on_a_bad_row_before_anything_starts(tmp_path, capsys, short_model):
    rows = [VERL_ROWS[0], {**VERL_ROWS[1], "prompt": [{"role": "user", "content": None}]}]
    pq.write_table(pa.Table.from_pylist(rows), tmp_path / "bad.parquet")
    long = write_jsonl(tmp_path / "long.jsonl", [{"prompt": "What is 12 + 30? " * 20, "ground_truth": "42"}])
    cases = [
        (
            [f"data.train_files={tmp_path / 'bad.parquet'}"],
            "bad.parquet row 1: field 'prompt[0].content' must be",
        ),
        (
            [f"model.path={short_model}", f"data.val_files={long}"],
            "long.jsonl row 0: field 'prompt' is",
        ),
        (
            [f"model.path={short_model}", "data.chat_template=never", "data.train_files=" + str(long)],
            "tokens once",
        ),
    ]
    for overrides, message in cases:
        assert main(["train", *overrides, f"run.out={tmp_path / 'run'}"]) == 2
        err = capsys.readouterr().err
        assert message in err and len(err.strip().splitlines()) == 1, err
        assert not (tmp_path / "run").exists()


def test_a_top_level_ground_truth_is_kept_and_the_arith_task_rows_carry_theirs():
    row = normalise_row({"prompt": "1 + 1?", "ground_truth": 2}, 0, "rows")
    assert row["ground_truth"] == "2"
    cfg = load_config(None, ["task.name=arith", "task.num_prompts=5"])
    rows = train_rows(cfg)
    assert len(rows) == 5 and all(r["ground_truth"] and r["data_source"] == "arith" for r in rows)


def test_a_row_without_a_ground_truth_is_found_when_the_data_loads(tmp_path):
    rows = [VERL_ROWS[0], {"prompt": "What is 2 + 3?", "question_id": 7}]
    files = read_dataset_files(
        load_config(None, [f"data.train_files={write_jsonl(tmp_path / 'd.jsonl', rows)}"])
    )
    with pytest.raises(DatasetError) as e:
        check_ground_truths(files, "laminar.rewards.math:default_score")
    message = str(e.value)
    assert message.startswith(f"{tmp_path / 'd.jsonl'} row 1: no ground truth: expected the field ")
    assert "'reward_model.ground_truth' (verl's), 'ground_truth' or 'answer'" in message
    assert "(the row has ['prompt', 'question_id'])" in message and "\n" not in message
    check_ground_truths(files[:0], "r")  # no files: nothing to check


def test_own_rows_without_a_ground_truth_stop_laminar_train_in_one_line_before_any_model_loads(
    tmp_path, capsys, monkeypatch
):
    """Own data and no task.reward: the math reward scores it, so every row, held-out ones too, needs a truth."""
    import time

    monkeypatch.setattr("laminar.preflight.resolve_model", lambda cfg: pytest.fail("a model was loaded"))
    good = write_jsonl(tmp_path / "train.jsonl", VERL_ROWS)
    val = write_jsonl(tmp_path / "val.jsonl", [VERL_ROWS[0], VERL_ROWS[1], {"prompt": "What is 2 + 3?"}])
    t0 = time.monotonic()
    code = main(
        ["train", f"data.train_files={good}", f"data.val_files=[{val}]", f"run.out={tmp_path / 'run'}"]
    )
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and len(err) == 1 and time.monotonic() - t0 < 5, err
    assert err[0].startswith(f"laminar train: bad configuration: {val} row 2: no ground truth")
    assert not (tmp_path / "run").exists()
