"""The control plane's CA for the agent channel (RELIABILITY.md §4.2), kept in DATA_DIR:

    ca.key              the CA's private key (EC P-256, PKCS#8 PEM), mode 0600; never leaves the control plane
    ca.crt              its self-signed certificate: what agents trust for the channel, and pin by its key's hash
                        (gpupool.protocol.tls.ca_hash; `gpupool join-token create` prints it)
    agent-listener.pem  the channel listener's key and certificate (one file, 0600), made afresh at every start;
                        it names 127.0.0.1, ::1, localhost, the host name, the bind address and the extra names given

The CA key is made once, with the crash-safe pattern of gpupool.server.order_keys (two control planes starting on
one data dir end up with the same key), and a CA key that exists but cannot be read stops the start: a new CA would
cut every registered agent off. Control planes that take over from one another must share ca.key and ca.crt.

`issue` signs a node's CSR: subject CN and SAN URI name the node id (the CSR's own subject is ignored), usage
clientAuth only, a random serial; the caller records the serial (`agent_certificates`), whose row is the denylist.
"""

from __future__ import annotations

import datetime as dt
import ipaddress
import secrets
import socket
import ssl
from dataclasses import dataclass
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.hazmat.primitives.serialization import (
    Encoding,
    NoEncryption,
    PrivateFormat,
    load_pem_private_key,
)
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

from gpupool.protocol.tls import NODE_URI_PREFIX, ca_hash
from gpupool.server import order_keys

CA_KEY, CA_CERT, LISTENER_PEM = "ca.key", "ca.crt", "agent-listener.pem"
CA_YEARS = 10
BACKDATE = dt.timedelta(days=1)  # for certificates agents check with their own (possibly slow) clocks


class CertificateRequestError(ValueError):
    """A CSR that is malformed, badly signed or not an acceptable key type."""


@dataclass(frozen=True)
class Issued:
    pem: str
    serial: str  # hex
    not_after: dt.datetime


