"""The simulator's calibration on our own measurements, as constants: what `laminar simulate` uses when it is given
no benchmark file (`--engine-bench`, `--trainer-bench`, `--schedule-runs` fit the same values again from files,
with `laminar.sim.calibrate`). Each constant names the measurement it was fitted on, in the repository's results.
"""

from __future__ import annotations

from dataclasses import replace

from laminar.sim.calibrate import MeasuredRun, ScheduleCalibration, TrainerRow
from laminar.sim.cost import CostModel

# `from_engine_bench` on `laminar bench engine` on one H200, the Qwen2.5-7B shape: the median, over batch sizes up
# to 64, of the roofline over the measured decode step (results/engine/engine-cuda.json)
ENGINE_DECODE_MEM_EFF = 0.4944533527636138
ENGINE_NOTE = (
    "results/engine/engine-cuda.json (NVIDIA H200, qwen2.5-7b): decode_mem_eff=0.49, step_overhead_s=0 (folded in) "
    "from 7 memory-bound batch sizes"
)

# `fit_tp_latency` on `laminar bench tp` on two H200s, the Qwen2.5-7B shape with NCCL all-reduces captured in its
# decode graphs (TP=2) and TP=1 for the ratio to the roofline: the time one all-reduce adds to a decode step
TP_BENCH = (
    "results/tp-decode/tp-7b.json",
    "results/tp-decode/tp-7b-graphs.json",
    "results/tp-decode/tp-7b-nccl-rerun.json",
)
TP_LAYER_LATENCY_S = 1.8863357390348915e-05
TP_NOTE = (
    "results/tp-decode (NVIDIA H200 x 2, qwen2.5-7b, TP=2 in CUDA graphs): tp_layer_latency_s=18.9 us an "
    "all-reduce, 2 a layer (median of 8 decode steps at batch <= 64)"
)

# The `laminar bench trainer` rows `from_trainer_rows` can pick from results/trainer/*/trainer.json: of each
# shape, the sharded row with the highest MFU (6 x parameters x tokens); rows measured beside other work left out
TRAINER_ROWS = (
    TrainerRow(
        "results/trainer/qwen0.5b-2gpu/trainer.json",
        494032768,
        2,
        0.0978,
        "NVIDIA H100 80GB HBM3",
        "qwen2.5-0.5b",
        65237.8,
    ),
    TrainerRow(
        "results/trainer/qwen1.5b-2gpu-32768-compile-noreshard/trainer.json",
        1543714304,
        2,
        0.3567,
        "NVIDIA H100 80GB HBM3",
        "qwen2.5-1.5b",
        76176.0,
    ),
    TrainerRow(
        "results/trainer/qwen7b-2gpu/trainer.json",
        7615616512,
        2,
        0.3523,
        "NVIDIA H100 80GB HBM3",
        "qwen2.5-7b",
        15249.1,
    ),
)

# `from_schedule_bench` on the small GPU schedule benchmark (results/schedules-gpu-repeats: 4 x H200, every variant,
# 12 steps, run seeds 0 and 1; the step records of its runs' metrics.jsonl) and the engine benchmark of that card
# (results/engine/engine-cuda.json, the Qwen2.5-0.5B rows)
REPEATS = "results/schedules-gpu-repeats"
SEED0_BASELINES = (23680, 16624, 30144, 29800, 38104, 26272, 23424, 13840, 44936, 18384, 16776, 21200)
SEED1_BASELINES = (23032, 35160, 31352, 32152, 20760, 42032, 28632, 27352, 25352, 32376, 23584, 43584)


def _run(
    seed: int,
    variant: str,
    tok_s: float,
    stale: int,
    repacks: int,
    reprefill: int,
    tokens: tuple[int, ...],
    window: tuple[float, float],
) -> tuple[str, MeasuredRun]:
    return variant, MeasuredRun(
        f"{REPEATS}/seed{seed}/{variant}", tok_s, stale, repacks, reprefill, tokens, window
    )


