"""The agent's TLS identity on the channel (RELIABILITY.md §4.2).

The node makes its private key itself (EC P-256); it never leaves the node: only a CSR goes to the control plane,
at registration and at each renewal. `ChannelTls` is what node.json keeps (0600): key, certificate and the CA
certificate learnt at registration (checked there against `--ca-hash` when given). `context()` is a TLS 1.3 client
context that trusts that CA only and checks the listener's name, and presents the node's certificate.

`Renewal` renews the certificate over the live channel: once it is past 2/3 of its lifetime (on the control
plane's clock) it makes a fresh key and CSR (`request`), and `accept`s the certificate that comes back when it is
for that key and signed by the CA; `on_renewed` then saves it, and the next connection uses it.
"""

from __future__ import annotations

import contextlib
import datetime as dt
import os
import ssl
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path

from cryptography import x509
from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives import hashes
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.hazmat.primitives.serialization import Encoding, NoEncryption, PrivateFormat, load_pem_private_key
from cryptography.x509.oid import NameOID

RENEW_AT = 2 / 3
RENEW_RETRY_S = 30.0


def new_key() -> str:
    """A fresh private key, PKCS#8 PEM."""
    key = ec.generate_private_key(ec.SECP256R1())
    return key.private_bytes(Encoding.PEM, PrivateFormat.PKCS8, NoEncryption()).decode()


def csr_for(key_pem: str, name: str) -> str:
    """A PEM certificate request on `key_pem` (the control plane puts the node id in the certificate itself)."""
    key = load_pem_private_key(key_pem.encode(), password=None)
    assert isinstance(key, ec.EllipticCurvePrivateKey)
    request = x509.CertificateSigningRequestBuilder().subject_name(
        x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, name)])).sign(key, hashes.SHA256())
    return request.public_bytes(Encoding.PEM).decode()


def certificate_fits(cert_pem: str, key_pem: str, ca_pem: str) -> bool:
    """True when `cert_pem` is on the key `key_pem` and signed by the CA `ca_pem`."""
    try:
        cert = x509.load_pem_x509_certificate(cert_pem.encode())
        ca = x509.load_pem_x509_certificate(ca_pem.encode())
        key = load_pem_private_key(key_pem.encode(), password=None)
        cert.verify_directly_issued_by(ca)
    except (ValueError, TypeError, InvalidSignature):
        return False
    return cert.public_key() == key.public_key()


@dataclass(frozen=True)
class ChannelTls:
    key: str
    certificate: str
    ca_certificate: str

    @property
    def validity(self) -> tuple[dt.datetime, dt.datetime]:
        cert = x509.load_pem_x509_certificate(self.certificate.encode())
        return cert.not_valid_before_utc, cert.not_valid_after_utc

    def context(self, scratch: Path | None = None) -> ssl.SSLContext:
        """A client context: TLS 1.3, the CA alone trusted, host names checked, the node certificate presented
        (its key passes through a private temporary file in `scratch`, as `ssl` loads keys from files only)."""
        context = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
        context.minimum_version = ssl.TLSVersion.TLSv1_3
        context.load_verify_locations(cadata=self.ca_certificate)
        fd, path = tempfile.mkstemp(prefix=".tls-", dir=scratch)  # mode 0600
        try:
            with os.fdopen(fd, "w") as out:
                out.write(self.key + self.certificate)
            context.load_cert_chain(path)
        finally:
            with contextlib.suppress(OSError):
                os.unlink(path)
        return context


class Renewal:
    """See the module docstring. `now` gives the control plane's wall clock (seconds since the epoch)."""

    def __init__(self, tls: ChannelTls, name: str, now: Callable[[], float],
                 on_renewed: Callable[[ChannelTls], None], scratch: Path | None = None) -> None:
        self.tls, self._name, self._now, self._on_renewed, self._scratch = tls, name, now, on_renewed, scratch
        self._pending_key = ""
        self._asked_at = float("-inf")
        self.renewals = 0

    def due(self) -> bool:
        start, end = self.tls.validity
        return self._now() >= start.timestamp() + RENEW_AT * (end - start).total_seconds()

    def expired(self) -> bool:
        return self._now() >= self.tls.validity[1].timestamp()

    def request(self) -> str | None:
        """A CSR to send in `Renew` when renewal is due and none was asked for lately (RENEW_RETRY_S, or a tenth
        of the lifetime when shorter)."""
        start, end = self.tls.validity
        retry_s = min(RENEW_RETRY_S, (end - start).total_seconds() / 10)
        if not self.due() or time.monotonic() - self._asked_at < retry_s:
            return None
        self._pending_key = new_key()
        self._asked_at = time.monotonic()
        return csr_for(self._pending_key, self._name)

    def accept(self, cert_pem: str) -> bool:
        """Take the certificate `Certificate` brought, if it is for the key asked with and the pinned CA's."""
        if not self._pending_key or not certificate_fits(cert_pem, self._pending_key, self.tls.ca_certificate):
            return False
        self.tls = replace(self.tls, key=self._pending_key, certificate=cert_pem)
        self._pending_key, self._asked_at = "", float("-inf")
        self.renewals += 1
        self._on_renewed(self.tls)
        return True

    def context(self) -> ssl.SSLContext:
        return self.tls.context(self._scratch)
