"""A relay's port against someone on the same network: nothing is unpickled, nobody without the run's secret gets
past the handshake, no version the trainer did not publish is exposed, and the relay keeps working after it all."""

from __future__ import annotations

import os
import pickle
import socket
import struct
import threading

import numpy as np
import pytest

from laminar.relay import wire
from laminar.relay.relay import MAX_PENDING_HANDSHAKES
from laminar.relay.slots import FREE, ShmBuffer, new_buffer_path
from tests.relay.test_relay import CHUNK, SECRET, FakeUpstream, held_bytes, link, make_relay, publish

pytestmark = pytest.mark.fault  # `make faults`


class RunsCode:
    def __init__(self, marker: str):
        self.marker = marker

    def __reduce__(self):
        return (os.system, (f"touch {self.marker}",))


@pytest.fixture
def pair():
    """master -> victim, linked as a run would link them; the tests attack `victim`'s port."""
    master, victim = make_relay("sec-master"), make_relay("sec-victim")
    link(master, victim)
    buf = ShmBuffer(new_buffer_path("sec-trainer", 0), 1 << 20)
    yield master, victim, buf
    buf.close()
    master.shutdown()
    victim.shutdown()


def connect(relay) -> socket.socket:
    return socket.create_connection(relay.address(), timeout=10)


def closed_by_peer(sock: socket.socket) -> bool:
    """True once the relay has dropped us (EOF or reset), reading past the greeting it may have sent."""
    sock.settimeout(10)
    try:
        while sock.recv(4096):
            pass
        return True
    except (ConnectionResetError, BrokenPipeError):
        return True
    finally:
        sock.close()


def wait_refusals(relay, n: int) -> None:
    with relay._cond:
        ok = relay._cond.wait_for(lambda: relay._counters["refused_connections"] >= n, timeout=10)
    assert ok, relay.stats()


def untouched(relay) -> bool:
    """No slot was claimed: every slot still free and unsized."""
    return all(s.state == FREE and s.buffer.capacity == 0 for s in relay._pool.slots)


def still_carries_real_versions(master, victim, buf, version: int) -> None:
    w = publish(master, buf, version)
    assert victim.wait_version(version, timeout=10) == version
    assert np.array_equal(held_bytes(victim)[1], w)


def test_a_pickle_payload_executes_nothing_and_is_dropped(pair, tmp_path):
    master, victim, buf = pair
    marker = tmp_path / "pwned"
    blob = pickle.dumps(RunsCode(str(marker)))
    sock = connect(victim)  # the old protocol's exploit: BEGIN, then a pickled "layout"
    sock.sendall(wire.HEADER.pack(wire.BEGIN, 10**9, 1 << 20, CHUNK) + struct.pack("!q", len(blob)) + blob)
    assert closed_by_peer(sock)
    wait_refusals(victim, 1)
    assert not marker.exists() and untouched(victim)
    assert "not a Laminar relay handshake" in victim.stats()["refusals"][-1]["reason"]
    assert victim.stats()["refusals"][-1]["peer"].startswith("127.0.0.1:")
    still_carries_real_versions(master, victim, buf, 1)


@pytest.mark.parametrize("secret", [None, b"x" * 32], ids=["no-secret", "wrong-secret"])
def test_a_peer_without_the_secret_is_refused(pair, secret):
    master, victim, buf = pair
    sock = connect(victim)
    if secret is None:
        sock.sendall(wire.MAGIC + struct.pack("!H", 10) + b"sec-master" + os.urandom(64))
    else:
        with pytest.raises(wire.Refused, match="refused our handshake"):
            wire.offer_handshake(sock, secret, "sec-master")
    assert closed_by_peer(sock)
    wait_refusals(victim, 1)
    assert "MAC does not match" in victim.stats()["refusals"][-1]["reason"] and untouched(victim)
    still_carries_real_versions(master, victim, buf, 1)


