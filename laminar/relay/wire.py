"""The relay-to-relay byte protocol over one TCP connection.

A version travels as BEGIN (version, nbytes, chunk_bytes, layout) answered by one byte (accept or skip), then
CHUNK frames (index, crc32, length, payload) and END, or ABORT when the sender lost its upstream midway. Fixed
headers keep the receiver able to `recv_into` payloads straight into its slot.
"""

from __future__ import annotations

import os
import pickle
import socket
import struct
from typing import Any

HEADER = struct.Struct("!4sqqq")
BEGIN, CHUNK, END, ABORT = b"BEGN", b"CHNK", b"END_", b"ABRT"
ACCEPT, SKIP = b"A", b"S"


class ConnectionLost(ConnectionError):
    """The peer closed the connection or died; a relay treats its link as gone."""


def send_header(sock: socket.socket, kind: bytes, a: int = 0, b: int = 0, c: int = 0) -> None:
    sock.sendall(HEADER.pack(kind, a, b, c))


def send_begin(sock: socket.socket, version: int, nbytes: int, chunk_bytes: int, layout: Any) -> bool:
    """Offer a version; True when the receiver wants it."""
    blob = pickle.dumps(layout, protocol=pickle.HIGHEST_PROTOCOL)
    sock.sendall(HEADER.pack(BEGIN, version, nbytes, chunk_bytes) + struct.pack("!q", len(blob)) + blob)
    return recv_exact(sock, 1) == ACCEPT


def send_chunk(sock: socket.socket, index: int, crc: int, fd: int, offset: int, length: int) -> None:
    """Send one chunk straight from the slot's file (sendfile: no copy through this process)."""
    sock.sendall(HEADER.pack(CHUNK, index, crc, length))
    out = sock.fileno()
    while length > 0:
        n = os.sendfile(out, fd, offset, length)
        if n == 0:
            raise ConnectionLost("sendfile wrote nothing: peer closed")
        offset += n
        length -= n


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


def recv_layout(sock: socket.socket) -> Any:
    (n,) = struct.unpack("!q", recv_exact(sock, 8))
    return pickle.loads(recv_exact(sock, n))


def drain(sock: socket.socket, n: int, scratch: memoryview) -> None:
    """Read and drop n bytes (a chunk of a version this relay refused or failed)."""
    while n > 0:
        k = min(n, len(scratch))
        recv_into_exact(sock, scratch[:k])
        n -= k
