"""The downstream link of a relay: sends each version's chunks as soon as they are in the local slot.

One thread owns the connection. It sends chunk i the moment the receiver marked it verified, so a relay forwards
chunk i while chunk i+1 is still arriving (the pipelined chain). With no downstream, or after the downstream
died, versions are simply not queued; when the manager links a new downstream, the newest complete version is
offered to it first so it catches up.
"""

from __future__ import annotations

import logging
import socket
import ssl
import threading
from collections import deque

from laminar.relay import wire
from laminar.relay.slots import ABORTED, READY, WRITING, Slot, SlotPool

log = logging.getLogger(__name__)

Address = tuple[str, int]


class _Relinked(Exception):
    """The manager pointed this relay at another downstream while a version was on its way."""


class Forwarder:
    def __init__(
        self,
        pool: SlotPool,
        name: str,
        secret: bytes,
        tls: ssl.SSLContext | None = None,
        io_timeout: float = 60.0,
        local_host: str | None = None,
    ):
        """`local_host`: this relay's address; a downstream at the same address shares this machine's memory
        and copies each chunk from our slot instead of reading it off the socket (None: never offered)."""
        self._pool = pool
        self._secret = secret
        self._tls = tls
        self._local_host = local_host
        self._cond = pool.cond  # the receiver's chunk_done wakes us through the pool's condition
        self._name = name
        self._io_timeout = io_timeout
        self._addr: Address | None = None
        self._gen = 0
        self._jobs: deque[Slot] = deque()  # each holds one reader count on its slot
        self._stopped = False
        self._sock: socket.socket | None = None
        self.error: str | None = None
        self.sent: list[int] = []
        self.skipped_by_downstream: list[int] = []
        self._thread = threading.Thread(target=self._run, name=f"{name}-forward", daemon=True)
        self._thread.start()

    @property
    def downstream(self) -> Address | None:
        return self._addr

    def set_downstream(self, addr: Address | None) -> None:
        with self._cond:
            if addr == self._addr and self.error is None:
                return
            self._addr = addr
            self._gen += 1
            self.error = None
            if self._sock is not None:
                try:  # a send blocked on a hung downstream returns at once instead of at the I/O timeout
                    self._sock.shutdown(socket.SHUT_RDWR)
                except OSError:
                    pass
            if addr is None:
                self._drop_all()
            elif not self._jobs:
                # Catch the new downstream up: the newest complete version, then any newer one still arriving.
                newest = self._pool.newest()
                floor = -1 if newest is None else newest.version
                arriving = sorted(
                    (s for s in self._pool.slots if s.state == WRITING and s.version > floor),
                    key=lambda s: s.version,
                )
                for slot in ([newest] if newest is not None else []) + arriving:
                    self._push(slot)
            self._cond.notify_all()

    def enqueue(self, slot: Slot) -> None:
        """Queue a version that has begun arriving (or is complete) for the downstream."""
        with self._cond:
            if self._addr is not None and self.error is None:
                self._push(slot)
                self._cond.notify_all()

    def stop(self) -> None:
        with self._cond:
            self._stopped = True
            self._drop_all()
            self._cond.notify_all()
        self._thread.join(timeout=5.0)

    def _push(self, slot: Slot) -> None:
        self._pool.acquire(slot)
        self._jobs.append(slot)

    def _drop_all(self) -> None:
        while self._jobs:
            self._pool.release(self._jobs.popleft())

    def _next_job(self) -> tuple[Slot, int, Address | None] | None:
        with self._cond:
            while not self._jobs and not self._stopped:
                self._cond.wait(timeout=1.0)
            if self._stopped:
                return None
            # A version nobody downstream has started is not worth sending once a newer one is complete.
            while len(self._jobs) > 1 and any(j.state == READY for j in list(self._jobs)[1:]):
                self._pool.release(self._jobs.popleft())
            return self._jobs[0], self._gen, self._addr

    def _superseded(self, slot: Slot) -> bool:
        """A queued copy of this version (or a newer one) is complete: stop waiting on a stalled upstream."""
        return any(j.state == READY and j.version >= slot.version for j in list(self._jobs)[1:])

    def _finish_job(self, slot: Slot) -> None:
        with self._cond:
            if self._jobs and self._jobs[0] is slot:
                self._jobs.popleft()
                self._pool.release(slot)

    def _run(self) -> None:
        sock: socket.socket | None = None
        sock_gen = -1
        while True:
            nxt = self._next_job()
            if nxt is None:
                break
            slot, gen, addr = nxt
            try:
                if addr is None:
                    self._finish_job(slot)
                    continue
                if sock is None or sock_gen != gen:
                    if sock is not None:
                        sock.close()
                    sock = socket.create_connection(addr, timeout=self._io_timeout)
                    wire.tune(sock, self._io_timeout)
                    sock_gen = gen
                    with self._cond:
                        self._sock = sock  # from here a relink shuts it down, a stalled handshake too
                        if gen != self._gen:  # relinked while connecting
                            continue
                    if self._tls is not None:
                        sock = self._tls.wrap_socket(sock)
                        with self._cond:
                            self._sock = sock
                    wire.offer_handshake(sock, self._secret, self._name)
                self._send(sock, slot, gen)
                self._finish_job(slot)
            except _Relinked:
                continue  # same job, new connection on the next turn
            except (OSError, wire.ConnectionLost) as e:
                if sock is not None:
                    sock.close()
                sock = None
                with self._cond:
                    if gen == self._gen:
                        self.error = f"downstream {addr} failed while sending version {slot.version}: {e!r}"
                        log.warning("%s: %s", self._name, self.error)
                        self._drop_all()
        if sock is not None:
            sock.close()

    def _send(self, sock: socket.socket, slot: Slot, gen: int) -> None:
        version = slot.version
        local = self._local_host is not None and self._addr is not None and self._addr[0] == self._local_host
        reply = wire.send_begin(
            sock,
            version,
            slot.nbytes,
            slot.chunk_bytes,
            slot.layout_blob,
            slot.buffer.path if local and self._tls is None else "",
        )
        if reply == wire.SKIP:
            with self._cond:
                self.skipped_by_downstream.append(version)
            return
        try:
            self._send_chunks(sock, slot, gen, payload=reply == wire.ACCEPT)
        finally:
            if reply == wire.LOCAL:  # the receiver reads our slot until it says DONE; only then may it go
                if wire.recv_exact(sock, 1) != wire.DONE:
                    raise wire.Refused("expected DONE from a downstream copying our slot")

    def _send_chunks(self, sock: socket.socket, slot: Slot, gen: int, payload: bool) -> None:
        version = slot.version
        for i in range(slot.nchunks):
            with self._cond:
                while (
                    slot.ready_chunks <= i
                    and slot.state != ABORTED
                    and gen == self._gen
                    and not self._stopped
                    and not self._superseded(slot)
                ):
                    self._cond.wait(timeout=1.0)
                if gen != self._gen:
                    raise _Relinked
                if (
                    slot.state == ABORTED
                    or self._stopped
                    or (slot.ready_chunks <= i and self._superseded(slot))
                ):
                    wire.send_header(sock, wire.ABORT, version)
                    return
                crc = slot.crcs[i]
            off, n = slot.chunk(i)
            if not payload:
                wire.send_header(sock, wire.CHUNK, i, crc, n)
            elif self._tls is None:
                wire.send_chunk(sock, i, crc, slot.buffer.fd, off, n)
            else:  # TLS encrypts in this process: no sendfile
                wire.send_header(sock, wire.CHUNK, i, crc, n)
                sock.sendall(slot.buffer.array[off : off + n])
        with self._cond:  # END carries the digest, which exists once this relay verified (or made) it
            while not slot.digest and slot.state == WRITING and gen == self._gen and not self._stopped:
                self._cond.wait(timeout=1.0)
            if gen != self._gen:
                raise _Relinked
            digest = slot.digest
        if not digest:
            wire.send_header(sock, wire.ABORT, version)
            return
        wire.send_end(sock, version, digest)
        with self._cond:
            self.sent.append(version)
