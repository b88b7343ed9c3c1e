"""What a test's run of the real runtime leaves out unless it checks it: the PNG plots (drawn by the one run that
checks them, `test_end_to_end`) and a second reward worker process a replica (only the reward-fault tests need
a call to wait while another runs). Each costs a run a CPU-second or more on a 2-core machine."""

QUICK = ("run.plots=false", "task.reward_processes=1")
