"""The pending-handshake table of a relay's port, without a relay: who is displaced, when a deadline passes."""

from __future__ import annotations

import math
import socket

import pytest

from laminar.relay.admission import Handshakes, displaced

pytestmark = pytest.mark.fault  # `make faults`


def test_a_newcomer_displaces_the_oldest_of_its_address_else_the_oldest_of_all():
    assert displaced([], "a", slots=4, per_address=2) is None
    assert displaced(["a", "b", "a"], "c", slots=4, per_address=2) is None
    assert displaced(["b", "a", "c", "a"], "a", slots=8, per_address=2)[0] == 1  # its own address is full
    assert displaced(["b", "a", "c", "a"], "d", slots=4, per_address=2)[0] == 0  # every slot is taken
    index, why = displaced(["b", "a", "c", "a"], "a", slots=4, per_address=2)
    assert index == 1 and why == "displaced by a newer connection: 2 handshakes pending from a"


@pytest.fixture
def pairs():
    made: list[tuple[socket.socket, socket.socket]] = []

    def pair() -> tuple[socket.socket, socket.socket]:
        made.append(socket.socketpair())
        return made[-1]

    yield pair
    for a, b in made:
        a.close()
        b.close()


def shut(client: socket.socket) -> bool:
    """True when the relay's end was shut down: the client reads end of file at once."""
    client.settimeout(5)
    return client.recv(1) == b""


def test_deadlines_displacement_and_finish(pairs):
    table = Handshakes(slots=2, per_address=2, timeout=10.0)
    (s1, c1), (s2, c2), (s3, c3) = pairs(), pairs(), pairs()
    first = table.admit(s1, ("10.0.0.1", 1), now=0.0)
    second = table.admit(s2, ("10.0.0.2", 1), now=1.0)
    assert table.expire(now=5.0) == 5.0  # until the first one's deadline
    third = table.admit(s3, ("10.0.0.3", 1), now=6.0)  # every slot taken: the oldest goes
    assert first.dropped == "displaced by a newer connection: 2 handshakes pending" and shut(c1)
    assert table.finish(first, now=6.0) == first.dropped  # its thread learns why, and must not use the link
    assert table.finish(second, now=6.0) is None and table.pending() == 1  # authenticated: out of the table
    assert table.expire(now=15.9) == pytest.approx(0.1)
    assert table.expire(now=16.0) == math.inf and shut(c3)
    assert third.dropped == "handshake not finished within 10s" and second.dropped is None
    s2.settimeout(0)
    c2.sendall(b"x")
    assert s2.recv(1) == b"x"  # a finished handshake's link is never touched
    late = table.admit(s1, ("10.0.0.1", 2), now=20.0)
    assert table.finish(late, now=30.0) == "handshake not finished within 10s"  # before expire() saw it
    assert table.pending() == 0


def test_bad_limits_name_themselves():
    with pytest.raises(ValueError, match="slots=0"):
        Handshakes(slots=0, per_address=1, timeout=1.0)
