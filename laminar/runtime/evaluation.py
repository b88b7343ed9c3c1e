"""Evaluation on the held-out set while training goes on: every `eval.every` trainer steps the driver hands the
held-out prompts to the rollout replicas (through the manager, ahead of training work, to every replica with the
new weights), collects their scored samples from the buffer actor as they arrive, and logs one `eval` record per
evaluated version: accuracy (mean of samples at or above `eval.correct_at`), per level where the rows have one
(`extra_info.level`: the built-in `arith` and `chain` tasks), pass@n, mean reward and mean response length, with
the wall time the weights were published and the time the evaluation finished. Each is also one console line.

Evaluation groups have negative ids (`records.is_eval`): they are never trained on, never recovered after a
replica dies (an incomplete evaluation is reported as such at the end) and never counted by the trajectory
audit."""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any

import ray

from laminar.config import EvalConfig
from laminar.data.records import PromptGroup


@dataclass
class Round:
    version: int
    t_version: float  # wall time (seconds since the run's start) at which these weights were published
    group_ids: list[int]
    samples: dict[int, list[Any]] = field(default_factory=dict)
    levels: dict[int, Any] = field(default_factory=dict)  # group id -> its row's level, where it has one


def level_of(row: dict[str, Any]) -> Any:
    """A row's difficulty level (`extra_info.level`, as the built-in tasks write it), or None."""
    extra = row.get("extra_info")
    return extra.get("level") if isinstance(extra, dict) else None


class Evaluator:
    def __init__(
        self,
        cfg: EvalConfig,
        rows: list[dict[str, Any]],
        encode: Any,
        manager: Any,
        buffer: Any,
        recorder: Any,
        max_new_tokens: int,
        timeout_s: float,
    ) -> None:
        if not rows:
            raise ValueError("eval.every is set but there is no held-out set for this task (data.val_files)")
        self.cfg, self.manager, self.buffer, self.recorder, self.timeout_s = (
            cfg,
            manager,
            buffer,
            recorder,
            timeout_s,
        )
        self.prompts = [(row, encode(row["prompt"])) for row in rows[: cfg.num_prompts]]
        self.sampling = {
            "temperature": cfg.temperature,
            "max_new_tokens": cfg.max_new_tokens or max_new_tokens,
            "top_p": 1.0,
            "top_k": 0,
        }
        self.next_id = -1
        self.pending: list[Round] = []
        self.results: list[dict[str, Any]] = []

    def due(self, version: int) -> bool:
        return self.cfg.every > 0 and version % self.cfg.every == 0

    def submit(self, version: int) -> None:
        """Evaluate the weights of `version` (or newer, if a replica has moved on before it starts)."""
        groups, levels = [], {}
        for row, ids in self.prompts:
            meta = {**row, "sampling": self.sampling}
            groups.append(PromptGroup(self.next_id, ids, n=self.cfg.n, meta=meta))
            if level_of(row) is not None:
                levels[self.next_id] = level_of(row)
            self.next_id -= 1
        t = time.time() - self.recorder.t0
        self.pending.append(Round(version, t, [g.group_id for g in groups], levels=levels))
        ray.get(self.manager.submit_eval.remote(groups, version), timeout=self.timeout_s)

    def poll(self) -> None:
        """Collect what has arrived; log every evaluation that is complete."""
        if not self.pending:
            return
        wanted = [g for r in self.pending for g in r.group_ids]
        have = {g: len(r.samples[g]) for r in self.pending for g in r.group_ids if g in r.samples}
        # what has arrived past what we hold: asked again (the buffer lost meanwhile), the same answer
        arrived = ray.get(self.buffer.take_eval.remote(wanted, have), timeout=self.timeout_s)
        for r in self.pending:
            for g in r.group_ids:
                r.samples.setdefault(g, []).extend(arrived.get(g, []))
        while self.pending and self._complete(self.pending[0]):
            self._log(self.pending.pop(0))

    def finish(self) -> None:
        """At the end of the run: wait (bounded) for evaluations still running, log them, and note any that
        did not complete (a replica that died took its evaluation samples with it)."""
        deadline = time.monotonic() + self.cfg.final_timeout_s
        while self.pending and time.monotonic() < deadline:
            self.poll()
            if self.pending:
                time.sleep(0.2)
        for r in self.pending:
            got = sum(len(s) for s in r.samples.values())
            self.recorder.log(
                "eval_incomplete", version=r.version, samples=got, expected=len(r.group_ids) * self.cfg.n
            )
        self.pending = []

    def _complete(self, r: Round) -> bool:
        return all(len(r.samples.get(g, [])) >= self.cfg.n for g in r.group_ids)

    def _log(self, r: Round) -> None:
        correct_at = self.cfg.correct_at
        samples = [t for g in r.group_ids for t in r.samples[g]]
        hits = [t.reward >= correct_at for t in samples]
        by_prompt = [any(t.reward >= correct_at for t in r.samples[g]) for g in r.group_ids]
        record = {
            "version": r.version,
            "generated_at": sorted({t.version for t in samples}),
            "t_version": round(r.t_version, 3),
            "t_done": round(time.time() - self.recorder.t0, 3),
            "prompts": len(r.group_ids),
            "samples": len(samples),
            "accuracy": sum(hits) / len(hits),
            f"pass@{self.cfg.n}": sum(by_prompt) / len(by_prompt),
            "reward_mean": sum(t.reward for t in samples) / len(samples),
            "response_len_mean": sum(len(t.response_ids) for t in samples) / len(samples),
            "truncated_frac": sum(t.finish_reason == "length" for t in samples) / len(samples),
        }
        if r.levels:
            by_level: dict[str, list[bool]] = {}
            for g in r.group_ids:
                if g in r.levels:
                    by_level.setdefault(str(r.levels[g]), []).extend(
                        t.reward >= correct_at for t in r.samples[g]
                    )
            record["accuracy_by_level"] = {lv: sum(h) / len(h) for lv, h in sorted(by_level.items()) if h}
        self.results.append(record)
        self.recorder.log("eval", **record)


def eval_summary(records: list[dict[str, Any]], targets: list[float]) -> dict[str, Any] | None:
    """first, best and last evaluation, and for each target accuracy the first evaluated version reaching it
    with the wall time its weights were published (None if never reached)."""
    evals = sorted((r for r in records if r.get("kind") == "eval"), key=lambda r: r["version"])
    if not evals:
        return None
    keep = ("version", "accuracy", "accuracy_by_level", "t_version", "response_len_mean")

    def pick(r: dict[str, Any]) -> dict[str, Any]:
        return {k: r[k] for k in keep if k in r}

    reached = {}
    for target in targets:
        hit = next((r for r in evals if r["accuracy"] >= target), None)
        reached[str(target)] = (
            None if hit is None else {"version": hit["version"], "wall_s": hit["t_version"]}
        )
    return {
        "first": pick(evals[0]),
        "best": pick(max(evals, key=lambda r: (r["accuracy"], -r["version"]))),
        "last": pick(evals[-1]),
        "evaluations": len(evals),
        "time_to_target": reached,
    }
