"""Relays in this process, linked over real loopback TCP: integrity, visibility, failure of a link."""

from __future__ import annotations

import socket
import threading

import numpy as np
import pytest

from laminar.relay import wire
from laminar.relay.relay import Relay
from laminar.relay.slots import MappedView, ShmBuffer, new_buffer_path

CHUNK = 64 << 10
SECRET = bytes(range(32))  # a test run's relay secret


def make_relay(name: str, **kw) -> Relay:
    return Relay(name, secret=SECRET, host="127.0.0.1", chunk_bytes=CHUNK, **kw)


def link(up: Relay, down: Relay) -> None:
    """What build_chain does for relays in Ray: the downstream learns its upstream's name first."""
    down.set_upstream(up.name)
    up.set_downstream(down.address())


def weights(version: int, nbytes: int = 1 << 20) -> np.ndarray:
    return np.random.default_rng(version).integers(0, 256, size=nbytes, dtype=np.uint8)


def held_bytes(relay: Relay) -> tuple[int, np.ndarray]:
    lease = relay.acquire()
    assert lease is not None
    try:
        with MappedView(lease.path, lease.nbytes) as v:
            return lease.version, v.array.copy()
    finally:
        relay.release(lease.lease_id)


@pytest.fixture(params=["shared-memory", "tcp"])
def chain(request):
    """Three relays on this machine: chunks between them through shared memory (as relays of one machine do)
    or over the socket (as relays of different machines do)."""
    relays = [make_relay(f"local-{i}", local_shm=request.param == "shared-memory") for i in range(3)]
    for up, down in zip(relays, relays[1:]):
        link(up, down)
    yield relays
    for r in relays:
        r.shutdown()


@pytest.fixture
def trainer_slot():
    buf = ShmBuffer(new_buffer_path("test-trainer", 0), 1 << 20)
    yield buf
    buf.close()


def publish(master: Relay, buf: ShmBuffer, version: int, nbytes: int = 1 << 20) -> np.ndarray:
    w = weights(version, nbytes)
    buf.resize(nbytes)
    buf.array[:nbytes] = w
    assert master.ingest(version, buf.path, nbytes, {"nbytes": nbytes})
    return w


def test_every_relay_holds_identical_bytes_for_every_version(chain, trainer_slot):
    for version in (1, 2, 5):
        w = publish(chain[0], trainer_slot, version)
        for r in chain:
            assert r.wait_version(version, timeout=20) == version
            got_version, got = held_bytes(r)
            assert got_version == version and np.array_equal(got, w)
    stats = chain[-1].stats()
    assert sorted(stats["versions"]) == [1, 2, 5]
    way = "shared memory" if chain[-1]._local_shm else "tcp"
    assert all(h["source"] == f"upstream, {way}" for h in stats["versions"].values())
    assert stats["versions"][5]["chunks"] == (1 << 20) // CHUNK and stats["crc_errors"] == 0


def test_older_version_is_refused(chain, trainer_slot):
    publish(chain[0], trainer_slot, 3)
    with pytest.raises(RuntimeError, match="not newer than held version 3"):
        publish(chain[0], trainer_slot, 2)


class FakeUpstream:
    """Speaks the wire protocol by hand, as the relay `name` holding the run's secret, so a test decides when
    each chunk arrives (and what the digest says)."""

    def __init__(self, relay: Relay, version: int, nbytes: int = 4 * CHUNK, name: str | None = None):
        self.sock = socket.create_connection(relay.address(), timeout=10)
        wire.offer_handshake(self.sock, SECRET, name or relay._upstream)
        self.begin(version, nbytes)

    def begin(self, version: int, nbytes: int) -> None:
        self.w = weights(version, nbytes)
        self.version, self.nbytes, self.crcs = version, nbytes, []
        self.blob = wire.encode_layout({"nbytes": nbytes})
        assert wire.send_begin(self.sock, version, nbytes, CHUNK, self.blob) == wire.ACCEPT

    def chunk(self, i: int, corrupt: bool = False) -> None:
        data = self.w[i * CHUNK : (i + 1) * CHUNK].tobytes()
        crc = wire.checksum(data) ^ (1 if corrupt else 0)
        self.crcs.append(crc)
        wire.send_header(self.sock, wire.CHUNK, i, crc, len(data))
        self.sock.sendall(data)

    def end(self, key: bytes = SECRET) -> None:
        digest = wire.version_digest(key, self.version, self.nbytes, CHUNK, self.blob, self.crcs)
        wire.send_end(self.sock, self.version, digest)