class Recorder:
    """A socket that remembers what it sent: a handshake to replay later."""

    def __init__(self, sock: socket.socket):
        self.sock, self.sent = sock, b""

    def sendall(self, data: bytes) -> None:
        self.sent += data
        self.sock.sendall(data)

    def recv_into(self, view, n=0):
        return self.sock.recv_into(view)


def test_a_replayed_handshake_is_refused(pair):
    master, victim, buf = pair
    first = Recorder(connect(victim))
    wire.offer_handshake(first, SECRET, "sec-master")  # a real one, recorded on the wire
    first.sock.close()
    replay = connect(victim)
    replay.sendall(first.sent)  # the same bytes against a fresh nonce
    assert closed_by_peer(replay)
    wait_refusals(victim, 1)
    assert "replayed" in victim.stats()["refusals"][-1]["reason"] and untouched(victim)
    still_carries_real_versions(master, victim, buf, 1)


def test_only_the_expected_upstream_is_accepted(pair):
    master, victim, buf = pair
    sock = connect(victim)
    with pytest.raises(wire.Refused):
        wire.offer_handshake(sock, SECRET, "some-other-relay")
    wait_refusals(victim, 1)
    assert "not this relay's upstream" in victim.stats()["refusals"][-1]["reason"]
    still_carries_real_versions(master, victim, buf, 1)


def test_forged_chunks_for_a_newer_version_are_never_exposed(pair):
    """Even an authenticated link that carries bytes with checksums of their own cannot expose them: the
    version's digest is keyed, and a wrong one leaves the version unexposed and the link dropped."""
    master, victim, buf = pair
    still_carries_real_versions(master, victim, buf, 1)
    forged = FakeUpstream(victim, version=10**9)
    for i in range(4):
        forged.chunk(i)  # with matching CRC32Cs
    forged.end(key=b"not the run's secret, 32 bytes..")
    assert closed_by_peer(forged.sock)
    wait_refusals(victim, 1)
    assert victim.stats()["digest_errors"] == 1
    assert victim.newest_version() == 1 and victim.acquire(min_version=2, timeout=0.2) is None
    still_carries_real_versions(master, victim, buf, 2)


@pytest.mark.parametrize(
    "version, nbytes, chunk_bytes, layout_len, reason",
    [
        (5, -1, CHUNK, 10, "bytes: this relay takes"),
        (5, 1 << 60, CHUNK, 10, "bytes: this relay takes"),
        (5, 1 << 20, 0, 10, "chunk size 0"),
        (5, 1 << 20, 1 << 40, 10, "chunk size"),
        (-3, 1 << 20, CHUNK, 10, "versions never go back"),
        (5, 1 << 20, CHUNK, 1 << 40, "layout of"),
    ],
    ids=["negative-size", "huge-size", "zero-chunk", "huge-chunk", "negative-version", "huge-layout"],
)
def test_an_out_of_bounds_begin_claims_no_memory(pair, version, nbytes, chunk_bytes, layout_len, reason):
    master, victim, buf = pair
    sock = connect(victim)
    wire.offer_handshake(sock, SECRET, "sec-master")
    sock.sendall(wire.HEADER.pack(wire.BEGIN, version, nbytes, chunk_bytes) + struct.pack("!q", layout_len))
    assert closed_by_peer(sock)
    wait_refusals(victim, 1)
    assert reason in victim.stats()["refusals"][-1]["reason"] and untouched(victim)
    still_carries_real_versions(master, victim, buf, 1)


def test_a_layout_that_disagrees_with_the_size_is_refused(pair):
    from laminar.engine.layout import WeightLayout

    master, victim, buf = pair
    sock = connect(victim)
    wire.offer_handshake(sock, SECRET, "sec-master")
    blob = wire.encode_layout(WeightLayout.raw(1 << 30))
    sock.sendall(wire.HEADER.pack(wire.BEGIN, 5, 1 << 20, CHUNK) + struct.pack("!q", len(blob)) + blob)
    assert closed_by_peer(sock)
    wait_refusals(victim, 1)
    assert "layout describes" in victim.stats()["refusals"][-1]["reason"] and untouched(victim)
    still_carries_real_versions(master, victim, buf, 1)


