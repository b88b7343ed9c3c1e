"""The relay-to-relay byte protocol over one TCP connection: authenticated, bounded, never unpickled.

A connection opens with a challenge-response on the run's secret (HMAC-SHA256): the receiver sends a fresh nonce,
the sender answers with its relay name, a nonce of its own and a MAC over both; the receiver answers with a MAC
that proves it holds the secret too. A peer without the secret, or replaying a recorded handshake (the nonce is
new every time), is dropped before anything else is read, and the secret itself never crosses the link. How
long a peer may take, and how many may be mid-handshake at once, is the relay's (admission.py).

A version then travels as BEGIN (version, nbytes, chunk_bytes, the layout as JSON, and the sender's slot path
when both relays may share a machine) answered by one byte (accept, skip, or local: the receiver maps the
sender's slot and copies from it, so CHUNK frames carry no payload and DONE acknowledges the end), CHUNK frames (index, crc32c, length, payload) and END with the version's digest: an HMAC over
the version number, its sizes, the layout and every chunk's checksum, made where the version entered the tier (the
master relay, from the trainer's slot). A receiver exposes a version only after that digest verified, so no bytes
the trainer did not publish can be pulled, whatever happened on the link. ABORT replaces END when the sender lost
its upstream midway. Fixed headers keep the receiver able to `recv_into` payloads straight into its slot.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import os
import socket
import struct
from collections.abc import Callable
from typing import Any

import crc32c
import numpy as np

from laminar.engine.layout import WeightLayout  # the engine owns the flat format

HEADER = struct.Struct("!4sqqq")
BEGIN, CHUNK, END, ABORT = b"BEGN", b"CHNK", b"END_", b"ABRT"
ACCEPT, SKIP, LOCAL, DONE = b"A", b"S", b"L", b"D"

MAGIC = b"LMNR/1"
NONCE_BYTES = 32
MAC_BYTES = 32
MAX_NAME_BYTES = 256
MAX_LAYOUT_BYTES = 64 << 20  # a 1000-layer model's layout is a few MB of JSON
MAX_PATH_BYTES = 4096
SOCKET_BUFFER_BYTES = 8 << 20
MIN_CHUNK_BYTES = 4 << 10
MAX_CHUNK_BYTES = 1 << 30


class ConnectionLost(ConnectionError):
    """The peer closed the connection or died; a relay treats its link as gone."""


class Refused(ConnectionLost):
    """The peer broke the protocol (bad handshake, out-of-bounds header): dropped, counted, logged."""


def checksum(data: Any) -> int:
    """CRC32C of a chunk: hardware-accelerated and releases the GIL, so it keeps up with memory copies."""
    return crc32c.crc32c(data)


# ---- handshake ------------------------------------------------------------------------------------------------
def _mac(secret: bytes, role: bytes, server_nonce: bytes, client_nonce: bytes, name: bytes) -> bytes:
    msg = b"laminar-relay-handshake/1|" + role + b"|" + server_nonce + client_nonce + name
    return hmac.new(secret, msg, hashlib.sha256).digest()


def accept_handshake(sock: socket.socket, secret: bytes, is_expected: Callable[[str], bool]) -> str:
    """Receiver's side; returns the authenticated sender's relay name or raises Refused."""
    server_nonce = os.urandom(NONCE_BYTES)
    sock.sendall(MAGIC + server_nonce)
    if recv_exact(sock, len(MAGIC)) != MAGIC:
        raise Refused("not a Laminar relay handshake")
    (n,) = struct.unpack("!H", recv_exact(sock, 2))
    if n > MAX_NAME_BYTES:
        raise Refused(f"relay name of {n} bytes (at most {MAX_NAME_BYTES})")
    name = recv_exact(sock, n)
    client_nonce = recv_exact(sock, NONCE_BYTES)
    mac = recv_exact(sock, MAC_BYTES)
    if not hmac.compare_digest(mac, _mac(secret, b"sender", server_nonce, client_nonce, name)):
        raise Refused("handshake MAC does not match: wrong secret, or a replayed handshake")
    peer = name.decode("utf-8", errors="replace")
    if not is_expected(peer):
        raise Refused(f"relay {peer!r} is not this relay's upstream")
    sock.sendall(_mac(secret, b"receiver", server_nonce, client_nonce, name))
    return peer


def offer_handshake(sock: socket.socket, secret: bytes, name: str) -> None:
    """Sender's side: prove we hold the secret, and check that the receiver does too."""
    hello = recv_exact(sock, len(MAGIC) + NONCE_BYTES)
    if hello[: len(MAGIC)] != MAGIC:
        raise Refused("the downstream is not a Laminar relay")
    server_nonce = hello[len(MAGIC) :]
    client_nonce = os.urandom(NONCE_BYTES)
    raw = name.encode()[:MAX_NAME_BYTES]
    mac = _mac(secret, b"sender", server_nonce, client_nonce, raw)
    sock.sendall(MAGIC + struct.pack("!H", len(raw)) + raw + client_nonce + mac)
    try:
        reply = recv_exact(sock, MAC_BYTES)
    except ConnectionLost as e:
        raise Refused("the downstream refused our handshake (is it linked to this relay?)") from e
    if not hmac.compare_digest(reply, _mac(secret, b"receiver", server_nonce, client_nonce, raw)):
        raise Refused("the downstream did not prove it holds the run's secret")