def wait_counter(relay: Relay, key: str, value: int) -> None:
    with relay._cond:  # the relay notifies its condition on every state change
        ok = relay._cond.wait_for(lambda: relay._counters[key] >= value, timeout=10)
    assert ok, f"{key} never reached {value}: {relay.stats()}"


def test_a_version_is_invisible_until_every_chunk_is_in(chain):
    last = chain[-1]
    up = FakeUpstream(chain[1], version=4)
    for i in range(3):
        up.chunk(i)
    assert chain[1].newest_version() is None and last.newest_version() is None
    assert chain[1].acquire(timeout=0.2) is None
    up.chunk(3)
    assert chain[1].newest_version() is None  # all bytes in, END (with the digest) not yet seen
    up.end()
    assert last.wait_version(4, timeout=10) == 4
    _, got = held_bytes(last)
    assert np.array_equal(got, up.w)


def test_corrupt_chunk_is_never_exposed_and_the_link_survives(chain):
    mid = chain[1]
    bad = FakeUpstream(mid, version=6)
    bad.chunk(0)
    bad.chunk(1, corrupt=True)
    bad.chunk(2)
    bad.chunk(3)
    bad.end()
    wait_counter(mid, "crc_errors", 1)
    assert mid.newest_version() is None and chain[2].newest_version() is None
    # The same connection carries the next version intact.
    bad.begin(7, bad.nbytes)
    for i in range(4):
        bad.chunk(i)
    bad.end()
    assert chain[2].wait_version(7, timeout=10) == 7
    assert np.array_equal(held_bytes(chain[2])[1], bad.w)


def test_upstream_dying_midway_aborts_the_partial_version(chain):
    mid = chain[1]
    up = FakeUpstream(mid, version=8)
    up.chunk(0)
    up.sock.close()
    wait_counter(mid, "aborted", 1)
    assert mid.newest_version() is None
    with pytest.raises(TimeoutError, match="version 8 did not arrive"):
        chain[2].wait_version(8, timeout=0.3)


def test_new_downstream_catches_up_with_the_newest_version(chain, trainer_slot):
    w = publish(chain[0], trainer_slot, 1)
    chain[2].wait_version(1, timeout=10)
    late = make_relay("late")
    try:
        link(chain[2], late)
        assert late.wait_version(1, timeout=10) == 1
        assert np.array_equal(held_bytes(late)[1], w)
    finally:
        late.shutdown()


def test_reader_errors_are_clear(chain, trainer_slot):
    with pytest.raises(LookupError, match="version 9 is not among them"):
        chain[0].acquire(version=9)
    with pytest.raises(KeyError, match="lease 12345 is not held"):
        chain[0].release(12345)
    publish(chain[0], trainer_slot, 1)
    lease = chain[0].acquire(version=1)
    chain[0].release(lease.lease_id)
    with pytest.raises(KeyError, match="released twice"):
        chain[0].release(lease.lease_id)


def test_pinned_version_survives_newer_arrivals(chain, trainer_slot):
    w1 = publish(chain[0], trainer_slot, 1)
    lease = chain[2].acquire(version=1) if chain[2].wait_version(1, 10) else None
    for v in (2, 3, 4):
        publish(chain[0], trainer_slot, v)
        chain[2].wait_version(v, timeout=10)
    with MappedView(lease.path, lease.nbytes) as view:
        assert np.array_equal(view.array, w1)  # three versions later, the leased slot is untouched
    chain[2].release(lease.lease_id)


def test_concurrent_reader_only_sees_complete_versions(chain, trainer_slot):
    seen: list[tuple[int, bool]] = []
    stop = threading.Event()

    def poll() -> None:
        while not stop.is_set():
            lease = chain[2].acquire(timeout=0.05)
            if lease is None:
                continue
            with MappedView(lease.path, lease.nbytes) as v:
                seen.append((lease.version, np.array_equal(v.array, weights(lease.version, lease.nbytes))))
            chain[2].release(lease.lease_id)

    t = threading.Thread(target=poll)
    t.start()
    try:
        for v in range(1, 7):
            publish(chain[0], trainer_slot, v, nbytes=2 << 20)
        chain[2].wait_version(6, timeout=20)
    finally:
        stop.set()
        t.join(timeout=10)
    assert seen and all(ok for _, ok in seen), [s for s in seen if not s[1]]
    assert [v for v, _ in seen] == sorted(v for v, _ in seen)  # never goes back


