"""Optional TLS on relay links (`relay.tls`), for networks where a man in the middle is possible.

The HMAC handshake and version digests (wire.py) already keep anyone without the run's secret from feeding a
relay, and keep unpublished bytes from being exposed; TLS adds confidentiality of the weights on the wire and
refuses a tampered stream at once rather than at the version's END. The driver makes one self-signed certificate
per run (the `openssl` command line, present wherever Python's ssl module is) and hands it to every relay
through Ray, as it hands the secret; both ends of a link present it and accept only it (mutual TLS).
"""

from __future__ import annotations

import os
import shutil
import ssl
import subprocess
import tempfile
from dataclasses import dataclass


@dataclass(frozen=True)
class RunCertificate:
    cert_pem: bytes
    key_pem: bytes

    @classmethod
    def make(cls) -> RunCertificate:
        openssl = shutil.which("openssl")
        if openssl is None:
            raise RuntimeError("relay.tls=true needs the `openssl` command to make the run's certificate")
        with tempfile.TemporaryDirectory() as d:
            key, cert = os.path.join(d, "key.pem"), os.path.join(d, "cert.pem")
            subprocess.run(
                [openssl, "req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1",
                 "-nodes", "-days", "30", "-subj", "/CN=laminar-relay", "-keyout", key, "-out", cert],
                check=True,
                capture_output=True,
            )  # fmt: skip
            with open(cert, "rb") as c, open(key, "rb") as k:
                return cls(c.read(), k.read())

    def contexts(self) -> tuple[ssl.SSLContext, ssl.SSLContext]:
        """(server, client) contexts that present this certificate and trust only it."""
        server = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        client = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
        client.check_hostname = False  # relays are addressed by IP; the pinned certificate is the identity
        with tempfile.TemporaryDirectory() as d:  # ssl loads key pairs from files only
            cert, key = os.path.join(d, "cert.pem"), os.path.join(d, "key.pem")
            fd = os.open(key, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
            with os.fdopen(fd, "wb") as f:
                f.write(self.key_pem)
            with open(cert, "wb") as f:
                f.write(self.cert_pem)
            for ctx in (server, client):
                ctx.minimum_version = ssl.TLSVersion.TLSv1_3
                ctx.load_cert_chain(cert, key)
                ctx.load_verify_locations(cadata=self.cert_pem.decode())
                ctx.verify_mode = ssl.CERT_REQUIRED
        return server, client