SMALL_GPU = ScheduleCalibration(
    cost=replace(
        CostModel.h200(),
        decode_mem_eff=0.20084808899870377,
        step_overhead_s=0.0009598717044414139,
        train_mfu=0.7602306585318575,
        train_step_overhead_s=2.289439036911128,
        global_sync_overhead_s=0.5744318348466533,
        publish_bw=35360819451.32413,
        relay_link_bw=1221137726.4313898,
        pull_overhead_s=0.0289384844946811,
        repack_overhead_s=0.028988491899991684,
    ),
    notes={
        "decode_mem_eff": "0.201 of 4.8 TB/s: fit to results/engine/engine-cuda.json qwen2.5-0.5b, 7 batch sizes "
        "<= 64",
        "step_overhead_s": "0.96 ms: same fit (kernel launches of a small model)",
        "train_step_overhead_s": "2.289 s: fixed part of step_time_s = fixed + per_token x tokens, least squares "
        "over 154 steps (step >= 2) of the 14 runs' metrics.jsonl under results/schedules-gpu-repeats/seed0 and "
        "results/schedules-gpu-repeats/seed1 (13,840-50,928 tokens a step, mean 2.40 s, residual sd 0.29 s, "
        "correlation with tokens 0.12; step 1 averages 3.08 s, CUDA warm-up, not modelled)",
        "train_mfu": "0.760 (752 TFLOP/s achieved): per-token part of the same fit, 3.9 +- 2.6 us a token (1 s.e.)",
        "global_sync_overhead_s": "0.574 s: mean actor stall 0.631 s of the four baselines' steps >= 4 (step "
        "records' stall_s; their steps 1-3 average 1.25 s, warm-up)",
        "publish_bw": "35.4 GB/s: mean actor stall 0.028 s over steps >= 4 of the 4 relay runs (laminar, "
        "laminar-norepack)",
        "relay_link_bw": "1.22 GB/s: their mean relay propagation 0.803 s",
        "pull_overhead_s": "0.029 s: mean pull 0.047 s over all 14 runs",
        "repack_overhead_s": "0.029 s: mean overhead of a repack round that moved something",
    },
    trainer_fixed_s=2.289439036911128,
    window_sd_s=0.09112948869348808,
    # per run: training tokens/s, staleness max, repack rounds, re-prefilled tokens, tokens of each step, mean
    # trainer step over steps > 3 (measured, fitted)
    runs=(
        dict(
            [
                _run(0, "laminar", 10876.96, 5, 10, 35112,
                     (11008, 15112, 28792, 45336, 23784, 31192, 24680, 21984, 15584, 17312, 47200, 21200),
                     (2.475, 2.397)),
                _run(0, "laminar-globalpush", 9608.2, 5, 9, 44576,
                     (11008, 15576, 28328, 45336, 23784, 40592, 23424, 13840, 15608, 31600, 32888, 21200),
                     (2.243, 2.397)),
                _run(0, "laminar-norepack", 11493.91, 5, 0, 0,
                     (11008, 16512, 27392, 45336, 23784, 31192, 32824, 13840, 15608, 31600, 32888, 21200),
                     (2.341, 2.397)),
                _run(0, "one_step", 7147.96, 1, 0, 0, SEED0_BASELINES, (2.476, 2.391)),
                _run(0, "partial", 7418.45, 2, 0, 43520, SEED0_BASELINES, (2.733, 2.391)),
                _run(0, "stream", 8186.51, 2, 0, 0, SEED0_BASELINES, (2.479, 2.391)),
                _run(0, "sync", 4536.8, 0, 0, 0, SEED0_BASELINES, (2.417, 2.391)),
            ]
        ),
        dict(
            [
                _run(1, "laminar", 12376.71, 5, 10, 54888,
                     (12848, 25768, 27072, 36960, 26936, 45192, 38344, 27352, 25352, 21496, 25416, 43728),
                     (2.547, 2.416)),
                _run(1, "laminar-globalpush", 10294.19, 4, 12, 49016,
                     (12848, 25768, 50928, 19440, 33472, 42032, 28632, 27352, 25352, 21496, 25416, 43728),
                     (2.256, 2.405)),
                _run(1, "laminar-norepack", 14053.56, 4, 0, 0,
                     (16064, 27640, 30480, 34800, 33472, 32944, 23496, 41576, 25352, 21496, 25416, 36448),
                     (2.115, 2.409)),
                _run(1, "one_step", 9466.26, 1, 0, 0, SEED1_BASELINES, (2.38, 2.409)),
                _run(1, "partial", 9050.12, 2, 0, 62720, SEED1_BASELINES, (2.642, 2.409)),
                _run(1, "stream", 10029.96, 2, 0, 0, SEED1_BASELINES, (2.412, 2.409)),
                _run(1, "sync", 5709.35, 0, 0, 0, SEED1_BASELINES, (2.112, 2.409)),
            ]
        ),
    ),
)  # fmt: skip