class AgentCA:
    """The CA of one data dir; thread-safe (immutable after loading)."""

    def __init__(self, key: ec.EllipticCurvePrivateKey, cert: x509.Certificate, data_dir: Path) -> None:
        self._key, self._cert, self.data_dir = key, cert, data_dir
        self.pem = cert.public_bytes(Encoding.PEM).decode()
        self.hash = ca_hash(self.pem)

    @classmethod
    def load_or_create(cls, data_dir: Path) -> AgentCA:
        """The CA in `data_dir`, made on first use. Raises RuntimeError when ca.key exists but is unreadable."""
        data_dir.mkdir(parents=True, exist_ok=True)
        key_path, cert_path = data_dir / CA_KEY, data_dir / CA_CERT
        if not key_path.exists():
            pem = ec.generate_private_key(ec.SECP256R1()).private_bytes(
                Encoding.PEM, PrivateFormat.PKCS8, NoEncryption())
            order_keys.create_exclusively(key_path, pem)
        try:
            key = load_pem_private_key(key_path.read_bytes(), password=None)
        except (OSError, ValueError, TypeError) as exc:
            raise RuntimeError(f"cannot read the agent CA key {key_path}: {exc}; restore it (a new CA would cut off "
                               "every registered agent)") from exc
        if not isinstance(key, ec.EllipticCurvePrivateKey):
            raise RuntimeError(f"{key_path} holds a {type(key).__name__}, not an EC private key")
        cert = _load_cert(cert_path)
        if cert is None or cert.public_key() != key.public_key():
            cert = _self_signed(key)
            order_keys.write_atomically(cert_path, cert.public_bytes(Encoding.PEM), 0o644)
        return cls(key, cert, data_dir)

    def issue(self, csr_pem: str, node_id: str, lifetime_s: float) -> Issued:
        """A client certificate for `node_id` on the key of `csr_pem`, valid `lifetime_s` from now."""
        try:
            csr = x509.load_pem_x509_csr(csr_pem.encode())
        except ValueError as exc:
            raise CertificateRequestError(f"malformed certificate request: {exc}") from exc
        if not csr.is_signature_valid:
            raise CertificateRequestError("the certificate request's signature does not verify")
        if not isinstance(csr.public_key(), ec.EllipticCurvePublicKey):
            raise CertificateRequestError("the certificate request must be for an EC key")
        now = dt.datetime.now(dt.UTC)
        backdate = min(dt.timedelta(seconds=60), dt.timedelta(seconds=lifetime_s / 10))
        not_after = now + dt.timedelta(seconds=lifetime_s)
        serial = x509.random_serial_number()
        cert = (
            x509.CertificateBuilder()
            .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, node_id)]))
            .issuer_name(self._cert.subject)
            .public_key(csr.public_key())
            .serial_number(serial)
            .not_valid_before(now - backdate)
            .not_valid_after(not_after)
            .add_extension(x509.SubjectAlternativeName([x509.UniformResourceIdentifier(NODE_URI_PREFIX + node_id)]),
                           critical=False)
            .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.CLIENT_AUTH]), critical=False)
            .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
            .sign(self._key, hashes.SHA256())
        )
        return Issued(cert.public_bytes(Encoding.PEM).decode(), format(serial, "x"), not_after)

    def server_context(self, bind_host: str, extra_names: str) -> ssl.SSLContext:
        """The listener's TLS context: TLS 1.3 only, a client certificate from this CA required, no session
        tickets, and a fresh listener certificate (written to LISTENER_PEM, as `ssl` loads keys from files).

        Without tickets no session resumes, so every connection presents its certificate and meets the revocation
        check. Tickets also cost handshakes: with them, asyncio's server side left about one handshake in 400
        unanswered on a loaded 2-core machine (Python 3.11, websockets 17; the server closed the connection
        without answering the upgrade), and none in 6,500 without them (issue 4's notes)."""
        key = ec.generate_private_key(ec.SECP256R1())
        cert = self._listener_cert(key, _listener_names(bind_host, extra_names))
        pem = key.private_bytes(Encoding.PEM, PrivateFormat.PKCS8, NoEncryption()) + cert.public_bytes(Encoding.PEM)
        path = self.data_dir / LISTENER_PEM
        order_keys.write_atomically(path, pem, 0o600)
        context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        context.minimum_version = ssl.TLSVersion.TLSv1_3
        context.verify_mode = ssl.CERT_REQUIRED
        context.num_tickets = 0
        context.load_verify_locations(cadata=self.pem)
        context.load_cert_chain(path)
        return context

    def _listener_cert(self, key: ec.EllipticCurvePrivateKey, names: list[x509.GeneralName]) -> x509.Certificate:
        now = dt.datetime.now(dt.UTC)
        return (
            x509.CertificateBuilder()
            .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "gpupool agent channel")]))
            .issuer_name(self._cert.subject)
            .public_key(key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(now - BACKDATE)
            .not_valid_after(now + dt.timedelta(days=365 * CA_YEARS))
            .add_extension(x509.SubjectAlternativeName(names), critical=False)
            .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH]), critical=False)
            .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
            .sign(self._key, hashes.SHA256())
        )


def _load_cert(path: Path) -> x509.Certificate | None:
    try:
        return x509.load_pem_x509_certificate(path.read_bytes())
    except (OSError, ValueError):
        return None


def _self_signed(key: ec.EllipticCurvePrivateKey) -> x509.Certificate:
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "gpupool agent CA")])
    now = dt.datetime.now(dt.UTC)
    return (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(name)
        .public_key(key.public_key())
        .serial_number(int.from_bytes(secrets.token_bytes(16)) >> 1)
        .not_valid_before(now - BACKDATE)
        .not_valid_after(now + dt.timedelta(days=365 * CA_YEARS))
        .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
        .add_extension(x509.KeyUsage(digital_signature=False, content_commitment=False, key_encipherment=False,
                                     data_encipherment=False, key_agreement=False, key_cert_sign=True, crl_sign=True,
                                     encipher_only=False, decipher_only=False), critical=True)
        .sign(key, hashes.SHA256())
    )


def _listener_names(bind_host: str, extra_names: str) -> list[x509.GeneralName]:
    """SANs of the listener certificate: loopback names, the host name, the bind address (unless a wildcard) and
    `extra_names` (comma-separated), each an IPAddress or a DNSName."""
    wanted = ["127.0.0.1", "::1", "localhost", socket.gethostname(), socket.getfqdn(), bind_host,
              *(n.strip() for n in extra_names.split(","))]
    names: list[x509.GeneralName] = []
    for name in dict.fromkeys(n for n in wanted if n and n not in ("0.0.0.0", "::")):
        try:
            general: x509.GeneralName = x509.IPAddress(ipaddress.ip_address(name))
        except ValueError:
            general = x509.DNSName(name)
        names.append(general)
    return names