def test_a_version_going_back_on_one_link_is_refused(pair):
    master, victim, buf = pair
    up = FakeUpstream(victim, version=7)
    for i in range(4):
        up.chunk(i)
    up.end()
    assert victim.wait_version(7, timeout=10) == 7
    blob = wire.encode_layout({"nbytes": 4 * CHUNK})
    up.sock.sendall(wire.HEADER.pack(wire.BEGIN, 6, 4 * CHUNK, CHUNK) + struct.pack("!q", len(blob)) + blob)
    assert closed_by_peer(up.sock)
    wait_refusals(victim, 1)
    assert "never go back" in victim.stats()["refusals"][-1]["reason"]
    assert victim.newest_version() == 7


def test_tls_links_carry_versions_and_refuse_plain_or_foreign_peers(trainer_tls_pair):
    import ssl

    from laminar.relay.tls import RunCertificate

    master, victim, buf = trainer_tls_pair
    still_carries_real_versions(master, victim, buf, 1)
    plain = connect(victim)  # no TLS: what a plain relay would send first
    plain.sendall(wire.MAGIC + struct.pack("!H", 10) + b"tls-master" + os.urandom(64))
    assert closed_by_peer(plain)
    wait_refusals(victim, 1)
    _, foreign = RunCertificate.make().contexts()  # TLS, but another run's certificate
    with pytest.raises((ssl.SSLError, OSError, wire.ConnectionLost)):
        with foreign.wrap_socket(connect(victim)) as s:
            wire.offer_handshake(s, SECRET, "tls-master")
    wait_refusals(victim, 2)
    still_carries_real_versions(master, victim, buf, 2)


@pytest.fixture
def trainer_tls_pair():
    from laminar.relay.tls import RunCertificate

    cert = RunCertificate.make()
    master, victim = make_relay("tls-master", tls=cert), make_relay("tls-victim", tls=cert)
    link(master, victim)
    buf = ShmBuffer(new_buffer_path("tls-trainer", 0), 1 << 20)
    yield master, victim, buf
    buf.close()
    master.shutdown()
    victim.shutdown()


def test_an_offered_slot_path_outside_shared_memory_is_refused(pair):
    master, victim, buf = pair
    sock = connect(victim)
    wire.offer_handshake(sock, SECRET, "sec-master")
    with pytest.raises((wire.ConnectionLost, OSError)):
        wire.send_begin(sock, 5, 4 * CHUNK, CHUNK, wire.encode_layout({"nbytes": 4 * CHUNK}), "/etc/passwd")
    wait_refusals(victim, 1)
    assert "not a Laminar slot" in victim.stats()["refusals"][-1]["reason"] and untouched(victim)
    still_carries_real_versions(master, victim, buf, 1)


class Tricklers:
    """`n` clients without the secret, from the source `addresses` in turn, each sending one more byte of
    `hello` every `every` seconds (none: idle) and connecting again whenever the relay drops it, so they hold
    every handshake slot they can for as long as they can."""

    def __init__(self, relay, n: int, addresses: list[str], every: float, hello: bytes):
        self._target, self._every, self._hello = relay.address(), every, hello
        self._sources = [addresses[i % len(addresses)] for i in range(n)]
        self._socks = [self._connect(a) for a in self._sources]
        self._sent = [0] * n
        self._rounds = 0
        self._cond = threading.Condition()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="tricklers", daemon=True)

    def _connect(self, source: str) -> socket.socket:
        return socket.create_connection(self._target, timeout=10, source_address=(source, 0))

    def _run(self) -> None:
        while not self._stop.wait(self._every):
            for i, sock in enumerate(self._socks):
                try:
                    if self._sent[i] < len(self._hello):
                        sock.sendall(self._hello[self._sent[i] : self._sent[i] + 1])
                        self._sent[i] += 1
                except OSError:  # dropped: come back
                    sock.close()
                    try:
                        self._socks[i], self._sent[i] = self._connect(self._sources[i]), 0
                    except OSError:
                        pass  # the next round tries again
            with self._cond:
                self._rounds += 1
                self._cond.notify_all()

    def wait_rounds(self, n: int) -> None:
        with self._cond:
            assert self._cond.wait_for(lambda: self._rounds >= n, timeout=10), "the tricklers stalled"

    def __enter__(self) -> Tricklers:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(timeout=10)
        for sock in self._socks:
            sock.close()


