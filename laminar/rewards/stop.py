"""A reward that fails on every row must stop the run, not train it on zeros.

`loader.py` turns each failed call into 0.0 and a record, so one bad row never costs a group. A reward that fails
everywhere (an import missing inside the function, a judge that is down, NaN for every answer) would then train
to the end on nothing. Two checks: `dry_run`, on the driver before any actor starts, calls the reward on a few
dataset rows; `FailingRewards`, as the trainer takes groups, stops the run once every reward of the last
`task.reward_fail_groups` groups failed."""

from __future__ import annotations

import threading
from dataclasses import dataclass
from typing import Any

from laminar.data.records import Trajectory
from laminar.rewards.loader import RewardLoadError, check_reward, load_reward

DRY_RUN_ROWS = 4
DRY_RUN_TIMEOUT_S = 10.0  # at most (task.reward_timeout_s when shorter); a slower call is not judged


class RewardFailure(RuntimeError):
    """Every reward of the last `task.reward_fail_groups` groups failed."""


# verl's default for its own datasets: the answer format chosen by each row's data_source
MATH_REWARD = "laminar.rewards.math:default_score"


@dataclass(frozen=True)
class RewardChoice:
    """The reward a run scores with, and why (printed at the start, kept in `summary.json`)."""

    path: str
    why: str


def choose_reward(cfg: Any) -> RewardChoice:
    """`task.reward`, else for the user's own rows (`data.train_files`, `task.name=FILE.jsonl`) the math reward,
    as verl scores rows by their `data_source` (a built-in task other than the demo, named beside the files,
    keeps its own), else the built-in task's own. The one place a run's reward is picked."""
    from laminar.tasks import DEMO, TASKS

    t = cfg.task
    if t.reward:
        return RewardChoice(t.reward, "task.reward")
    task = TASKS.get(t.name)  # None: task.name is a .jsonl file
    files = "data.train_files" if cfg.data.train_files else "" if task is not None else f"task.name={t.name}"
    if files and (task is None or task.name == DEMO):
        return RewardChoice(
            MATH_REWARD,
            f"the rows are your own ({files}) and task.reward is empty: the math reward, the answer format "
            "chosen by each row's data_source as verl's default_compute_score does; every row needs a ground "
            "truth",
        )
    return RewardChoice(TASKS[t.name].reward, f"the built-in {t.name} task's own, as task.reward is empty")


def reward_path(cfg: Any) -> str:
    """The dotted path of `choose_reward(cfg)`."""
    return choose_reward(cfg).path


def dry_run(path: str, rows: list[dict[str, Any]], timeout_s: float = DRY_RUN_TIMEOUT_S) -> int:
    """Call the reward in this process on `rows` (as a replica would pass them), each with its ground truth as
    the response, or an empty one where it has none. Raises `RewardLoadError` when every call failed (raised or
    returned no finite number): the run would score every trajectory 0. A score of 0 is not a failure, and a
    call still running after `timeout_s` is not judged. Returns how many calls were judged."""
    fn = load_reward(path)
    results: list[tuple[dict[str, Any], str | None, str]] = []

    def calls() -> None:
        for row in rows:
            try:
                value = fn(row.get("ground_truth") or "", row)
            except BaseException as e:  # noqa: BLE001 - any failure of user code is the verdict, as in loader.py
                results.append((row, "raised", f"{type(e).__name__}: {e}"))
                continue
            _, kind, message = check_reward(value)
            results.append((row, kind, message))

    worker = threading.Thread(target=calls, name="reward-dry-run", daemon=True)  # a hung call is left behind
    worker.start()
    worker.join(timeout_s)
    judged = list(results)
    if judged and all(kind is not None for _, kind, _ in judged):
        row, kind, message = judged[0]
        raise RewardLoadError(
            f"reward function {path} failed on all {len(judged)} dataset rows tried before the start (each called "
            f"with its ground truth as the response), e.g. row {row.get('row')}: {kind}: "
            f"{(message.splitlines() or [''])[0]}"
        )
    return len(judged)


def dry_run_rows(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The first rows as a replica's reward sees them (the prompt pool adds the row's number and epoch)."""
    return [{**row, "row": i, "epoch": 0} for i, row in enumerate(rows[:DRY_RUN_ROWS])]


@dataclass
class FailingRewards:
    """The stop rule, over groups in the order the trainer takes them: a group counts when every one of its
    rewards failed (any kind: raised, timed out, crashed, not a number, not finite); a group with one reward
    that did not resets the count."""

    limit: int  # task.reward_fail_groups; 0: never stop
    streak: int = 0
    # the last failure seen, as the scorer noted it: the function, the row and the error
    last: str = ""

    def see(self, groups: list[list[Trajectory]]) -> None:
        for group in groups:
            errors = [t.meta.get("reward_error") for t in group]
            if errors and all(errors):
                self.streak, self.last = self.streak + 1, errors[-1]
            else:
                self.streak = 0
        if self.limit and self.streak >= self.limit:
            raise RewardFailure(
                f"every reward of the last {self.streak} groups failed (task.reward_fail_groups="
                f"{self.limit}); the last: {(self.last.splitlines() or [''])[0]}"
            )
