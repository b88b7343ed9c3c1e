"""Discrete-event cluster simulator: every schedule at 64 to 1024 GPUs over a calibrated cost model.

cost.py (all constants, roofline times) -> lengths.py (workload) -> replica.py (continuous batching at
trajectory granularity) -> cluster.py (clock, trainer, buffer, weight paths) -> schedules.py (the runtime's
schedule value, `laminar.schedules.Schedule`, for sync, one_step, stream, partial, laminar and its ablations, run
by the runtime's loop, plus the colocated verl; repack with `laminar.manager.repack.plan_repack`) ->
metrics.py / plots.py -> experiment.py (paper grid, planner, benchmark) -> cli.py (`laminar simulate`).
"""
