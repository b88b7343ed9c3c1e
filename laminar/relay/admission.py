"""Who may be mid-handshake on a relay's port: connections not yet authenticated, each with one deadline for the
whole handshake (TLS included), at most `per_address` of them from one source address and `slots` in all.

A newcomer is never turned away for want of room: it displaces the oldest pending handshake from its own address
when that address already has `per_address` pending, else the oldest of all when every slot is taken. So a slow or
idle client holds a slot for at most `timeout` seconds and never keeps a real relay out: that relay's handshake
(one round trip) is cut short only if `slots` newer connections arrive while it runs, or `per_address` newer ones
from its own address. An authenticated link leaves the table and is never displaced.
"""

from __future__ import annotations

import math
import socket
import threading
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any


def displaced(pending: Sequence[str], address: str, slots: int, per_address: int) -> tuple[int, str] | None:
    """Which pending handshake a newcomer from `address` displaces, as (index into `pending`, the source
    addresses oldest first; why), or None when there is room for it."""
    own = [i for i, a in enumerate(pending) if a == address]
    if len(own) >= per_address:
        return own[0], f"displaced by a newer connection: {len(own)} handshakes pending from {address}"
    if len(pending) >= slots:
        return 0, f"displaced by a newer connection: {len(pending)} handshakes pending"
    return None


@dataclass(eq=False)
class Pending:
    sock: socket.socket
    peer: Any
    deadline: float
    dropped: str | None = None  # why it was cut short; its socket is shut down then


class Handshakes:
    """The pending handshakes of one relay. The accept loop admits each connection and calls `expire` before
    each accept; the thread running a handshake calls `finish` when it ends, whatever the outcome."""

    def __init__(self, slots: int, per_address: int, timeout: float):
        if slots < 1 or per_address < 1 or not timeout > 0:
            raise ValueError(
                f"pending handshakes: slots={slots}, per_address={per_address}, timeout={timeout}: "
                "expected at least 1 slot, at least 1 per address, and a positive timeout in seconds"
            )
        self.timeout = timeout
        self._slots = slots
        self._per_address = per_address
        self._pending: list[Pending] = []  # in order of admission, so also of deadline
        self._lock = threading.Lock()
        self._late = f"handshake not finished within {timeout:g}s"

    def admit(self, sock: socket.socket, peer: Any, now: float) -> Pending:
        ticket = Pending(sock, peer, now + self.timeout)
        with self._lock:
            victim = displaced([p.peer[0] for p in self._pending], peer[0], self._slots, self._per_address)
            if victim is not None:
                self._drop(self._pending[victim[0]], victim[1])
            self._pending.append(ticket)
        return ticket

    def expire(self, now: float) -> float:
        """Cut short every handshake past its deadline; seconds until the next deadline (inf: none pending)."""
        with self._lock:
            while self._pending and self._pending[0].deadline <= now:
                self._drop(self._pending[0], self._late)
            return self._pending[0].deadline - now if self._pending else math.inf

    def finish(self, ticket: Pending, now: float) -> str | None:
        """The handshake ended: None, or why it was cut short (then its link must not be used). One that ended
        past its deadline, before `expire` saw it (its socket's own timeout, say), is late all the same."""
        with self._lock:
            if ticket.dropped is None:
                self._pending.remove(ticket)
                if now >= ticket.deadline:
                    ticket.dropped = self._late
            return ticket.dropped

    def pending(self) -> int:
        with self._lock:
            return len(self._pending)

    def close(self) -> None:
        with self._lock:
            while self._pending:
                self._drop(self._pending[0], "the relay is shutting down")

    def _drop(self, ticket: Pending, reason: str) -> None:
        """Under the lock, so a handshake that just finished is never shut down."""
        ticket.dropped = reason
        self._pending.remove(ticket)
        try:
            ticket.sock.shutdown(socket.SHUT_RDWR)  # wakes the thread blocked reading it
        except OSError:
            pass  # the peer is gone already
