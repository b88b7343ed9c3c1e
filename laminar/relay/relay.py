"""A relay: one process per machine holding the newest complete weight version in shared memory.

Versions arrive chunk by chunk, over TCP from the upstream relay, or (master relay) from the trainer's publish
slot. Each chunk lands in a slot, is checked against its CRC and handed to the forwarder at once, so the chain is
pipelined. A version is exposed to readers (`latest`, `acquire`, `wait_version`) only after every chunk arrived
and matched. Plain class so it runs and tests without Ray; `RelayActor` is the Ray wrapper.
"""

from __future__ import annotations

import hmac
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
from laminar.relay.admission import Handshakes, Pending
from laminar.relay.forward import Address, Forwarder
from laminar.relay.slots import READY, SHM_DIR, WRITING, MappedView, Slot, SlotPool, is_slot_name
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


@dataclass
class _Offer:
    version: int
    path: str
    nbytes: int
    layout: Any
    pieces: int = 0  # byte ranges of this version that trainer ranks on other machines send (`piece`)
    done: bool = False
    streamed: bool = False
    error: str | None = None


def node_ip() -> str:
    return ray.util.get_node_ip_address() if ray.is_initialized() else "127.0.0.1"


class Relay:
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
        self._offer: _Offer | None = None
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
    def ingest(
        self, version: int, path: str, nbytes: int, layout: Any, timeout: float = 600.0, pieces: int = 0
    ) -> bool:
        """Take a published version from the trainer's slot; returns once the slot is no longer read.

        The publisher keeps this call's ObjectRef per slot and reuses the slot when it resolves, so the trainer
        never waits on the chain. An offer not yet started is superseded by a newer one (returns False).
        `pieces`: how many `piece` calls carry the rows of trainer ranks on other machines (a trainer spanning
        machines); the version is assembled from the slot and them, and exposed only once every one is in.
        """
        offer = _Offer(version, path, nbytes, layout, pieces)
        deadline = time.monotonic() + timeout
        with self._cond:
            if self._offer is not None:
                self._offer.done = True  # superseded before it was read
            self._offer = offer
            self._cond.notify_all()
            while not offer.done:
                left = deadline - time.monotonic()
                if left <= 0:
                    raise TimeoutError(f"relay {self.name}: version {version} not read within {timeout:.1f}s")
                self._cond.wait(left)
        if offer.error:
            raise RuntimeError(offer.error)
        return offer.streamed

    def piece(self, version: int, ranges: list[tuple[int, int]], data: np.ndarray) -> None:
        """Rows of `version` from a trainer rank on another machine: `ranges` (offset, length) in the flat layout,
        their bytes back to back in `data` (which Ray fetched from that machine's object store)."""
        data = np.asarray(data).reshape(-1).view(np.uint8)
        total = sum(n for _, n in ranges)
        if total != data.nbytes or any(o < 0 or n < 0 for o, n in ranges):
            raise ValueError(
                f"piece of version {version}: ranges cover {total} bytes, data has {data.nbytes}"
            )
        with self._cond:
            newest = self._pool.newest()
            if newest is not None and version <= newest.version:
                return  # a version already held or passed: its offer is gone
            self._pieces.setdefault(version, []).append((list(ranges), data))
            self._counters["pieces"] += 1
            self._cond.notify_all()

    def _take_pieces(self, offer: _Offer) -> list[tuple[int, int, np.ndarray]]:
        """Wait (up to the slot timeout) for the offer's pieces; then (offset, length, bytes) segments, by offset.
        Pieces of older versions are dropped."""
        deadline = time.monotonic() + self._slot_timeout
        with self._cond:
            while len(self._pieces.get(offer.version, ())) < offer.pieces:
                left = deadline - time.monotonic()
                if left <= 0 or self._stopped:
                    got = len(self._pieces.get(offer.version, ()))
                    raise TimeoutError(
                        f"version {offer.version}: {got} of the {offer.pieces} pieces from trainer ranks on other "
                        f"machines came in {self._slot_timeout:.0f}s"
                    )
                self._cond.wait(left)
            pieces = self._pieces.pop(offer.version, [])
            for v in [v for v in self._pieces if v < offer.version]:
                del self._pieces[v]
        segments = []
        for ranges, data in pieces:
            at = 0
            for off, n in ranges:
                if off + n > offer.nbytes:
                    raise ValueError(
                        f"version {offer.version}: a piece's range {off}+{n} passes {offer.nbytes} bytes"
                    )
                segments.append((off, n, data[at : at + n]))
                at += n
        return sorted(segments, key=lambda seg: seg[0])

    def _ingest_loop(self) -> None:
        while True:
            with self._cond:
                while self._offer is None and not self._stopped:
                    self._cond.wait(timeout=1.0)
                if self._stopped:
                    return
                offer, self._offer = self._offer, None
            try:
                self._ingest(offer)
                offer.streamed = True
            except Exception as e:  # noqa: BLE001 - reported to the publisher through its ObjectRef
                offer.error = f"relay {self.name}: ingest of version {offer.version} failed: {e!r}"
                self._count("ingest_errors")
                log.warning(offer.error)
            with self._cond:
                offer.done = True
                self._cond.notify_all()

    def _ingest(self, offer: _Offer) -> None:
        """Copy and checksum the trainer's slot on several threads (both release the GIL), hand each chunk to the
        forwarder as soon as it and all before it are in, then sign the version for the chain."""
        newest = self._pool.newest()
        if newest is not None and newest.version >= offer.version:
            raise ValueError(f"version {offer.version} is not newer than held version {newest.version}")
        segments = self._take_pieces(offer) if offer.pieces else []
        blob = wire.encode_layout(offer.layout)
        self._reap_leases()
        with MappedView(offer.path, offer.nbytes) as src:
            slot = self._pool.claim(
                offer.version, offer.nbytes, offer.layout, self._chunk_bytes, self._slot_timeout, blob
            )
            self._forwarder.enqueue(slot)

            def copy(i: int) -> None:
                off, n = slot.chunk(i)
                dst = slot.buffer.array[off : off + n]
                np.copyto(dst, src.array[off : off + n])
                for s_off, s_n, data in segments:  # rows of ranks on other machines, over the slot's bytes
                    lo, hi = max(off, s_off), min(off + n, s_off + s_n)
                    if lo < hi:
                        np.copyto(dst[lo - off : hi - off], data[lo - s_off : hi - s_off])
                self._pool.chunk_done(slot, i, wire.checksum(dst))

            try:
                for f in [self._copiers.submit(copy, i) for i in range(slot.nchunks)]:
                    f.result()
            except BaseException:
                self._pool.abort(slot)
                raise
        self._pool.sign(slot, self._digest(slot))
        self._finish(slot, "publish")

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
    def _accept_loop(self) -> None:
        """Also the handshakes' clock: it wakes at the oldest pending one's deadline (deadlines follow the order
        of admission, which is this loop's) and cuts it short."""
        while not self._stopped:
            next_deadline = self._handshakes.expire(time.monotonic())
            self._server.settimeout(min(1.0, max(0.01, next_deadline)))
            try:
                conn, peer = self._server.accept()
            except TimeoutError:
                continue
            except OSError:
                return  # server closed
            conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            ticket = self._handshakes.admit(conn, peer, time.monotonic())
            threading.Thread(
                target=self._receive_loop, args=(conn, peer, ticket), name=f"{self.name}-recv", daemon=True
            ).start()

    def _refuse(self, conn: socket.socket, peer: Any, reason: str) -> None:
        """Drop a peer that broke the protocol, or ran out of time or room to authenticate; counted, and logged
        with its address."""
        conn.close()
        with self._cond:
            self._counters["refused_connections"] += 1
            self._refusals.append({"peer": f"{peer[0]}:{peer[1]}", "reason": reason, "t": time.time()})
            self._cond.notify_all()
        log.warning("%s: refused connection from %s:%s: %s", self.name, peer[0], peer[1], reason)

    def _is_upstream(self, name: str) -> bool:
        with self._cond:
            return self._upstream is not None and name == self._upstream

    def _wants(self, version: int) -> bool:
        """Anything newer than what is exposed. The same version may also be arriving from an old upstream
        that hangs; taking it again from the new one costs a slot, and the first to finish wins."""
        with self._cond:
            newest = self._pool.newest()
            return newest is None or newest.version < version

    def _authenticate(self, conn: socket.socket, peer: Any, ticket: Pending) -> socket.socket | None:
        """The handshake, within the deadline the accept loop enforces: the authenticated link, or None (refused)."""
        link, failure = conn, None
        try:
            # a backstop to the accept loop: a read that runs out does so past the deadline; `finish` says so
            conn.settimeout(self._handshakes.timeout)
            if self._tls_server is not None:
                # on a duplicate: TLS takes over the socket it wraps, and the accept loop must still be able to
                # shut `conn` down at the deadline
                link = self._tls_server.wrap_socket(conn.dup(), server_side=True)
            wire.accept_handshake(link, self._secret, self._is_upstream)
            wire.tune(link, None)
        except (OSError, wire.ConnectionLost) as e:
            failure = f"handshake failed: {e}"
        dropped = self._handshakes.finish(ticket, time.monotonic())
        if link is not conn:
            conn.close()
        if dropped is not None or failure is not None:
            self._refuse(link, peer, dropped or failure)
            return None
        return link

    def _receive_loop(self, sock: socket.socket, peer: Any, ticket: Pending) -> None:
        conn = self._authenticate(sock, peer, ticket)
        if conn is None:
            return
        scratch = memoryview(bytearray(1 << 20))
        slot: Slot | None = None
        version, last = -1, -1
        try:
            while not self._stopped:
                wire.set_io_timeout(conn, None)  # idle between versions for as long as training takes
                kind, version, nbytes, chunk_bytes = wire.recv_header(conn)
                wire.set_io_timeout(conn, 60.0)
                if kind != wire.BEGIN:
                    raise wire.Refused(f"expected BEGIN, got {kind!r}")
                wire.check_begin(
                    version, nbytes, chunk_bytes, last_version=last, max_bytes=self._max_version_bytes
                )
                last = version
                blob = wire.recv_layout_blob(conn)
                layout = wire.decode_layout(blob, nbytes)
                source = self._map_upstream_slot(wire.recv_local_path(conn), nbytes)
                slot = None
                if self._wants(version):
                    self._reap_leases()
                    try:
                        slot = self._pool.claim(
                            version, nbytes, layout, chunk_bytes, self._slot_timeout, blob
                        )
                    except TimeoutError as e:
                        log.warning("%s: skipping version %d: %s", self.name, version, e)
                if slot is None:
                    if source is not None:
                        source.close()
                    conn.sendall(wire.SKIP)
                    self._count("skipped")
                    continue
                conn.sendall(wire.ACCEPT if source is None else wire.LOCAL)
                self._forwarder.enqueue(slot)
                if source is None:
                    self._receive_version(conn, slot, scratch)
                else:
                    try:
                        self._copy_version(conn, slot, source)
                    finally:
                        source.close()
                slot = None
        except wire.Refused as e:
            if slot is not None:
                self._abort_if_writing(slot, slot.version)
            self._refuse(conn, peer, str(e))
        except (OSError, wire.ConnectionLost) as e:
            if slot is not None and self._abort_if_writing(slot, version):
                log.info("%s: upstream lost during version %d: %r", self.name, version, e)
        finally:
            conn.close()

    def _map_upstream_slot(self, path: str, nbytes: int) -> MappedView | None:
        """The upstream's slot, when it offered one and it is a slot file of this machine's shared memory."""
        if not path or not self._local_shm or self._tls_server is not None:
            return None
        real = os.path.realpath(path)
        if os.path.dirname(real) != os.path.realpath(SHM_DIR) or not is_slot_name(os.path.basename(real)):
            raise wire.Refused(f"offered slot path {path!r} is not a Laminar slot in {SHM_DIR}")
        try:
            if os.stat(real).st_size < nbytes:
                return None
            return MappedView(real, nbytes, shared=True)
        except OSError:
            return None  # another machine after all: take the bytes over the socket

    def _copy_version(self, conn: socket.socket, slot: Slot, source: MappedView) -> None:
        """Chunks from the upstream's slot on this machine: each CHUNK frame says a chunk is ready there; the
        copy and checksum run on the copy threads, and DONE tells the upstream we no longer read its slot."""
        pending: list[Any] = []
        bad: list[int] = []

        def copy(i: int, crc: int) -> None:
            off, n = slot.chunk(i)
            dst = slot.buffer.array[off : off + n]
            np.copyto(dst, source.array[off : off + n])
            if wire.checksum(dst) != crc:
                bad.append(i)
            else:
                self._pool.chunk_done(slot, i, crc)

        try:
            expected = 0
            while True:
                kind, a, b, c = wire.recv_header(conn)
                if kind == wire.CHUNK:
                    if a != expected or slot.chunk(min(a, slot.nchunks - 1))[1] != c or a >= slot.nchunks:
                        raise wire.Refused(f"chunk {a} of {c} bytes, expected chunk {expected}")
                    pending.append(self._copiers.submit(copy, a, b))
                    expected += 1
                    continue
                for f in pending:
                    f.result()
                if kind == wire.END:
                    digest = wire.recv_exact(conn, wire.MAC_BYTES)
                    self._end_version(slot, digest, bad, "upstream, shared memory")
                    return
                if kind == wire.ABORT:
                    self._abort_if_writing(slot, slot.version)
                    return
                raise wire.Refused(f"unexpected frame {kind!r} inside a version")
        finally:
            for f in pending:
                f.cancel()
            for f in pending:
                if not f.cancelled():
                    f.exception()  # wait: the copy must be over before the upstream may reuse its slot
            try:
                conn.sendall(wire.DONE)
            except OSError:
                pass  # the upstream is gone; what went wrong is already on its way up

    def _end_version(self, slot: Slot, digest: bytes, bad: list[int], source: str) -> None:
        """Expose the version if every chunk checked out and the digest verifies; else it stays hidden."""
        if bad:
            log.warning("%s: version %d chunks %s failed their checksum", self.name, slot.version, bad)
            self._count("crc_errors")
            self._abort_if_writing(slot, slot.version)
            return
        if slot.ready_chunks != slot.nchunks:
            raise wire.Refused(f"END after {slot.ready_chunks} of {slot.nchunks} chunks")
        if not hmac.compare_digest(digest, self._digest(slot)):
            self._count("digest_errors")
            raise wire.Refused(f"version {slot.version}: its digest does not verify; not exposed")
        self._pool.sign(slot, digest)
        self._finish(slot, source)

    def _receive_version(self, conn: socket.socket, slot: Slot, scratch: memoryview) -> None:
        ok = True
        while True:
            kind, a, b, c = wire.recv_header(conn)
            if kind == wire.CHUNK:
                index, crc, n = a, b, c
                if ok and (index != slot.ready_chunks or slot.chunk(index)[1] != n):
                    raise wire.Refused(
                        f"chunk {index} of {n} bytes, expected chunk {slot.ready_chunks} "
                        f"of {slot.chunk(slot.ready_chunks)[1]} bytes"
                    )
                if not ok:
                    if not 0 <= n <= slot.chunk_bytes:
                        raise wire.Refused(
                            f"chunk of {n} bytes in a version of {slot.chunk_bytes}-byte chunks"
                        )
                    wire.drain(conn, n, scratch)
                    continue
                view = slot.view(index)
                wire.recv_into_exact(conn, memoryview(view))
                if wire.checksum(view) != crc:
                    log.warning("%s: version %d chunk %d failed its checksum", self.name, slot.version, index)
                    self._count("crc_errors")
                    self._abort_if_writing(slot, slot.version)
                    ok = False
                    continue
                self._pool.chunk_done(slot, index, crc)
            elif kind == wire.END:
                digest = wire.recv_exact(conn, wire.MAC_BYTES)
                if ok:
                    self._end_version(slot, digest, [], "upstream, tcp")
                return
            elif kind == wire.ABORT:
                if ok:
                    self._abort_if_writing(slot, slot.version)
                return
            else:
                raise wire.Refused(f"unexpected frame {kind!r} inside a version")

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
