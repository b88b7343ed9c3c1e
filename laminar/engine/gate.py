"""`rollout.speculation=auto`'s gate: whether a decode step verifies drafts, decided on measured time per
emitted token.

A verify step emits several tokens a drafting request but runs unpipelined (never queued ahead) and costs more
than a plain decode step; which path is faster depends on the device, the batch and the group's acceptance. The
gate times both paths per running-batch bucket (powers of two) as running averages of seconds per emitted token
and verifies where the verify path's is lower by `MARGIN`. Before both are measured it predicts: a request whose
group accepts draft tokens at rate a and drafts k emits (1 - a^(k+1)) / (1 - a) tokens a verify step, against a
verify step costing `cost_ratio` plain ones. Now and then it takes the other path for a few steps (after `gap`
steps of one, `gap` doubling while the measurements keep their verdict, back to `GAP_MIN` when it flips), so
both measurements follow acceptance and batch as they change.

Which path a step takes never changes what a request samples, only how many steps its tokens take.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field

MARGIN = 0.05  # verify only where its seconds a token are this much below plain's
WEIGHT = 0.3  # each measured step moves its path's running average this far
RARE_WEIGHT = 0.5  # ... and this far for the path out of favour: its average is older, acceptance has moved
CLIP = 4.0  # a step measured at more than this many times its path's average counts as this many (a pause)
GAP_MIN, GAP_MAX = 8, 128  # steps of one path before the other is explored
EXPLORE_STEPS = (
    3  # steps an exploration runs (a plain run's first step only refills the pipeline: unmeasured)
)
DECISIONS = ("verify", "plain", "explore_verify", "explore_plain", "predicted", "no_draft")


def expected_tokens(acceptance: float, draft: int) -> float:
    """Tokens a verify step emits for a request drafting `draft` tokens, each accepted with probability
    `acceptance` independently: the accepted prefix plus the draw after it."""
    if acceptance >= 1.0:
        return draft + 1.0
    return (1.0 - acceptance ** (draft + 1)) / (1.0 - acceptance)


def bucket_of(batch: int) -> int:
    """The power of two at or below `batch`: the steps whose costs are compared together."""
    return 1 << (max(batch, 1).bit_length() - 1)


@dataclass
class Bucket:
    plain: float | None = None  # seconds an emitted token, running average over plain steps
    verify: float | None = None  # the same over verify steps
    since: int = 0  # steps of the preferred path since the last exploration
    gap: int = GAP_MIN
    exploring: int = 0  # steps left of the exploration under way
    exploring_verify: bool = False  # the path it explores
    prefer_verify: bool | None = None  # the measurements' verdict when last compared

    def measured_verdict(self) -> bool | None:
        if self.plain is None or self.verify is None:
            return None
        return self.verify < self.plain * (1.0 - MARGIN)


@dataclass
class Gate:
    """Per-engine: the decision for a step (`choose`, pure), its bookkeeping once the step is committed to a
    path (`commit`), and the measurement when it ends (`ended`, which reads `clock`)."""

    cost_ratio: float = 2.0  # a verify step's cost in plain steps, until both are measured
    clock: Callable[[], float] = time.perf_counter
    buckets: dict[int, Bucket] = field(default_factory=dict)
    # steps by the decision they ran under: "verify" / "plain" where that path was the faster (measured, or
    # predicted: those also count in "predicted"), "explore_*" taking the other one, "no_draft" where the gate
    # chose to verify and no request found a draft
    steps: dict[str, int] = field(default_factory=lambda: dict.fromkeys(DECISIONS, 0))
    last_end: float | None = None  # when the last step ended
    last_plain: bool = False  # whether it was a plain decode step

    def bucket(self, batch: int) -> Bucket:
        return self.buckets.setdefault(bucket_of(batch), Bucket())

    def choose(self, batch: int, predicted_tokens: float) -> str:
        """ "verify", "plain", "explore_verify" or "explore_plain" for a step of `batch` requests whose verify
        step would emit `predicted_tokens` a request by the acceptance of their groups. Changes nothing."""
        b = self.bucket(batch)
        verdict = b.measured_verdict()
        if verdict is None:
            verdict = predicted_tokens > self.cost_ratio
        if b.exploring:
            return "explore_verify" if b.exploring_verify else "explore_plain"
        if b.since >= b.gap:
            return "explore_plain" if verdict else "explore_verify"
        return "verify" if verdict else "plain"

    def commit(self, batch: int, choice: str, verified: bool) -> None:
        """A step of `batch` requests runs: `choice` was the gate's, `verified` whether it verifies drafts
        (not when no request found one to draft)."""
        b = self.bucket(batch)
        if verified != (choice in ("verify", "explore_verify")):
            self.steps["no_draft"] += 1
            return
        self.steps[choice] += 1
        if b.measured_verdict() is None and not choice.startswith("explore"):
            self.steps["predicted"] += 1
        if not choice.startswith("explore"):
            b.since += 1
        elif b.exploring:
            b.exploring -= 1
        else:  # an exploration starts
            b.exploring, b.exploring_verify = EXPLORE_STEPS - 1, verified
            b.since, b.gap = 0, min(2 * b.gap, GAP_MAX)

    def ended(self, batch: int, path: str | None, tokens: int) -> None:
        """A step ended: a decode step of `batch` requests that emitted `tokens`, on `path` ("plain" or
        "verify"), or anything else (None: a prefill, an empty step). A plain step is measured from the end of
        the plain step before it (the pipeline's period: the host's work overlaps the device's), a verify step
        from the end of whatever came before (it overlaps nothing); either way the caller's work between steps
        counts, as it does in throughput."""
        now, last, after_plain = self.clock(), self.last_end, self.last_plain
        self.last_end, self.last_plain = now, path == "plain"
        if path is None or last is None or tokens < 1 or (path == "plain" and not after_plain):
            return
        b = self.bucket(batch)
        sample, mean = (now - last) / tokens, getattr(b, path)
        if mean is not None:
            rare = b.prefer_verify is not None and b.prefer_verify != (path == "verify")
            sample = mean + (RARE_WEIGHT if rare else WEIGHT) * (min(sample, CLIP * mean) - mean)
        setattr(b, path, sample)
        verdict = b.measured_verdict()
        if b.prefer_verify is not None and verdict != b.prefer_verify:  # the other path is now faster
            b.since, b.gap = 0, GAP_MIN
        b.prefer_verify = verdict

    def ms_per_token(self) -> dict[str, dict[str, float | None]]:
        """Each bucket's measured milliseconds an emitted token of each path, by its batch range."""
        out = {}
        for lo, b in sorted(self.buckets.items()):
            name = str(lo) if lo == 1 else f"{lo}-{2 * lo - 1}"
            out[name] = {
                p: None if v is None else round(v * 1e3, 5)
                for p, v in (("plain", b.plain), ("verify", b.verify))
            }
        return out
