"""Dataset rows: loaded from files or made by a task, normalised to one schema and checked once, on the driver,
so a bad row stops the run before any actor starts, naming the file, the row and the field.

Files are `.jsonl` (one object a line), `.parquet` (verl's format: `prompt` as chat messages, `data_source`,
`reward_model: {ground_truth, style}`, `extra_info`) or a directory written by `datasets`' `save_to_disk`.
A built-in task's rows are normalised here too (`laminar.tasks.rows`). Every row becomes

    {"prompt": str | [{"role", "content"}], "data_source": str, "ground_truth": str | None,
     "extra_info": dict, "answer": ... (only when the row has one)}

and that dict is the `row` a reward function gets. Rows are counted from 0 (a JSONL file's line index).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from laminar.data.codec import ROLES

SCHEMA = '{"prompt": a string or a list of {role, content} messages, ...}'


class DatasetError(ValueError):
    """A dataset row is malformed; the message names the file, the row and the field."""


def _fail(source: str, i: int, message: str) -> DatasetError:
    return DatasetError(f"{source} row {i}: {message}")


def check_prompt(prompt: Any, i: int, source: str, key: str = "prompt") -> str | list[dict[str, str]]:
    """A non-empty string, or a non-empty list of {role, content} messages with known roles and string
    content (other message keys are not kept)."""
    if isinstance(prompt, str):
        if not prompt.strip():
            raise _fail(source, i, f"field {key!r} is empty; expected the prompt's text")
        return prompt
    if not isinstance(prompt, list | tuple):
        raise _fail(
            source,
            i,
            f"field {key!r} must be a string or a list of {{role, content}} messages, got "
            f"{type(prompt).__name__} ({prompt!r:.60})",
        )
    if not prompt:
        raise _fail(
            source, i, f"field {key!r} is an empty list; expected at least one {{role, content}} message"
        )
    chat = []
    for j, m in enumerate(prompt):
        where = f"{key}[{j}]"
        if not isinstance(m, dict):
            raise _fail(
                source, i, f"field {where!r} must be a {{role, content}} message, got {type(m).__name__}"
            )
        if m.get("role") not in ROLES:
            raise _fail(
                source,
                i,
                f"field {where + '.role'!r} is {m.get('role')!r}; expected one of {', '.join(ROLES)}",
            )
        if not isinstance(m.get("content"), str):
            raise _fail(
                source,
                i,
                f"field {where + '.content'!r} must be a string, got {type(m.get('content')).__name__} "
                f"({m.get('content')!r:.60})",
            )
        chat.append({"role": m["role"], "content": m["content"]})
    if not any(m["content"].strip() for m in chat):
        raise _fail(source, i, f"field {key!r} is empty: every message's content is blank")
    return chat


def normalise_row(raw: Any, i: int, source: str, prompt_key: str = "prompt") -> dict[str, Any]:
    """One row in the schema above; its other fields are carried as they are."""
    if not isinstance(raw, dict):
        raise _fail(source, i, f"expected an object {SCHEMA}, got {type(raw).__name__}")
    if prompt_key not in raw:
        raise _fail(
            source,
            i,
            f"missing field {prompt_key!r} (has {sorted(raw)}); expected a string or a list of "
            "{role, content} messages (data.prompt_key names the field)",
        )
    row: dict[str, Any] = {"prompt": check_prompt(raw[prompt_key], i, source, prompt_key)}
    source_name = raw.get("data_source")
    if source_name is not None and not isinstance(source_name, str):
        raise _fail(source, i, f"field 'data_source' must be a string, got {type(source_name).__name__}")
    row["data_source"] = source_name or ""
    reward_model = raw.get("reward_model")
    if reward_model is not None and not isinstance(reward_model, dict):
        raise _fail(
            source,
            i,
            f"field 'reward_model' must be an object {{ground_truth, style}}, got {type(reward_model).__name__}",
        )
    truth, field = (reward_model or {}).get("ground_truth"), "reward_model.ground_truth"
    if truth is None:
        truth, field = raw.get("ground_truth"), "ground_truth"
    if truth is None:
        truth, field = raw.get("answer"), "answer"
    if truth is not None and (isinstance(truth, bool) or not isinstance(truth, str | int | float)):
        raise _fail(
            source,
            i,
            f"field {field!r} must be a string or a number, got {type(truth).__name__} ({truth!r:.60})",
        )
    row["ground_truth"] = None if truth is None else str(truth)
    if "answer" in raw:
        row["answer"] = raw["answer"]
    extra = raw.get("extra_info")
    if extra is not None and not isinstance(extra, dict):
        raise _fail(source, i, f"field 'extra_info' must be an object, got {type(extra).__name__}")
    row["extra_info"] = extra or {}
    # the row's other fields stay as they are: a custom reward may read them (verl puts them in extra_info)
    row.update({k: v for k, v in raw.items() if k not in row and k != prompt_key})
    return row


def validate_rows(rows: list[dict[str, Any]], source: str = "dataset") -> list[dict[str, Any]]:
    """Rows handed to the prompt pool directly (tests, built-in tasks): each has a usable prompt."""
    for i, row in enumerate(rows):
        if not isinstance(row, dict):
            raise _fail(source, i, f"expected an object {SCHEMA}, got {type(row).__name__}")
        if "prompt" not in row:
            raise _fail(source, i, f"missing field 'prompt' (has {sorted(row)}); expected {SCHEMA}")
        check_prompt(row["prompt"], i, source)
    return rows


# ---- files -------------------------------------------------------------------------------------------------
def _read_jsonl(path: Path) -> list[tuple[int, Any]]:
    out = []
    for i, line in enumerate(path.read_text().splitlines()):
        if not line.strip():
            continue
        try:
            out.append((i, json.loads(line)))
        except json.JSONDecodeError as e:
            raise DatasetError(f"{path} row {i}: not valid JSON ({e.msg} at column {e.colno})") from e
    return out


def _read_parquet(path: Path) -> list[tuple[int, Any]]:
    import pyarrow as pa
    import pyarrow.parquet as pq

    try:
        table = pq.read_table(path)
    except (pa.ArrowException, OSError) as e:
        raise DatasetError(f"{path}: unreadable parquet file ({str(e).splitlines()[0]})") from e
    return list(enumerate(table.to_pylist()))


def _read_saved_dataset(path: Path, split: str) -> list[tuple[int, Any]]:
    """A `datasets` directory: one Dataset, or a DatasetDict whose `split` (train, or test/validation for
    evaluation) is taken; a DatasetDict of one split gives that split."""
    from datasets import DatasetDict, load_from_disk

    try:
        ds = load_from_disk(str(path))
    except (FileNotFoundError, ValueError, OSError) as e:
        raise DatasetError(
            f"{path}: not a dataset directory written by datasets' save_to_disk ({str(e).splitlines()[0]})"
        ) from e
    if isinstance(ds, DatasetDict):
        wanted = ("train",) if split == "train" else ("test", "validation", "val")
        name = next((s for s in wanted if s in ds), None)
        if name is None and len(ds) == 1:
            name = next(iter(ds))
        if name is None:
            raise DatasetError(f"{path}: a DatasetDict with splits {sorted(ds)} and none of {list(wanted)}")
        ds = ds[name]
    return list(enumerate(ds.to_list()))


def _load_numbered(
    path: str | Path, prompt_key: str = "prompt", split: str = "train"
) -> list[tuple[int, dict[str, Any]]]:
    path = Path(path)
    if not path.exists():
        raise FileNotFoundError(
            f"dataset {path} does not exist (expected a .jsonl file, a .parquet file or a datasets directory)"
        )
    if path.is_dir():
        raws = _read_saved_dataset(path, split)
    elif path.suffix == ".jsonl":
        raws = _read_jsonl(path)
    elif path.suffix == ".parquet":
        raws = _read_parquet(path)
    else:
        raise DatasetError(
            f"dataset {path}: unknown format {path.suffix!r}; expected .jsonl, .parquet or a directory written "
            "by datasets' save_to_disk"
        )
    if not raws:
        raise DatasetError(
            f"dataset {path} has no rows (the file is empty or blank); expected rows with the field {prompt_key!r}"
        )
    return [(i, normalise_row(raw, i, str(path), prompt_key)) for i, raw in raws]


def load_file(path: str | Path, prompt_key: str = "prompt", split: str = "train") -> list[dict[str, Any]]:
    """One file's rows, normalised; an empty file is an error too."""
    return [row for _, row in _load_numbered(path, prompt_key, split)]


