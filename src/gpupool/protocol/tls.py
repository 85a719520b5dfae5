"""The agent channel's TLS identities (RELIABILITY.md §4.2), what both sides need.

The control plane runs a private CA for its agents (gpupool.server.agent_ca). A node's client certificate names
the node id as its subject common name and as a SAN URI `NODE_URI_PREFIX + node_id`, with the clientAuth usage
only (it cannot serve as a control-plane certificate). Operators pin the CA out of band by `ca_hash`: "sha256:"
and the hex SHA-256 of the CA's DER SubjectPublicKeyInfo (kubeadm's `--discovery-token-ca-cert-hash` form).
"""

from __future__ import annotations

import hashlib
import hmac
from datetime import datetime

from cryptography import x509
from cryptography.hazmat.primitives.serialization import Encoding, PublicFormat

HASH_PREFIX = "sha256:"
NODE_URI_PREFIX = "urn:gpupool:node:"


def ca_hash(ca_pem: str) -> str:
    """"sha256:<hex>" of the public key of the certificate `ca_pem`. Raises ValueError for a malformed one."""
    cert = x509.load_pem_x509_certificate(ca_pem.encode())
    spki = cert.public_key().public_bytes(Encoding.DER, PublicFormat.SubjectPublicKeyInfo)
    return HASH_PREFIX + hashlib.sha256(spki).hexdigest()


def ca_hash_matches(ca_pem: str, pinned: str) -> bool:
    """True when `pinned` ("sha256:<hex>" or bare hex, any case) is `ca_hash(ca_pem)`; False for a malformed CA."""
    want = pinned.strip().lower().removeprefix(HASH_PREFIX)
    try:
        got = ca_hash(ca_pem).removeprefix(HASH_PREFIX)
    except ValueError:
        return False
    return hmac.compare_digest(got, want)


def node_of(cert: x509.Certificate) -> str:
    """The node id a client certificate was issued to (its SAN URI), or "" when it names none."""
    try:
        san = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    except x509.ExtensionNotFound:
        return ""
    uris = [u for u in san.get_values_for_type(x509.UniformResourceIdentifier) if u.startswith(NODE_URI_PREFIX)]
    return uris[0].removeprefix(NODE_URI_PREFIX) if len(uris) == 1 else ""


def validity(cert_pem: str) -> tuple[datetime, datetime]:
    """(not_before, not_after) of a PEM certificate, timezone-aware UTC."""
    cert = x509.load_pem_x509_certificate(cert_pem.encode())
    return cert.not_valid_before_utc, cert.not_valid_after_utc
