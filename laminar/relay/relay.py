"""A relay: one process per machine holding the newest complete weight version in shared memory.

Versions arrive chunk by chunk, over TCP from the upstream relay, or (master relay) from the trainer's publish
slot. Each chunk lands in a slot, is checked against its CRC and handed to the forwarder at once, so the chain is
pipelined. A version is exposed to readers (`latest`, `acquire`, `wait_version`) only after every chunk arrived
and matched. Plain class so it runs and tests without Ray; `RelayActor` is the Ray wrapper.
"""

from __future__ import annotations

import itertools
import logging
import os
import secrets
import socket
import threading
import time
from collections import deque
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

import numpy as np
import ray

from laminar.relay import wire
from laminar.relay.admission import Handshakes
from laminar.relay.forward import Address, Forwarder
from laminar.relay.ingest import Ingest, Offer
from laminar.relay.receive import Receiving
from laminar.relay.slots import READY, SHM_DIR, WRITING, Slot, SlotPool
from laminar.relay.tls import RunCertificate

log = logging.getLogger(__name__)

DEFAULT_CHUNK_BYTES = 4 << 20
HANDSHAKE_TIMEOUT_S = 10.0  # for the whole handshake, TLS included (admission.py)
MAX_PENDING_HANDSHAKES = 16  # connections not yet authenticated; a newcomer displaces the oldest
MAX_PENDING_PER_ADDRESS = 4  # of them from one source address


@dataclass(frozen=True)
class RelaySettings:
    """What every relay of one run shares: made once by the driver, handed to each relay (and each replacement)
    through Ray, never over the relay link. `secret` authenticates links and versions (wire.py)."""

    secret: bytes
    num_slots: int = 3
    chunk_bytes: int = DEFAULT_CHUNK_BYTES
    tls: RunCertificate | None = None  # relay.tls: links also run over mutual TLS with this certificate

    @classmethod
    def for_run(
        cls, num_slots: int = 3, chunk_bytes: int = DEFAULT_CHUNK_BYTES, tls: bool = False
    ) -> RelaySettings:
        return cls(secrets.token_bytes(32), num_slots, chunk_bytes, RunCertificate.make() if tls else None)

    def kwargs(self) -> dict[str, Any]:
        return {
            "secret": self.secret,
            "num_slots": self.num_slots,
            "chunk_bytes": self.chunk_bytes,
            "tls": self.tls,
        }


@dataclass
class Lease:
    """A reader's claim on one slot: the slot is not overwritten until `release(lease_id)`."""

    lease_id: int
    version: int
    path: str
    nbytes: int
    layout: Any


def node_ip() -> str:
    return ray.util.get_node_ip_address() if ray.is_initialized() else "127.0.0.1"


