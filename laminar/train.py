"""`laminar train [CONFIG] [key=value ...]`: one training run, written to a run folder.

The run folder holds the resolved config, `metrics.jsonl` (written as the run goes), `summary.json`, a
checkpoint and the plots. The defaults are the embedded CPU demo: a warm-started tiny model learning the
built-in long-tailed reverse task with three rollout replicas.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
import os
import sys
import time
import traceback
from collections.abc import Callable
from pathlib import Path
from typing import Any

import yaml

from laminar import preflight
from laminar.config import Config, ConfigError, correction_warning, lr_warning
from laminar.configure import load_config
from laminar.telemetry.provenance import code_digest
from laminar.telemetry.quiet import actor_env, quiet_libraries, ray_logging_level


def start_ray(cfg: Config) -> None:
    """Ray for the run: the actors' output reaches the console, less what `run.verbose` alone shows
    (`laminar.telemetry.quiet`)."""
    import ray

    os.environ.setdefault("RAY_AUTH_MODE", "disabled")
    if ray.is_initialized():
        return
    common = {
        "log_to_driver": True,
        "logging_level": ray_logging_level(cfg.run.verbose),
        "runtime_env": {"env_vars": actor_env(cfg.run.verbose)},
    }
    if cfg.run.ray_address:
        ray.init(address=cfg.run.ray_address, **common)
        return
    need = cfg.trainer.num_cpus * cfg.trainer.num_workers + cfg.rollout.replicas * cfg.rollout.num_cpus
    ray.init(
        address="local",
        num_cpus=cfg.run.num_cpus or math.ceil(need) + 1,
        object_store_memory=256 << 20,
        include_dashboard=False,
        _node_ip_address="127.0.0.1",
        **common,
    )


def _maybe(x: float | None) -> str:
    return "-" if x is None else f"{x:.4f}"


class Progress:
    """One line per trainer step: the numbers a person watching the run wants."""

    def __init__(self, steps: int, t0: float, tools: bool = False) -> None:
        self.steps, self.t0, self.rewards, self.tools = steps, t0, [], tools

    def __call__(self, m: dict[str, Any]) -> None:
        self.rewards.append(m["reward_mean"])
        ma = sum(self.rewards[-5:]) / len(self.rewards[-5:])
        st = m["staleness"]
        print(
            f"step {m['version']:3d}/{self.steps}  t {time.time() - self.t0:6.1f}s  reward {m['reward_mean']:.3f}"
            f" (ma5 {ma:.3f})  tokens {m['tokens']:5d}  staleness mean {sum(st) / len(st):.2f} max {max(st)}"
            f"  stall {1000 * m['stall_s']:.1f} ms  |logp train-rollout| same weights "
            f"{_maybe(m.get('logprob_mismatch_same_weights'))}, stale {_maybe(m.get('logprob_mismatch_stale_weights'))}"
            + (f"  kl {m['kl']:.4f}" if "kl" in m else "")
            + (
                f"  tool calls {m['tool_call_frac']:.2f} of trajectories, {m['tool_calls_mean']:.2f} each"
                if self.tools
                else ""
            )
            + (f"  filtered {m['filtered_groups']}" if "filtered_groups" in m else ""),
            flush=True,
        )


def train(
    cfg: Config,
    out: Path,
    quiet: bool = False,
    resume: bool = False,
    hook: Callable[[Any, dict[str, Any]], None] | None = None,
) -> dict[str, Any]:
    """One run. `hook(runtime, step_metrics)` runs after every step (tests use it to inject failures)."""

    from laminar.relay.slots import sweep_stale
    from laminar.runtime.checkpoint import (
        RUNTIME_STATE,
        check_checkpoint,
        finish_checkpoint_swap,
        rewind_to_checkpoint,
    )
    from laminar.runtime.launch import Runtime
    from laminar.schedules import Schedule
    from laminar.telemetry.console import Console
    from laminar.telemetry.recorder import Recorder
    from laminar.telemetry.tracking import Trackers

    out.mkdir(parents=True, exist_ok=True)
    ckpt = out / "checkpoint"
    if resume:
        finish_checkpoint_swap(ckpt)
    if resume and not (ckpt / RUNTIME_STATE).is_file():
        raise FileNotFoundError(
            f"cannot resume {out}: it has no checkpoint/{RUNTIME_STATE} (a run folder of "
            "`laminar train` that reached its first checkpoint)"
        )
    if resume:  # every file parses as data (never as code) and is in range, before any actor starts
        check_checkpoint(ckpt)
        rewind_to_checkpoint(out, ckpt)  # the logs end where the checkpoint does
    for warning in (lr_warning(cfg), correction_warning(cfg)):
        if warning:
            print(f"laminar: {warning}", file=sys.stderr, flush=True)
    t0 = time.time()
    trackers = Trackers(out, t0, cfg.to_dict(), cfg.run.wandb_project)
    recorder = Recorder(out, t0=t0, console=None if quiet else Console(), trackers=trackers)
    rt = None
    try:
        # Start-up phases go to the console as they begin (a slow start never looks like a hang).
        recorder.log(
            "phase",
            what=f"checking the model {cfg.model.path}" if cfg.model.path else "the task's warm start",
        )
        model_path = preflight.resolve_model(cfg)
        for line in preflight.start_lines(cfg, model_path):
            print(
                f"laminar: {line}", file=sys.stderr if line.startswith("warning") else sys.stdout, flush=True
            )
        sweep_stale()  # shared memory left by killed runs on this (the driver's) node
        recorder.log("phase", what="starting Ray")
        start_ray(cfg)
        schedule = Schedule.from_config(cfg)
        rt = Runtime.start(cfg, model_path, recorder, schedule, resume=ckpt if resume else None)
        return _run(cfg, out, rt, schedule, recorder, resume, quiet, hook, model_path)
    finally:
        recorder.close()
        if rt is not None:
            rt.shutdown()  # every exit path frees the actors and their shared memory


def _run(
    cfg: Config,
    out: Path,
    rt: Any,
    schedule: Any,
    recorder: Any,
    resume: bool,
    quiet: bool,
    hook: Callable[[Any, dict[str, Any]], None] | None,
    model_path: str,
) -> dict[str, Any]:
    """The started run: the schedule's loop, the last checkpoint, the summary and the plots."""
    from laminar.rewards.stop import choose_reward
    from laminar.runtime.evaluation import eval_summary
    from laminar.telemetry.audit import audit_run
    from laminar.telemetry.plots import plot_run
    from laminar.telemetry.recorder import write_json
    from laminar.telemetry.summary import failures, summarize

    ckpt = out / "checkpoint"
    (out / "config.yaml").write_text(yaml.safe_dump(cfg.to_dict(), sort_keys=False))  # the run has started
    start_version = rt.version
    steps = cfg.trainer.steps - start_version
    print(
        f"laminar: schedule {cfg.schedule.name}, {cfg.rollout.replicas} replicas, {len(rt.relays)} relays, "
        f"model {model_path}, run folder {out}" + (f", resumed at step {rt.version}" if resume else ""),
        flush=True,
    )
    progress = (lambda m: None) if quiet else Progress(cfg.trainer.steps, time.time(), bool(cfg.task.tools))

    def on_step(m: dict[str, Any]) -> None:
        if m["version"] == start_version + 1:
            recorder.log("phase", what=f"first step trained; weights of version {m['version']} published")
        progress(m)
        if hook is not None:
            hook(rt, m)
        if cfg.trainer.checkpoint_every and m["version"] % cfg.trainer.checkpoint_every == 0:
            rt.checkpoint(ckpt)

    t_start = time.time()
    try:
        schedule.run(rt, steps, on_step)
    except BaseException:
        try:  # stop and checkpoint what there is; an error doing so must not hide the run's own
            rt.stop()
            if cfg.trainer.checkpoint_at_end:
                rt.checkpoint(ckpt)
        except Exception as e:  # noqa: BLE001 - logged; the run's own error is the one raised
            from laminar.telemetry.console import one_line

            recorder.log("stop_error", error=one_line(e), traceback="".join(traceback.format_exception(e)))
        raise
    wall = time.time() - t_start
    if rt.evaluator is not None:  # the last evaluation, on weights the rollouts already hold
        rt.evaluator.finish()
    end = rt.stop(settle=True)  # failures not noticed yet are counted, and their work accounted for
    if cfg.trainer.checkpoint_at_end:
        rt.checkpoint(ckpt)
    for v, seconds in sorted(rt.propagation().items()):
        recorder.log("propagation", version=v, seconds=seconds)
    buf, partial = end["buffer"], end["partial"]
    generated = buf.get("added", 0)
    in_buffer = buf.get("size", 0)
    audit = audit_run(out)  # the summary's counts are the run folder's, over every segment
    prop = {r["version"]: r["seconds"] for r in recorder.of("propagation")}
    for r in recorder.of("publish"):
        r["propagation_s"] = prop.get(r["version"])
    summary = summarize(
        recorder.records,
        schedule=cfg.schedule.name,
        wall_s=wall,
        warmup_steps=cfg.trainer.warmup_steps,
        trajectories={
            "generated": generated,
            **audit.counts(),
            "audit_ok": audit.ok,
            "deduplicated_by_buffer": buf.get("duplicates", 0),
            "in_flight_at_end": partial["in_flight"],
            "in_buffer_at_end": in_buffer,
            "evicted": buf.get("evicted_trajectories", 0),
        },
        extra={
            "code": code_digest(),  # the package's source digest (laminar.telemetry.provenance)
            "checkpoint": str(ckpt) if ckpt.is_dir() else None,  # trainer.checkpoint_at_end=false: none
            "model": model_path,
            "resumed_at": start_version if resume else None,
            "restarted_on_resume": rt.restarted_on_resume,
            "repacks": end["repacks"],
            "failures": failures(recorder.records),  # the run's own `failure` and `recovery` records
            "filtered_groups": audit.filtered_groups,  # trainer.filter_groups: set aside, every segment
            "eval": eval_summary(recorder.records, cfg.eval.targets),
            "reward": dataclasses.asdict(choose_reward(cfg)),  # the reward in use and why
        },
    )
    write_json(out / "summary.json", summary)
    if cfg.run.plots:
        plot_run(recorder.records, out)
    if cfg.run.export:
        from laminar.models.export import export

        export(ckpt, out / "model", cfg.run.export)
    return summary


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(
        prog="laminar train", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("config", nargs="?", help="YAML config file (optional; defaults are the CPU demo)")
    ap.add_argument("overrides", nargs="*", help="dotted overrides, e.g. trainer.lr=1e-5 rollout.replicas=4")
    ap.add_argument("--out", help="run folder (default: run.out from the config)")
    ap.add_argument("--resume", metavar="RUN_DIR", help="continue a stopped run from its last checkpoint")
    args = ap.parse_args(argv)
    config, overrides = args.config, list(args.overrides)
    if args.resume:  # the run's own resolved config, then whatever is given here
        run = Path(args.resume)
        if not (run / "config.yaml").is_file():
            what = "has no config.yaml" if run.is_dir() else "is a file" if run.exists() else "does not exist"
            print(
                f"laminar train: cannot resume: the run folder {run} {what}; --resume takes a folder that "
                "`laminar train` wrote (config.yaml, metrics.jsonl, checkpoint/)",
                file=sys.stderr,
            )
            return 2
        if config and "=" not in config:
            print(
                "laminar train: --resume takes the run's own config.yaml; give only overrides",
                file=sys.stderr,
            )
            return 2
        overrides = [config, *overrides] if config else overrides
        config = str(Path(args.resume) / "config.yaml")
        args.out = args.resume
    if config and "=" in config:  # only overrides were given
        config, overrides = None, [config, *overrides]
    try:
        cfg = load_config(config, overrides)
        # before the checks below load the tokenizer (or build the warm start)
        quiet_libraries(cfg.run.verbose)
        if cfg.model.path:
            preflight.resolve_model(cfg)
        preflight.check_inputs(cfg)
    except (ConfigError, FileNotFoundError, ValueError) as e:
        print(f"laminar train: bad configuration: {e}", file=sys.stderr)
        return 2
    if args.resume:
        from laminar.runtime.checkpoint import check_checkpoint, finish_checkpoint_swap
        from laminar.trainer.state_files import CheckpointError

        try:
            finish_checkpoint_swap(Path(args.resume) / "checkpoint")
            check_checkpoint(Path(args.resume) / "checkpoint")
        except CheckpointError as e:
            print(f"laminar train: cannot resume: {e}", file=sys.stderr)
            return 2
    if args.out:
        cfg.run.out = args.out
    try:
        summary = train(cfg, Path(cfg.run.out), resume=bool(args.resume))
    except KeyboardInterrupt:
        print(f"laminar train: interrupted; what was done is in {cfg.run.out}", file=sys.stderr)
        return 130
    except Exception as e:  # noqa: BLE001 - after validation every failure ends as one line and a log
        from laminar.telemetry.console import one_line

        log = Path(cfg.run.out) / "error.log"
        log.parent.mkdir(parents=True, exist_ok=True)
        log.write_text("".join(traceback.format_exception(e)))
        print(f"laminar train: {one_line(e)} (traceback in {log})", file=sys.stderr)
        return 1
    keys = (
        "schedule",
        "wall_s",
        "trainer_steps",
        "train_tokens_per_s",
        "gen_tokens_per_s",
        "reward_start",
        "reward_end",
        "staleness",
        "actor_stall_s",
        "relay_propagation_s",
        "trajectories",
        "reward_errors",
        "replica_errors",
        "nonfinite_steps",
        "eval",
    )
    print(json.dumps({k: summary.get(k) for k in keys}, indent=2))
    if summary.get("eval"):
        from laminar.telemetry.console import summary_line

        print(f"laminar: {summary_line(summary['eval'])}")
    print(f"plots and summary in {cfg.run.out}")
    if not summary["trajectories"]["audit_ok"]:  # work unaccounted for: not a run to build on
        from laminar.telemetry.audit import audit_run, headline

        print(
            f"laminar train: the trajectory audit failed: {headline(audit_run(cfg.run.out))} "
            f"(laminar audit {cfg.run.out})",
            file=sys.stderr,
        )
        return 1
    return 0
