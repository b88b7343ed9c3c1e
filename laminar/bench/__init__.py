"""Benchmarks (`laminar bench engine | relay | schedules`): commands that measure the parts and write JSON,
tables and plots under a results folder. Nothing in the core packages imports them."""