def load_rows(
    paths: list[str] | str, prompt_key: str = "prompt", split: str = "train"
) -> list[dict[str, Any]]:
    """The rows of every file, in order: the one entry point for datasets on disk."""
    paths = [paths] if isinstance(paths, str | Path) else paths
    return [row for p in paths for row in load_file(p, prompt_key, split)]


# ---- the run's files ----------------------------------------------------------------------------------------
def val_rows(cfg: Any) -> list[dict[str, Any]]:
    """The held-out rows of `data.val_files` (a DatasetDict gives its test split), or [] when none are set."""
    d = cfg.data
    return load_rows(d.val_files, d.prompt_key, "test") if d.val_files else []


NumberedRows = list[tuple[int, dict[str, Any]]]


def read_dataset_files(cfg: Any) -> list[tuple[str, NumberedRows]]:
    """Every data file of the run (train, val, or `task.name=FILE.jsonl`), each row normalised with its number."""
    d = cfg.data
    files = [(p, "train") for p in d.train_files] + [(p, "test") for p in d.val_files]
    if not d.train_files and Path(cfg.task.name).suffix == ".jsonl":
        files.append((cfg.task.name, "train"))
    return [(str(p), _load_numbered(p, d.prompt_key, split)) for p, split in files]


def check_ground_truths(files: list[tuple[str, NumberedRows]], reward: str) -> None:
    """Every row of every file has a ground truth, for a reward that compares with one (the math reward): a row
    without one is found here, on the driver, not each time it is scored."""
    for path, rows in files:
        for i, row in rows:
            if row.get("ground_truth") is None:
                has = sorted(k for k, v in row.items() if v not in (None, "", {}))
                raise _fail(
                    path,
                    i,
                    "no ground truth: expected the field 'reward_model.ground_truth' (verl's), 'ground_truth' or "
                    f"'answer' (the row has {has}); the reward {reward} compares the answer with it (set "
                    "task.reward for rows scored another way)",
                )