# the start of a relay handshake that announces the longest name: over a minute of bytes at 5 a second
SLOW_HELLO = wire.MAGIC + struct.pack("!H", wire.MAX_NAME_BYTES) + b"x" * wire.MAX_NAME_BYTES
# a TLS record header announcing a 512-byte ClientHello that never completes
SLOW_TLS_HELLO = b"\x16\x03\x01\x02\x00" + b"\x01" * 512


def test_slow_clients_holding_every_handshake_slot_do_not_keep_a_replaced_upstream_out(pair):
    """Connections trickling a byte at a time held every pending-handshake slot, and the link of the
    upstream's replacement was refused for the rest of the run. A newcomer displaces the oldest instead."""
    master, victim, buf = pair
    still_carries_real_versions(master, victim, buf, 1)
    addresses = [f"127.0.0.{i}" for i in range(2, 7)]  # the attacker's five machines
    with Tricklers(victim, MAX_PENDING_HANDSHAKES + 4, addresses, every=0.2, hello=SLOW_HELLO) as slow:
        wait_refusals(victim, 4)  # every slot was taken: four more connections than slots
        slow.wait_rounds(2)
        master.shutdown()  # the upstream dies, and its replacement links to the victim
        new = make_relay("sec-master-2")
        try:
            link(new, victim)
            w = publish(new, buf, 2)
            assert victim.wait_version(2, timeout=10) == 2
            assert np.array_equal(held_bytes(victim)[1], w)
        finally:
            new.shutdown()
    refused = {r["peer"].split(":")[0] for r in victim.stats()["refusals"]}
    assert refused <= set(addresses), victim.stats()["refusals"]


@pytest.mark.parametrize(
    "tls, hello",
    [(False, b""), (False, SLOW_HELLO), (True, SLOW_TLS_HELLO)],
    ids=["idle", "trickling", "trickling-tls"],
)
def test_a_handshake_has_one_deadline_however_its_bytes_come(tls, hello):
    from laminar.relay.tls import RunCertificate

    victim = make_relay("deadline", tls=RunCertificate.make() if tls else None, handshake_timeout=0.5)
    try:
        with Tricklers(victim, 1, ["127.0.0.2"], every=0.05, hello=hello):  # a byte every 0.05 s
            wait_refusals(victim, 1)
        assert victim.stats()["refusals"][0]["reason"] == "handshake not finished within 0.5s"
    finally:
        victim.shutdown()


def test_clients_of_one_address_displace_only_each_other():
    victim = make_relay("per-address", handshake_timeout=60, pending_handshakes=4, pending_per_address=2)
    bystander = socket.create_connection(victim.address(), timeout=10, source_address=("127.0.0.9", 0))
    try:
        wire.recv_exact(bystander, len(wire.MAGIC) + wire.NONCE_BYTES)  # its greeting: admitted first
        with Tricklers(victim, 6, ["127.0.0.2"], every=0.05, hello=SLOW_HELLO):
            wait_refusals(victim, 4)  # each newcomer past the second displaced the oldest of its address
            assert {r["peer"].split(":")[0] for r in victim.stats()["refusals"]} == {"127.0.0.2"}
            assert victim.stats()["pending_handshakes"] == 3
        bystander.setblocking(False)
        with pytest.raises(BlockingIOError):
            bystander.recv(1)  # still open and waited on
    finally:
        bystander.close()
        victim.shutdown()
