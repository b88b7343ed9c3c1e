"""The work `laminar bench trainer` gives a trainer step, and what that work costs: synthetic GRPO groups of
realistic lengths and their batches, the FLOPs a step runs (`step_flops`), the padding a batch carries and the
cards' peak the utilisation is measured against."""

from __future__ import annotations

import argparse
import math
import random
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

import torch

from laminar.data.records import Trajectory

PEAK_BF16_TFLOPS = {"H100": 989.0, "H200": 989.0, "A100": 312.0}  # dense


def synthetic_groups(
    groups: int,
    group_size: int,
    prompt: int,
    response_median: int,
    response_max: int,
    vocab: int,
    seed: int,
    p99_ratio: float = 4.0,
) -> list[list[Trajectory]]:
    """Groups with lognormal response lengths (p99 = `p99_ratio` x the median, capped at `response_max`),
    random tokens and rewards."""
    rng = random.Random(seed)
    sigma = math.log(p99_ratio) / 2.326
    out = []
    for g in range(groups):
        prompt_ids = [rng.randrange(vocab) for _ in range(prompt)]
        group = []
        for i in range(group_size):
            n = min(response_max, max(1, round(math.exp(rng.gauss(math.log(response_median), sigma)))))
            group.append(
                Trajectory(
                    traj_id=f"{g}:{i}",
                    group_id=g,
                    sample_idx=i,
                    prompt_ids=prompt_ids,
                    response_ids=[rng.randrange(vocab) for _ in range(n)],
                    logprobs=[-2.0] * n,
                    version=0,
                    reward=float(rng.random() < 0.5),
                    finish_reason="stop",
                )
            )
        out.append(group)
    return out


def step_batches(args: argparse.Namespace, vocab: int) -> list[list[list[Trajectory]]]:
    """The warm-up step's groups, then each measured step's: seeds 0 to `args.steps`, so that a row's command
    names its batches."""
    return [
        synthetic_groups(
            args.groups,
            args.group_size,
            args.prompt,
            args.response_median,
            args.response_max,
            vocab,
            seed,
            args.response_p99_ratio,
        )
        for seed in range(args.steps + 1)
    ]


@dataclass(frozen=True)
class StepFlops:
    """The model FLOPs of one training step, by where the products run."""

    layers: float  # q, k, v, o, gate, up and down, at every token
    attention: float  # causal scores and the values they weight
    output_layer: float  # at response positions only

    @property
    def total(self) -> float:
        return self.layers + self.attention + self.output_layer


def step_flops(config: Any, sequences: Iterable[tuple[int, int]]) -> StepFlops:
    """FLOPs of the forward and backward of a decoder-only model (a Hugging Face config: hidden, intermediate,
    layers, heads, kv heads, head_dim, vocabulary) over sequences of (prompt, response) tokens, counting the
    products the model runs. Per sequence of T = prompt + response tokens, forward:
    - layers: 2 T x layers x (2 h q + 2 h kv + 3 h i), q = heads x head_dim, kv = kv heads x head_dim;
    - attention: position t attends to t keys (itself included), T(T+1)/2 pairs a head, each a 2 x head_dim
      score and a 2 x head_dim weighted value: 2 x head_dim x heads x T(T+1) a layer;
    - output layer: 2 x response x h x vocabulary; `PolicyLogprobs` (laminar/trainer/logprobs.py) takes logits
      only at the positions that predict a response token (a plain output layer, as in every bench shape);
    - embedding: a lookup, no product.
    The backward runs two products for each of the forward's (the input's gradient and the weight's, or for
    attention the two operands'), so the step is 3x the forward. Not counted, as model FLOPs (the numerator of
    MFU as usually defined) leave them out: recomputation (activation checkpointing's second forward,
    FlashAttention's scores in its backward, the chunked output layer's logits in its backward), padding, the
    masked part of the attention tiles on the diagonal, a reference model's or proximal forward (the bench has
    neither), norms, rotary and the softmax."""
    h, i = config.hidden_size, config.intermediate_size
    heads, layers = config.num_attention_heads, config.num_hidden_layers
    head_dim = getattr(config, "head_dim", None) or h // heads
    q, kv = heads * head_dim, config.num_key_value_heads * head_dim
    per_token = 2 * layers * (2 * h * q + 2 * h * kv + 3 * h * i)
    tokens = pairs = response = 0
    for p, r in sequences:
        tokens += p + r
        pairs += (p + r) * (p + r + 1)  # twice the causal pairs
        response += r
    return StepFlops(
        layers=3.0 * per_token * tokens,
        attention=3.0 * 2 * head_dim * heads * layers * pairs,
        output_layer=3.0 * 2 * response * h * config.vocab_size,
    )


def padded_tokens(trainer: Any, trajs: list[Trajectory]) -> tuple[int, int]:
    """(tokens this rank's forwards see, its micro-batches): each micro-batch padded to its longest sequence,
    unless packed."""
    lengths = [t.num_tokens for t in trajs]
    seen, count = 0, 0
    for _, micro in trainer.plan(lengths):
        for mb in micro:
            count += 1
            if mb is not None:
                widths = [lengths[i] for i in mb]
                seen += sum(widths) if trainer.packed else len(mb) * max(widths)
    return seen, count


def peak_tflops(device: torch.device) -> float | None:
    if device.type != "cuda":
        return None
    name = torch.cuda.get_device_name(device)
    return next((v for k, v in PEAK_BF16_TFLOPS.items() if k in name), None)
