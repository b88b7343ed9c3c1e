"""Relay tests use the session's shared `ray_cluster` (tests/conftest.py): three nodes on this machine.

Ray resolves a 127.0.0.1 bootstrap address to the machine's outward IP unless cluster mode is told to stay on
loopback; without this the driver looks for a loopback-bound GCS on the outward IP and hangs.
"""

from __future__ import annotations

import os

os.environ.setdefault("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER", "0")
