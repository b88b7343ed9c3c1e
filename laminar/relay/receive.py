"""A relay's arrival from upstream: connections admitted only after the run's handshake (TLS when set), from the
one upstream relay the manager named; each version's chunks checked against their CRC as they land, the whole
against its digest, and forwarded downstream chunk by chunk (copied through shared memory between two relays of
one machine)."""

from __future__ import annotations

import hmac
import logging
import os
import socket
import threading
import time
from typing import Any

import numpy as np

from laminar.relay import wire
from laminar.relay.admission import Pending
from laminar.relay.slots import SHM_DIR, MappedView, Slot, is_slot_name

log = logging.getLogger(__name__)


class Receiving:
    """`Relay`'s arrival over TCP (its server socket, handshakes, slot pool and forwarder)."""

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
