"""What `laminar train` checks and says on the driver before any actor starts: the model to start from (the
configured one, or the task's warm start, built once), the device, the inputs the actors would otherwise find
late (model directory, dataset rows, prompts, the reward's dry run), and the start-up lines (the reward in use,
the memory estimate)."""

from __future__ import annotations

import copy
from typing import TYPE_CHECKING

from laminar.config import Config, ConfigError

if TYPE_CHECKING:
    from laminar.engine.config import ModelConfig


def resolve_model(cfg: Config) -> str:
    """The configured local model, or the task's warm-start checkpoint (made once by `laminar warmup`): its own
    tiny model's where the task has one (`laminar.tasks`), else the demo's."""
    if cfg.model.path:
        from laminar.engine.model_dir import check_model_dir

        check_model_dir(cfg.model.path)  # says what is missing before any actor starts
        return cfg.model.path
    from laminar.tasks import DEMO
    from laminar.tasks.warmup import default_warmup_dir, is_current, tiny_warm_start, warmup

    task = tiny_warm_start(cfg.task.name)
    demo = default_warmup_dir(task)
    if not is_current(demo, task):
        again = "laminar warmup" + ("" if task == DEMO else f" --task {task}")
        print(f"building the {task} task's warm-start checkpoint in {demo} (once; `{again}` rebuilds it)")
        warmup(demo, task=task)
    return str(demo)


def check_device(cfg: Config) -> None:
    """`model.device=cuda` on a machine without CUDA is one line here, not Ray's tracebacks a minute later (a
    cluster's driver may have no GPU of its own: there the workers' devices are theirs to check)."""
    if cfg.model.device != "cuda" or cfg.run.ray_address:
        return
    import torch

    if not torch.cuda.is_available():
        built = f"built for CUDA {torch.version.cuda}" if torch.version.cuda else "built without CUDA"
        raise ConfigError(
            f"model.device='cuda' but this machine has no usable CUDA device (torch {torch.__version__}, {built}); "
            "use model.device=cpu or auto"
        )


def check_tensor_parallel(shape: ModelConfig, cfg: Config) -> None:
    """Whether `rollout.tensor_parallel` ranks can split this model's heads and MLP."""
    from laminar.engine.tensor_parallel import check_degree

    try:
        check_degree(shape, cfg.rollout.tensor_parallel)
    except ValueError as e:
        raise ConfigError(
            f"rollout.tensor_parallel={cfg.rollout.tensor_parallel!r} is invalid for {cfg.model.path}: {e}"
        ) from None


def check_inputs(cfg: Config) -> None:
    """What the actors would otherwise find late, checked on the driver before any starts: the device; the model
    directory (config, an architecture the engine implements, weights, a tokenizer that loads); every dataset
    row loads, has a ground truth where the reward compares with one, and its prompt encodes and fits with the
    model's tokenizer; and the reward function imports and does not fail on every one of a few rows
    (`laminar.rewards.stop.dry_run`)."""
    from laminar.rewards.stop import (
        DRY_RUN_ROWS,
        DRY_RUN_TIMEOUT_S,
        MATH_REWARD,
        choose_reward,
        dry_run,
        dry_run_rows,
    )

    check_device(cfg)
    codec = None
    if cfg.model.path:
        from laminar.data.codec import TaskCodec
        from laminar.engine.config import ModelConfig

        model = resolve_model(cfg)  # config.json and weights
        check_tensor_parallel(ModelConfig.from_dir(model), cfg)  # an architecture the engine implements
        codec = TaskCodec.from_config(model, cfg)  # a tokenizer that loads
        from laminar.runtime.factory import use_cuda
        from laminar.runtime.memory import check_memory

        check_memory(cfg, model, use_cuda(cfg))  # a run that cannot fit (`DoesNotFit`, a ValueError)
    reward = choose_reward(cfg).path
    rows = []
    if cfg.data.train_files or cfg.data.val_files or cfg.task.name.endswith(".jsonl"):
        from laminar.data.dataset import check_ground_truths, check_prompts, read_dataset_files

        files = read_dataset_files(cfg)  # every row's fields first: no model is needed for that
        if reward == MATH_REWARD:
            check_ground_truths(files, reward)
        check_prompts(files, cfg, resolve_model(cfg))
        rows = [row for _, numbered in files for _, row in numbered][:DRY_RUN_ROWS]
    else:  # a built-in task: a few of its rows
        from laminar.tasks.rows import train_rows

        few = copy.deepcopy(cfg)
        few.task.num_prompts = DRY_RUN_ROWS
        rows = train_rows(few)
    dry_run(reward, dry_run_rows(rows), min(cfg.task.reward_timeout_s, DRY_RUN_TIMEOUT_S))
    from laminar.tasks import TASKS

    task = TASKS.get(cfg.task.name)
    if task is not None and task.check_codec is not None and codec is not None:
        task.check_codec(codec)
    from laminar.telemetry.tracking import check_wandb

    check_wandb(cfg.run.wandb_project)


def start_lines(cfg: Config, model_path: str) -> list[str]:
    """What a run says before Ray starts: the reward in use and why, the memory estimate, and a warning when
    the estimate is more than the machine has."""
    from laminar.rewards.stop import choose_reward
    from laminar.runtime.factory import use_cuda
    from laminar.runtime.memory import check_memory

    choice = choose_reward(cfg)
    estimate, warning = check_memory(cfg, model_path, use_cuda(cfg))
    return [f"reward {choice.path}: {choice.why}", estimate, *([warning] if warning else [])]
