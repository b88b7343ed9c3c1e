"""What a person watching finds without opening TensorBoard: each evaluation's held-out accuracy (per level) on the
console and in `summary.json`, one line at the end, and each trained response as text in `trajectories.jsonl`."""

from __future__ import annotations

import io
import json

from laminar.config import EvalConfig
from laminar.data.records import Trajectory
from laminar.runtime import evaluation
from laminar.runtime.evaluation import Evaluator, eval_summary
from laminar.tasks.reverse import demo_codec
from laminar.telemetry.console import Console, eval_line, summary_line
from laminar.telemetry.recorder import Recorder, write_trajectories
from laminar.telemetry.tracking import scalars


class FakeManager:
    class submit_eval:  # noqa: N801 - stands for an actor method
        @staticmethod
        def remote(groups, version):
            return None


def sample(gid: int, reward: float) -> Trajectory:
    return Trajectory(f"{gid}:0", gid, 0, [1], [2, 3], [0.0, 0.0], version=0, reward=reward)


def test_an_evaluation_reports_accuracy_per_level_on_the_console_and_in_the_summary(tmp_path, monkeypatch):
    monkeypatch.setattr(evaluation.ray, "get", lambda ref, timeout=None: None)
    stream = io.StringIO()
    recorder = Recorder(tmp_path, t0=0.0, console=Console(stream=stream))
    rows = [{"prompt": f"q{i}", "extra_info": {"level": 1 + i % 2}} for i in range(4)]
    ev = Evaluator(
        EvalConfig(every=2), rows, lambda p: [1], FakeManager(), None, recorder, max_new_tokens=8, timeout_s=5
    )
    for version, rewards in ((0, [1.0, 0.0, 0.0, 0.0]), (2, [1.0, 1.0, 1.0, 0.0])):
        ev.submit(version)
        r = ev.pending.pop()
        r.samples = {g: [sample(g, x)] for g, x in zip(r.group_ids, rewards)}
        ev._log(r)
    recorder.close()
    first, last = ev.results
    assert first["accuracy"] == 0.25 and first["accuracy_by_level"] == {"1": 0.5, "2": 0.0}
    assert last["accuracy"] == 0.75 and last["accuracy_by_level"] == {"1": 1.0, "2": 0.5}
    lines = stream.getvalue().splitlines()
    assert lines == [
        "laminar: eval of version 0: held-out accuracy 0.250 (level 1 0.500, level 2 0.000) over 4 samples of 4 "
        "prompts, mean response 2.0 tokens",
        "laminar: eval of version 2: held-out accuracy 0.750 (level 1 1.000, level 2 0.500) over 4 samples of 4 "
        "prompts, mean response 2.0 tokens",
    ]
    summary = eval_summary(recorder.records, [0.5])
    assert summary["first"]["accuracy_by_level"] == {"1": 0.5, "2": 0.0} and summary["last"]["version"] == 2
    assert summary_line(summary) == (
        "held-out accuracy 0.250 (level 1 0.500, level 2 0.000) at version 0 -> 0.750 (level 1 1.000, level 2 "
        "0.500) at version 2 (best 0.750 at version 2; 2 evaluations)"
    )
    assert scalars(recorder.records[-1])["eval/accuracy_by_level/2"] == 0.5  # one TensorBoard curve a level


def test_rows_without_levels_report_the_accuracy_alone():
    record = {"version": 3, "accuracy": 0.5, "samples": 8, "prompts": 8, "response_len_mean": 12.25}
    assert eval_line(record) == (
        "eval of version 3: held-out accuracy 0.500 over 8 samples of 8 prompts, mean response 12.2 tokens"
    )


def test_trajectories_keep_the_response_text_the_reward_read(tmp_path):
    codec = demo_codec()
    t = Trajectory("4:1", 4, 1, [1], codec.encode_answer("3 2 1"), [0.0] * 4, version=0, reward=1.0)
    write_trajectories(tmp_path, [[t]], 1, text=codec.response_text)
    write_trajectories(tmp_path, [[t]], 2)  # without a codec: token ids only, as before
    with_text, ids_only = [
        json.loads(line) for line in (tmp_path / "trajectories.jsonl").read_text().splitlines()
    ]
    assert with_text["response_text"] == "3 2 1" == codec.decode(t.response_ids)
    assert with_text["response_ids"] == t.response_ids and "response_text" not in ids_only