class Relay(Ingest, Receiving):
    def __init__(
        self,
        name: str = "relay",
        *,
        secret: bytes,
        host: str | None = None,
        num_slots: int = 3,
        chunk_bytes: int = DEFAULT_CHUNK_BYTES,
        slot_timeout: float = 30.0,
        lease_ttl: float = 300.0,
        max_version_bytes: int | None = None,
        copy_threads: int | None = None,
        tls: RunCertificate | None = None,
        local_shm: bool = True,
        handshake_timeout: float = HANDSHAKE_TIMEOUT_S,
        pending_handshakes: int = MAX_PENDING_HANDSHAKES,
        pending_per_address: int = MAX_PENDING_PER_ADDRESS,
    ):
        """`secret`: the run's relay secret (RelaySettings); `max_version_bytes`: the largest version a BEGIN
        may announce (default: the size of the shared-memory filesystem); `copy_threads`: the master's
        parallel copy and checksum (default: up to 8, one per core); `local_shm`: between two relays of one
        machine, copy chunks through shared memory instead of TCP (never under TLS); `handshake_timeout`,
        `pending_handshakes`, `pending_per_address`: what an unauthenticated connection may hold (admission.py)."""
        if not wire.MIN_CHUNK_BYTES <= chunk_bytes <= wire.MAX_CHUNK_BYTES:
            raise ValueError(
                f"chunk_bytes={chunk_bytes}: must be {wire.MIN_CHUNK_BYTES} to {wire.MAX_CHUNK_BYTES} bytes"
            )
        if not isinstance(secret, bytes) or len(secret) < 16:
            raise ValueError(
                "secret: the run's relay secret must be at least 16 random bytes (RelaySettings)"
            )
        self.name = name
        self._secret = secret
        self._chunk_bytes = chunk_bytes
        self._slot_timeout = slot_timeout
        self._lease_ttl = lease_ttl
        if max_version_bytes is None:
            st = os.statvfs(SHM_DIR)
            max_version_bytes = st.f_blocks * st.f_frsize
        self._max_version_bytes = max_version_bytes
        self._copiers = ThreadPoolExecutor(
            copy_threads or min(8, os.cpu_count() or 1), thread_name_prefix=f"{name}-copy"
        )
        self._pool = SlotPool(name, num_slots)
        self._cond = self._pool.cond
        self._tls_server, tls_client = tls.contexts() if tls is not None else (None, None)
        self._server = socket.create_server((host or node_ip(), 0))
        self._server.settimeout(1.0)
        self._local_shm = local_shm
        self._forwarder = Forwarder(
            self._pool, name, secret, tls_client, local_host=self.address()[0] if local_shm else None
        )
        self._upstream: str | None = None  # the only relay name this one accepts versions from
        self._leases: dict[int, tuple[Slot, float]] = {}
        self._lease_ids = itertools.count(1)
        self._history: dict[int, dict[str, Any]] = {}
        self._counters = {
            "received": 0,
            "skipped": 0,
            "aborted": 0,
            "crc_errors": 0,
            "digest_errors": 0,
            "ingest_errors": 0,
            "refused_connections": 0,
            "pieces": 0,
        }
        # version -> pieces of it from trainer ranks on other machines: (ranges, their bytes back to back)
        self._pieces: dict[int, list[tuple[list[tuple[int, int]], np.ndarray]]] = {}
        self._refusals: deque[dict[str, Any]] = deque(maxlen=100)
        self._handshakes = Handshakes(pending_handshakes, pending_per_address, handshake_timeout)
        self._stopped = False
        self._offer: Offer | None = None
        self._threads = [
            threading.Thread(target=self._accept_loop, name=f"{name}-accept", daemon=True),
            threading.Thread(target=self._ingest_loop, name=f"{name}-ingest", daemon=True),
        ]
        for t in self._threads:
            t.start()

    # ---- chain --------------------------------------------------------------------------------------------
    def address(self) -> Address:
        host, port = self._server.getsockname()[:2]
        return host, port

    def set_downstream(self, addr: Address | None) -> None:
        """Point this relay at the next one in the chain (None: last); the manager orders the chain."""
        self._forwarder.set_downstream(tuple(addr) if addr is not None else None)  # type: ignore[arg-type]

    def set_upstream(self, name: str | None) -> None:
        """The one relay (by name) this relay takes versions from; set before that relay is pointed here."""
        with self._cond:
            self._upstream = name

    def ping(self) -> dict[str, Any]:
        newest = self._pool.newest()
        return {
            "name": self.name,
            "pid": os.getpid(),
            "address": self.address(),
            "latest": newest and newest.version,
        }

    # ---- readers ------------------------------------------------------------------------------------------
    def newest_version(self) -> int | None:
        """The newest complete version here: the cheap question a generating replica asks (no layout)."""
        with self._cond:
            s = self._pool.newest()
            return None if s is None else s.version

    def wait_version(self, version: int, timeout: float) -> int:
        """Block until a version >= `version` is complete here; returns the version now held."""
        deadline = time.monotonic() + timeout
        with self._cond:
            while (s := self._pool.newest()) is None or s.version < version:
                left = deadline - time.monotonic()
                if left <= 0 or self._stopped:
                    have = None if s is None else s.version
                    raise TimeoutError(
                        f"relay {self.name}: version {version} did not arrive within {timeout:.1f}s (holds {have})"
                    )
                self._cond.wait(left)
            return s.version

    def acquire(
        self, min_version: int | None = None, *, version: int | None = None, timeout: float = 0.0
    ) -> Lease | None:
        """Pin the newest complete version (>= min_version), or exactly `version`; None if none within timeout."""
        with self._cond:
            if version is not None:
                s = self._pool.find(version)
                if s is None or s.state != READY:
                    raise LookupError(
                        f"relay {self.name} holds versions {self._pool.held_versions()}; "
                        f"version {version} is not among them"
                    )
            else:
                deadline = time.monotonic() + timeout
                while (s := self._pool.newest()) is None or (
                    min_version is not None and s.version < min_version
                ):
                    left = deadline - time.monotonic()
                    if left <= 0 or self._stopped:
                        return None
                    self._cond.wait(left)
            self._pool.acquire(s)
            lease_id = next(self._lease_ids)
            self._leases[lease_id] = (s, time.monotonic())
            return Lease(lease_id, s.version, s.buffer.path, s.nbytes, s.layout)

    def release(self, lease_id: int) -> None:
        with self._cond:
            entry = self._leases.pop(lease_id, None)
            if entry is None:
                raise KeyError(
                    f"relay {self.name}: lease {lease_id} is not held (released twice, expired, or never acquired)"
                )
            self._pool.release(entry[0])

    def _reap_leases(self) -> None:
        """Readers that died holding a lease must not pin a slot forever."""
        now = time.monotonic()
        with self._cond:
            for lease_id, (slot, t) in list(self._leases.items()):
                if now - t > self._lease_ttl:
                    log.warning("%s: lease %d on version %d expired", self.name, lease_id, slot.version)
                    del self._leases[lease_id]
                    self._pool.release(slot)

    # ---- stats --------------------------------------------------------------------------------------------
    def stats(self) -> dict[str, Any]:
        with self._cond:
            newest = self._pool.newest()
            return {
                "name": self.name,
                "address": self.address(),
                "downstream": self._forwarder.downstream,
                "downstream_error": self._forwarder.error,
                "latest": None if newest is None else newest.version,
                "held": self._pool.held_versions(),
                "leases": len(self._leases),
                "forwarded": list(self._forwarder.sent),
                "versions": {v: dict(h) for v, h in self._history.items()},
                "upstream": self._upstream,
                "refusals": list(self._refusals),
                "pending_handshakes": self._handshakes.pending(),
                **self._counters,
            }

    def _record(self, slot: Slot, source: str) -> None:
        self._history[slot.version] = {
            "t_begin": slot.t_begin,
            "t_complete": slot.t_complete,
            "bytes": slot.nbytes,
            "chunks": slot.nchunks,
            "source": source,
        }
        if len(self._history) > 1000:
            del self._history[min(self._history)]

    # ---- arrival: master relay, from the trainer's publish slot --------------------------------------------
    def _digest(self, slot: Slot) -> bytes:
        return wire.version_digest(
            self._secret, slot.version, slot.nbytes, slot.chunk_bytes, slot.layout_blob, slot.crcs
        )

    def _finish(self, slot: Slot, source: str) -> None:
        with self._cond:
            if self._pool.complete(slot):
                self._counters["received"] += 1
                self._record(slot, source)
            else:
                self._counters["skipped"] += 1

    def _count(self, key: str) -> None:
        with self._cond:
            self._counters[key] += 1
            self._cond.notify_all()

    def _abort_if_writing(self, slot: Slot, version: int) -> bool:
        """Abort a partial version unless the slot already moved on (it may be reused once aborted)."""
        with self._cond:
            if slot.state != WRITING or slot.version != version:
                return False
            self._pool.abort(slot)
            self._counters["aborted"] += 1
            return True

    # ---- arrival: from the upstream relay over TCP ----------------------------------------------------------
    # ---- shutdown -----------------------------------------------------------------------------------------
    def shutdown(self) -> None:
        """Stop threads, close sockets and unlink the slots."""
        with self._cond:
            self._stopped = True
            self._cond.notify_all()
        try:
            self._server.shutdown(socket.SHUT_RDWR)  # wakes the blocked accept()
        except OSError:
            pass
        self._server.close()
        self._handshakes.close()
        self._forwarder.stop()
        for t in self._threads:
            t.join(timeout=5.0)
        self._copiers.shutdown(wait=True)
        self._pool.close()


@ray.remote(num_cpus=0, max_concurrency=64)
class RelayActor(Relay):
    """The relay as a Ray actor; concurrent calls run on threads beside the receive and forward threads."""
