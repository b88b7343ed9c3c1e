"""Trackers: the run log's numbers in TensorBoard (always, `RUN_DIR/tensorboard/`) and Weights & Biases (when
`run.wandb_project` is set). Fed by the driver's `Recorder`, so they show exactly what `metrics.jsonl` holds:
every numeric field of every record, as `kind/field` (`step/reward_mean`, `eval/accuracy`), at the trainer step
the record belongs to; and the text of the trajectories `samples.jsonl` holds (`samples`)."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

WANDB_MISSING = (
    "run.wandb_project is set but the wandb package is not installed: pip install 'laminar[wandb]'"
)


def check_wandb(project: str) -> None:
    """Before anything starts: a project named needs the package (a clear line, not a traceback later)."""
    if not project:
        return
    try:
        import wandb  # noqa: F401
    except ImportError:
        raise ValueError(f"{WANDB_MISSING} (or leave run.wandb_project empty)") from None


NESTED = ("accuracy_by_level",)  # an evaluation's accuracy by level: one curve a level


def scalars(record: dict[str, Any]) -> dict[str, float]:
    """The record's numbers under `kind/field`, and those of the dicts named in `NESTED` under `kind/field/key`;
    lists, strings, nulls and the time stamp are left out."""
    kind = record["kind"]
    out = {}
    for key, value in record.items():
        if key in ("kind", "t") or isinstance(value, str) or value is None:
            continue
        if isinstance(value, bool | int | float):
            out[f"{kind}/{key}"] = float(value)
        elif key in NESTED and isinstance(value, dict):
            for sub, v in value.items():
                if isinstance(v, bool | int | float):
                    out[f"{kind}/{key}/{sub}"] = float(v)
    return out


def _start_wandb(out_dir: str | Path, config: dict[str, Any], project: str) -> Any:
    check_wandb(project)
    import wandb

    # Offline unless asked otherwise: a run never waits on the network (`wandb sync` uploads it later).
    mode = os.environ.get("WANDB_MODE") or "offline"
    return wandb.init(project=project, dir=str(out_dir), config=config, mode=mode)


class Trackers:
    """One writer per backend; `log` takes a run-log record as the `Recorder` writes it."""

    def __init__(
        self, out_dir: str | Path, t0: float, config: dict[str, Any], wandb_project: str = ""
    ) -> None:
        from tensorboardX import SummaryWriter

        self.t0, self.step = t0, 0
        self.tensorboard = SummaryWriter(logdir=str(Path(out_dir) / "tensorboard"), flush_secs=10)
        self.wandb = None
        if wandb_project:
            try:
                self.wandb = _start_wandb(out_dir, config, wandb_project)
            except BaseException:
                self.tensorboard.close()
                raise

    def log(self, record: dict[str, Any]) -> None:
        """At the record's own `step` if it has one, else at the last trainer step seen."""
        values = scalars(record)
        step = record.get("step")
        step = step if isinstance(step, int) and not isinstance(step, bool) else self.step
        self.step = max(self.step, step)  # W&B takes steps in order only
        if not values:
            return
        for tag, value in values.items():
            self.tensorboard.add_scalar(tag, value, global_step=step, walltime=self.t0 + record["t"])
        if self.wandb is not None:
            self.wandb.log(values, step=self.step)

    def samples(self, step: int, rows: list[dict[str, Any]]) -> None:
        """A step's trajectories as text (`laminar.telemetry.samples`): TensorBoard's text tab under `samples`,
        a W&B table under the same name."""
        from laminar.telemetry.samples import markdown

        if not rows:
            return
        self.step = max(self.step, step)
        self.tensorboard.add_text("samples", markdown(rows), global_step=step)
        if self.wandb is not None:
            import wandb

            columns = list(rows[0])
            table = wandb.Table(columns=columns, data=[[r[c] for c in columns] for r in rows])
            self.wandb.log({"samples": table}, step=self.step)

    def close(self) -> None:
        self.tensorboard.close()
        if self.wandb is not None:
            self.wandb.finish()
