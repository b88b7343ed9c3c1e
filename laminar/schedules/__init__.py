"""Schedules: one value (`schedule.py`) built from the config and run by one loop; `bench.py` compares them."""

from laminar.schedules.schedule import NAMES, Schedule

__all__ = ["NAMES", "Schedule"]