def check_prompts(files: list[tuple[str, NumberedRows]], cfg: Any, model_dir: str | Path) -> None:
    """On the driver, before any actor starts: every prompt encodes with the model's tokenizer (its chat
    template applies) and fits both the model's context and the replicas' KV cache, with room for a response."""
    from laminar.data.codec import TaskCodec
    from laminar.engine.config import ModelConfig

    if not files:
        return
    codec = TaskCodec.from_config(model_dir, cfg)
    context = ModelConfig.from_dir(model_dir).max_position_embeddings
    kv = cfg.rollout.kv_blocks * cfg.rollout.block_size
    limit, what = min(
        (context, f"the model's context (max_position_embeddings in {Path(model_dir) / 'config.json'})"),
        (kv, "the replicas' KV cache (rollout.kv_blocks x rollout.block_size)"),
    )
    for path, rows in files:
        for i, row in rows:
            try:
                n = len(codec.encode_prompt(row["prompt"]))
            except Exception as e:  # noqa: BLE001 - a template or tokenizer failure, named by row
                raise _fail(path, i, f"field 'prompt' does not encode ({str(e).splitlines()[0]})") from e
            if n >= limit:
                raise _fail(
                    path,
                    i,
                    f"field 'prompt' is {n} tokens once encoded; {what} is {limit} tokens, so a prompt must be "
                    f"at most {limit - 1}",
                )
