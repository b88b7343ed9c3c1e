"""The demo's premise, checked in-process: GRPO on the warm start raises the reverse task's reward.

The reward is called in this process (`check_reward` on its value, as a scorer's worker does): a scorer's
process round trip for each of the 7,680 answers cost more CPU than the steps' generation. The scorer itself is
tests/rewards/'s."""

import time

import numpy as np
import pytest

from laminar.config import RolloutConfig, TrainerConfig
from laminar.data.codec import TaskCodec
from laminar.data.experience_buffer import ExperienceBuffer
from laminar.data.prompt_pool import PromptPool
from laminar.rewards.loader import DEFAULT_REWARD, check_reward, load_reward
from laminar.tasks.reverse import ReverseTask
from laminar.tasks.warmup import WarmupConfig, warmup
from laminar.trainer.trainer import Trainer
from tests.trainer.hf_rollout import generate_groups

# The demo defaults (reported to the runtime): lr, group size, groups per step, temperature, max new tokens.
LR, N, GROUPS, TEMPERATURE, STEPS = 3e-4, 8, 16, 1.0, 40


@pytest.mark.slow
@pytest.mark.timeout(1200)  # about 55 s on two idle cores; far longer when the machine is shared
def test_grpo_raises_the_reward_of_the_warm_start(tmp_path):
    t0 = time.perf_counter()
    task = ReverseTask()
    model_dir = warmup(tmp_path / "warm", WarmupConfig(), "reverse", log=False)
    codec = TaskCodec.from_dir(model_dir)
    trainer = Trainer(
        TrainerConfig(lr=LR, num_cpus=2, micro_batch=N * GROUPS),
        str(model_dir),
        rollout=RolloutConfig(temperature=TEMPERATURE),
    )
    pool = PromptPool(task.rows(5000, seed=7), codec.encode_prompt, n=N, seed=0)
    buffer = ExperienceBuffer(group_size=N)
    reward_fn, errors = load_reward(DEFAULT_REWARD), 0
    rewards = []
    for _ in range(STEPS):
        groups = pool.next_groups(GROUPS)
        done = generate_groups(
            trainer.model,
            groups,
            eos_id=codec.eos_id,
            pad_id=codec.pad_id,
            max_new_tokens=task.max_response_tokens(),
            temperature=TEMPERATURE,
            version=trainer.version,
        )
        for group, trajs in zip(groups, done):
            for t in trajs:
                t.reward, kind, _ = check_reward(reward_fn(codec.decode(t.response_ids), group.meta))
                errors += kind is not None
                buffer.add(t)
            pool.done(group.group_id)
        metrics = trainer.train_step(buffer.sample(GROUPS, trainer.version))
        rewards.append(metrics["reward_mean"])
        if metrics["version"] % 10 == 0:
            print(
                f"step {metrics['version']}: reward {np.mean(rewards[-10:]):.3f}, {time.perf_counter() - t0:.0f}s"
            )
    start, end = float(np.mean(rewards[:8])), float(np.mean(rewards[-8:]))
    elapsed = time.perf_counter() - t0
    print(f"reward {start:.3f} -> {end:.3f} in {STEPS} steps, {elapsed:.0f}s")
    assert buffer.stats()["staleness"]["max"] == 0 and errors == 0
    assert 0.2 <= rewards[0] <= 0.65, "the warm start should be only partly competent"
    assert end > start + 0.05, f"GRPO did not raise the reward: {start:.3f} -> {end:.3f}"