# ---- versions -------------------------------------------------------------------------------------------------
def encode_layout(layout: Any) -> bytes:
    """The layout as canonical JSON: an engine WeightLayout, or plain JSON data (tests, benchmarks)."""
    to_json = getattr(layout, "to_json", None)
    doc = {"weights": to_json()} if to_json is not None else {"data": layout}
    return json.dumps(doc, sort_keys=True, separators=(",", ":"), allow_nan=False).encode()


def decode_layout(blob: bytes, nbytes: int) -> Any:
    """Parse (never unpickle) a layout and check it describes exactly `nbytes`."""
    try:
        doc = json.loads(blob.decode("utf-8"))
        if set(doc) == {"weights"}:
            layout = WeightLayout.from_json(doc["weights"])
            if layout.total_bytes != nbytes:
                raise ValueError(f"layout describes {layout.total_bytes} bytes, the version has {nbytes}")
            return layout
        if set(doc) == {"data"}:
            return doc["data"]
        raise ValueError(f"expected a 'weights' or 'data' layout, got keys {sorted(doc)}")
    except (UnicodeDecodeError, ValueError, KeyError, TypeError) as e:
        raise Refused(f"bad layout: {e}") from e


def version_digest(
    secret: bytes, version: int, nbytes: int, chunk_bytes: int, layout_blob: bytes, crcs: list[int]
) -> bytes:
    """What authenticates a version: the trainer published exactly these bytes under this number."""
    h = hmac.new(secret, b"laminar-version/1|", hashlib.sha256)
    h.update(struct.pack("!qqq", version, nbytes, chunk_bytes))
    h.update(hashlib.sha256(layout_blob).digest())
    h.update(np.asarray(crcs, dtype=">u4").tobytes())
    return h.digest()


def check_begin(version: int, nbytes: int, chunk_bytes: int, *, last_version: int, max_bytes: int) -> None:
    """Bounds on a BEGIN header, checked before its layout is read or any memory is claimed."""
    if version < 0 or version < last_version:  # the same one again is a re-send after ABORT
        raise Refused(f"version {version} after {last_version} on this link: versions never go back")
    if not 0 <= nbytes <= max_bytes:
        raise Refused(f"version {version} of {nbytes} bytes: this relay takes 0 to {max_bytes}")
    if not MIN_CHUNK_BYTES <= chunk_bytes <= MAX_CHUNK_BYTES:
        raise Refused(f"chunk size {chunk_bytes}: expected {MIN_CHUNK_BYTES} to {MAX_CHUNK_BYTES} bytes")


def send_header(sock: socket.socket, kind: bytes, a: int = 0, b: int = 0, c: int = 0) -> None:
    sock.sendall(HEADER.pack(kind, a, b, c))


