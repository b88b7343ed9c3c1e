"""The few run events a person watching the console must see (reward errors, dead replicas, skipped steps), one
line each and rate-limited per kind, so a reward function failing on every row prints a line every few seconds,
not thousands; and the start-up phases, every one as it begins. The full records are in `metrics.jsonl`."""

from __future__ import annotations

import re
import sys
import time
from collections.abc import Callable
from typing import Any, TextIO


def alert_line(record: dict[str, Any]) -> str | None:
    """The console line for a record, or None for records that are not alerts."""
    kind = record["kind"]
    if kind == "reward_error":
        return (
            f"reward error ({record.get('error_kind')}) on row {record.get('row')} (trajectory "
            f"{record.get('traj_id')}, replica {record.get('replica')}): {record.get('error')}; scored 0"
        )
    if kind == "replica_error":
        return f"replica {record.get('replica')}: its generation loop raised {record.get('error')}"
    if kind == "filter_short":
        kept = record.get("kept")
        return (
            f"step {record.get('step')}: only {kept} of {record.get('wanted')} groups had unequal rewards after "
            f"taking {record.get('taken')} ({record.get('why')}); "
            + ("training on those" if kept else "training on the last ones taken (no reward signal in them)")
        )
    if kind == "step" and record.get("nonfinite"):
        return (
            f"step {record.get('step')}: the loss or the gradient norm is NaN or inf; step skipped, weights "
            "unchanged"
        )
    return None


def _levels(r: dict[str, Any]) -> str:
    by_level = r.get("accuracy_by_level") or {}
    return (" (" + ", ".join(f"level {lv} {a:.3f}" for lv, a in by_level.items()) + ")") if by_level else ""


def eval_line(r: dict[str, Any]) -> str:
    """An `eval` record as the console shows it."""
    return (
        f"eval of version {r['version']}: held-out accuracy {r['accuracy']:.3f}{_levels(r)} over "
        f"{r['samples']} samples of {r['prompts']} prompts, mean response {r['response_len_mean']:.1f} tokens"
    )


def summary_line(e: dict[str, Any]) -> str:
    """`summary.json`'s `eval` as the one line printed at the end of a run."""
    first, last, best = e["first"], e["last"], e["best"]
    return (
        f"held-out accuracy {first['accuracy']:.3f}{_levels(first)} at version {first['version']} -> "
        f"{last['accuracy']:.3f}{_levels(last)} at version {last['version']} (best {best['accuracy']:.3f} at "
        f"version {best['version']}; {e['evaluations']} evaluations)"
    )


class Console:
    """At most one line per kind of alert every `every_s` seconds; a line says how many it stood for. The first
    replica error of each kind also shows its traceback."""

    def __init__(
        self, every_s: float = 5.0, stream: TextIO | None = None, clock: Callable[[], float] = time.monotonic
    ) -> None:
        self.every_s, self.stream, self.clock = every_s, stream, clock
        self._last: dict[str, float] = {}
        self._held: dict[str, int] = {}  # alerts not shown since the last line of their kind
        self._tracebacks_shown: set[str] = set()

    def show(self, record: dict[str, Any]) -> str | None:
        """Print the record's line if it is an alert and its kind is not rate-limited now; returns what it
        printed."""
        if record["kind"] == "phase":  # start-up: every phase as it begins, with the seconds since the start
            text = f"laminar: [{record['t']:6.1f}s] {record['what']}"
            print(text, file=self.stream or sys.stderr, flush=True)
            return text
        if record["kind"] == "eval":  # held-out accuracy: every evaluation, as it completes
            text = f"laminar: {eval_line(record)}"
            print(text, file=self.stream or sys.stdout, flush=True)
            return text
        line = alert_line(record)
        if line is None:
            return None
        kind, now = record["kind"], self.clock()
        if kind in self._last and now - self._last[kind] < self.every_s:
            self._held[kind] = self._held.get(kind, 0) + 1
            return None
        held = self._held.pop(kind, 0)
        self._last[kind] = now
        text = f"laminar: {line}" + (f" (and {held} more like it since the last line)" if held else "")
        signature = record.get("error_kind") or record.get("error")
        if kind == "replica_error" and record.get("traceback") and signature not in self._tracebacks_shown:
            self._tracebacks_shown.add(signature)
            text += "\n" + record["traceback"].rstrip()
        print(text, file=self.stream or sys.stderr, flush=True)
        return text

    def flush(self) -> list[str]:
        """At the end of a run: one line per kind of alert still held back, so none goes unmentioned."""
        lines = [
            f"laminar: {n} more {kind.replace('_', ' ')}{'s' if n > 1 else ''} not shown (see metrics.jsonl)"
            for kind, n in sorted(self._held.items())
        ]
        self._held.clear()
        for line in lines:
            print(line, file=self.stream or sys.stderr, flush=True)
        return lines


_ANSI = re.compile(r"\x1b\[[0-9;]*m")
_RAISED = re.compile(
    r"^(?:[A-Za-z_][\w]*\.)*(?P<type>[A-Za-z_]\w*(?:Error|Exception|Interrupt)): (?P<message>.*)$"
)


def one_line(exc: BaseException) -> str:
    """An error as the one line a person needs: Ray's wrappers unwrapped to the task's own exception, its
    message's first line; laminar's own errors speak for themselves, others keep their type's name. A Ray error
    without the exception itself (an actor that died in its constructor) shows the last line of the remote
    traceback it quotes: the exception that killed it."""
    seen: set[int] = set()
    while isinstance(getattr(exc, "cause", None), BaseException) and id(exc) not in seen:
        seen.add(id(exc))
        exc = exc.cause  # a RayTaskError carries the exception the task raised
    lines = [_ANSI.sub("", line) for line in str(exc).strip().splitlines() if line.strip()]
    if type(exc).__module__.startswith("ray") and any(line.lstrip().startswith('File "') for line in lines):
        raised = [m for m in map(_RAISED.match, lines) if m]
        if raised:
            return f"{raised[-1]['type']}: {raised[-1]['message']}"
    message = lines[0].strip() if lines else ""
    if type(exc).__module__.startswith("laminar") and message:
        return message
    return f"{type(exc).__name__}: {message}" if message else type(exc).__name__
