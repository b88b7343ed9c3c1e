"""The master relay's arrival path: a version from the trainer's publish slot (and, from trainer ranks on other
machines, pieces of it), copied and checksummed by parallel threads into a slot, then forwarded down the chain."""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass
from typing import Any

import numpy as np

from laminar.relay import wire
from laminar.relay.slots import MappedView

log = logging.getLogger(__name__)


@dataclass
class Offer:
    """A version the trainer offered the master relay: where its bytes are, and how far its ingest has got."""

    version: int
    path: str
    nbytes: int
    layout: Any
    pieces: int = 0  # byte ranges of this version that trainer ranks on other machines send (`piece`)
    done: bool = False
    streamed: bool = False
    error: str | None = None


class Ingest:
    """`Relay`'s arrival from the trainer (its slot pool, forwarder, copy threads and counters)."""

    def ingest(
        self, version: int, path: str, nbytes: int, layout: Any, timeout: float = 600.0, pieces: int = 0
    ) -> bool:
        """Take a published version from the trainer's slot; returns once the slot is no longer read.

        The publisher keeps this call's ObjectRef per slot and reuses the slot when it resolves, so the trainer
        never waits on the chain. An offer not yet started is superseded by a newer one (returns False).
        `pieces`: how many `piece` calls carry the rows of trainer ranks on other machines (a trainer spanning
        machines); the version is assembled from the slot and them, and exposed only once every one is in.
        """
        offer = Offer(version, path, nbytes, layout, pieces)
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

    def _take_pieces(self, offer: Offer) -> list[tuple[int, int, np.ndarray]]:
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

    def _ingest(self, offer: Offer) -> None:
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