def test_a_hung_upstream_does_not_hold_the_version_back(chain):
    """Rebuilt mid-version: the old upstream stalls (alive, silent), the new one sends the same version."""
    hung = FakeUpstream(chain[1], version=9)
    hung.chunk(0)  # ...and nothing more: chain[1] is writing v9 and forwarding chunk 0 downstream
    fresh = FakeUpstream(chain[1], version=9)
    for i in range(4):
        fresh.chunk(i)
    fresh.end()
    # Well before the 60 s I/O timeout: the relay takes the second copy and its forwarder drops the stalled one.
    assert chain[2].wait_version(9, timeout=10) == 9
    assert np.array_equal(held_bytes(chain[2])[1], fresh.w)
    hung.sock.close()


def test_relinking_interrupts_a_send_to_a_hung_downstream(trainer_slot):
    master = make_relay("relink-master")
    silent = socket.create_server(("127.0.0.1", 0))  # accepts, never reads: sends block once buffers fill
    good = make_relay("relink-good")
    try:
        master.set_downstream(silent.getsockname()[:2])
        publish(master, trainer_slot, 1, nbytes=16 << 20)  # the forwarder is now stuck in the handshake
        link(master, good)
        assert good.wait_version(1, timeout=10) == 1
    finally:
        master.shutdown()
        good.shutdown()
        silent.close()


def test_a_downstream_linked_mid_version_gets_the_arriving_version(chain):
    """Relinked while a version is still arriving: the new downstream is offered it too, not only the older one."""
    mid = chain[1]
    mid.set_downstream(None)
    up = FakeUpstream(mid, version=11)
    up.chunk(0)
    wait_chunks = mid._pool.find(11)
    with mid._cond:
        assert mid._cond.wait_for(lambda: wait_chunks.ready_chunks >= 1, timeout=10)
    mid.set_downstream(chain[2].address())
    for i in range(1, 4):
        up.chunk(i)
    up.end()
    assert chain[2].wait_version(11, timeout=10) == 11
    assert np.array_equal(held_bytes(chain[2])[1], up.w)


def test_a_version_is_assembled_from_the_slot_and_pieces_from_other_machines(trainer_slot):
    """A trainer spanning machines: the ranks beside the master write their rows into the slot, the others send
    theirs as pieces (before or after the offer); the version is whole, and exposed only once all are in."""
    master = make_relay("pieces", slot_timeout=1.0)
    try:
        nbytes = 1 << 20
        for version, early in ((1, True), (2, False)):
            w = weights(version, nbytes)
            away = [[(1000, 5000), (300_000, 70_000)], [(900_000, nbytes - 900_000)]]  # two remote ranks
            trainer_slot.array[:nbytes] = w
            for ranges in away:  # the slot has holes where the remote rows go
                for off, n in ranges:
                    trainer_slot.array[off : off + n] = 0

            def send(ranges, w=w, version=version):
                master.piece(version, ranges, np.concatenate([w[o : o + n] for o, n in ranges]))

            if early:
                for ranges in away:
                    send(ranges)
            else:
                threading.Timer(0.2, send, args=(away[0],)).start()
                threading.Timer(0.3, send, args=(away[1],)).start()
            assert master.ingest(version, trainer_slot.path, nbytes, {"nbytes": nbytes}, pieces=2)
            got_version, got = held_bytes(master)
            assert got_version == version and np.array_equal(got, w)
        # a piece that never comes: the version is never exposed, the one before stays the newest
        with pytest.raises(RuntimeError, match="1 of the 2 pieces"):
            master.piece(3, [(0, 10)], np.zeros(10, np.uint8))
            master.ingest(3, trainer_slot.path, nbytes, {"nbytes": nbytes}, pieces=2)
        assert held_bytes(master)[0] == 2 and master.stats()["pieces"] == 5
        with pytest.raises(ValueError, match="ranges cover 10 bytes, data has 4"):
            master.piece(4, [(0, 10)], np.zeros(4, np.uint8))
    finally:
        master.shutdown()
