"""Signed orders (RELIABILITY.md §4.2): the control plane signs every launch and stop order with Ed25519, and the
agent verifies each one against the public key it pinned at registration.

The signature covers a canonical encoding of every field of the order except `signature` itself, including
`type` and `node_id`: sorted-key, compact, ASCII JSON of the frame's JSON form, after a domain prefix. A changed
command, env, image, GPU, epoch, expiry or node makes it fail, and so does a stop order presented as anything else.
Keys travel as base64 of their 32 raw bytes; `key_hash` gives the "sha256:<hex>" form operators pin out of band.
The private key is the control plane's alone (gpupool.server.order_keys keeps it on disk); this module holds only
what both sides need.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import hmac
import json
from typing import TypeVar

from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey, Ed25519PublicKey
from cryptography.hazmat.primitives.serialization import Encoding, PublicFormat

from gpupool.protocol.agent import Launch, Stop

DOMAIN = b"gpupool-order-v1\n"
KEY_HASH_PREFIX = "sha256:"
Order = TypeVar("Order", Launch, Stop)


def canonical(order: Launch | Stop) -> bytes:
    """The bytes a signature covers: DOMAIN, then the order's JSON form without `signature`, keys sorted.

    Raises ValueError for a value JSON cannot carry exactly (an infinite or NaN float).
    """
    body = order.model_dump(mode="json", exclude={"signature"})
    text = json.dumps(body, sort_keys=True, separators=(",", ":"), ensure_ascii=True, allow_nan=False)
    return DOMAIN + text.encode("ascii")


def key_hash(public_key: str) -> str:
    """"sha256:<hex>" of a base64 public key's raw bytes (what `gpupool agent --cp-key-hash` pins)."""
    return KEY_HASH_PREFIX + hashlib.sha256(_raw_key(public_key)).hexdigest()


def hash_matches(public_key: str, pinned: str) -> bool:
    """True when `pinned` ("sha256:<hex>" or bare hex, any case) is the hash of `public_key`."""
    want = pinned.strip().lower().removeprefix(KEY_HASH_PREFIX)
    try:
        got = key_hash(public_key).removeprefix(KEY_HASH_PREFIX)
    except ValueError:
        return False
    return hmac.compare_digest(got, want)


class OrderSigner:
    """The control plane's half: seals orders for one node. Thread-safe (the key is immutable)."""

    def __init__(self, private_key: Ed25519PrivateKey) -> None:
        self._key = private_key
        raw = private_key.public_key().public_bytes(Encoding.Raw, PublicFormat.Raw)
        self.public_key = base64.b64encode(raw).decode("ascii")

    @classmethod
    def generate(cls) -> OrderSigner:
        return cls(Ed25519PrivateKey.generate())

    def seal(self, order: Order, node_id: str) -> Order:
        """`order` addressed to `node_id` and signed. Raises ValueError when the order already names another node
        (a bug upstream: the order would be refused there anyway)."""
        if order.node_id and order.node_id != node_id:
            raise ValueError(f"order for node {order.node_id} sent to node {node_id}")
        addressed = order.model_copy(update={"node_id": node_id, "signature": ""})
        signature = self._key.sign(canonical(addressed))
        return addressed.model_copy(update={"signature": base64.b64encode(signature).decode("ascii")})


class OrderVerifier:
    """The agent's half: checks orders against the pinned public key (base64). An empty or malformed key verifies
    nothing, so an agent without a pinned key refuses every order."""

    def __init__(self, public_key: str) -> None:
        try:
            self._key: Ed25519PublicKey | None = Ed25519PublicKey.from_public_bytes(_raw_key(public_key))
        except ValueError:
            self._key = None

    @property
    def pinned(self) -> bool:
        return self._key is not None

    def verify(self, order: Launch | Stop) -> bool:
        """True when `order.signature` is this key's signature over `canonical(order)`."""
        if self._key is None or not order.signature:
            return False
        try:
            signature = base64.b64decode(order.signature, validate=True)
            self._key.verify(signature, canonical(order))
        except (InvalidSignature, ValueError, binascii.Error):
            return False
        return True


def _raw_key(public_key: str) -> bytes:
    try:
        raw = base64.b64decode(public_key, validate=True)
    except binascii.Error as exc:
        raise ValueError(f"not a base64 key: {exc}") from exc
    if len(raw) != 32:
        raise ValueError(f"an Ed25519 public key has 32 bytes, not {len(raw)}")
    return raw