def send_begin(
    sock: socket.socket, version: int, nbytes: int, chunk_bytes: int, layout_blob: bytes, local_path: str = ""
) -> bytes:
    """Offer a version; the reply is SKIP, ACCEPT (send the payloads), or LOCAL: the receiver shares this
    machine's memory and copies each chunk from `local_path`, our slot, so CHUNK frames carry no payload and
    the sender waits for DONE before it may reuse the slot."""
    path = local_path.encode()
    head = HEADER.pack(BEGIN, version, nbytes, chunk_bytes) + struct.pack("!q", len(layout_blob))
    sock.sendall(head + layout_blob + struct.pack("!q", len(path)) + path)
    reply = recv_exact(sock, 1)
    if reply not in (ACCEPT, SKIP, LOCAL) or (reply == LOCAL and not path):
        raise Refused(f"unexpected reply {reply!r} to BEGIN")
    return reply


def send_chunk(sock: socket.socket, index: int, crc: int, fd: int, offset: int, length: int) -> None:
    """One chunk straight from the slot's file (sendfile: the kernel copies; a blocking socket whose kernel
    send timeout, SO_SNDTIMEO, turns a stalled peer into an error)."""
    sock.sendall(HEADER.pack(CHUNK, index, crc, length))
    out = sock.fileno()
    while length > 0:
        try:
            n = os.sendfile(out, fd, offset, length)
        except BlockingIOError as e:
            raise ConnectionLost("the downstream took nothing for the whole I/O timeout") from e
        if n == 0:
            raise ConnectionLost("sendfile wrote nothing: peer closed")
        offset += n
        length -= n


def tune(sock: socket.socket, io_timeout: float | None) -> None:
    """Blocking mode with kernel-side timeouts (no poll per call, which costs dearly where system calls do)
    and buffers big enough for multi-GB/s on one stream."""
    sock.settimeout(None)
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    for opt in (socket.SO_SNDBUF, socket.SO_RCVBUF):
        try:
            sock.setsockopt(socket.SOL_SOCKET, opt, SOCKET_BUFFER_BYTES)
        except OSError:
            pass  # capped by the system: fine
    set_io_timeout(sock, io_timeout)


def set_io_timeout(sock: socket.socket, seconds: float | None) -> None:
    """SO_RCVTIMEO / SO_SNDTIMEO: a blocked read or write fails after `seconds` (None: waits forever)."""
    s = 0.0 if seconds is None else seconds
    tv = struct.pack("ll", int(s), int((s - int(s)) * 1e6))
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVTIMEO, tv)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDTIMEO, tv)


def send_end(sock: socket.socket, version: int, digest: bytes) -> None:
    sock.sendall(HEADER.pack(END, version, 0, 0) + digest)


def recv_exact(sock: socket.socket, n: int) -> bytes:
    buf = bytearray(n)
    recv_into_exact(sock, memoryview(buf))
    return bytes(buf)


def recv_into_exact(sock: socket.socket, view: memoryview) -> None:
    got = 0
    while got < len(view):
        n = sock.recv_into(view[got:])
        if n == 0:
            raise ConnectionLost(f"peer closed after {got} of {len(view)} bytes")
        got += n


def recv_header(sock: socket.socket) -> tuple[bytes, int, int, int]:
    return HEADER.unpack(recv_exact(sock, HEADER.size))


def recv_layout_blob(sock: socket.socket) -> bytes:
    (n,) = struct.unpack("!q", recv_exact(sock, 8))
    if not 0 <= n <= MAX_LAYOUT_BYTES:
        raise Refused(f"layout of {n} bytes (at most {MAX_LAYOUT_BYTES})")
    return recv_exact(sock, n)


def recv_local_path(sock: socket.socket) -> str:
    (n,) = struct.unpack("!q", recv_exact(sock, 8))
    if not 0 <= n <= MAX_PATH_BYTES:
        raise Refused(f"slot path of {n} bytes (at most {MAX_PATH_BYTES})")
    return recv_exact(sock, n).decode("utf-8", errors="replace")


def drain(sock: socket.socket, n: int, scratch: memoryview) -> None:
    """Read and drop n bytes (a chunk of a version this relay refused or failed)."""
    while n > 0:
        k = min(n, len(scratch))
        recv_into_exact(sock, scratch[:k])
        n -= k
