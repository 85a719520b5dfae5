"""The control plane's order-signing key (RELIABILITY.md §4.2): Ed25519, made at first start, kept in DATA_DIR
(or at GPUPOOL_ORDER_KEY_FILE):

    order-signing.key   the private key, PKCS#8 PEM, mode 0600; never leaves the control plane
    order-signing.pub   beside it. Line 1: the public key (base64, what agents pin at registration); line 2: its
                        sha256 hash (what `gpupool agent --cp-key-hash` takes)

Created with the crash-safe pattern (write a temporary file, fsync, then link it into place, which fails if
another process got there first, so two control planes starting on one data dir end up with the same key).
An existing key file that cannot be read stops the start instead of being replaced: a new key would make every
registered agent refuse every order. Control planes that take over from one another (PostgreSQL leases) must share
this key (GPUPOOL_ORDER_KEY_FILE on shared storage, or a copy in each data dir), or their agents will refuse the
new leader's orders.
"""

from __future__ import annotations

import logging
import os
import secrets
import stat
from pathlib import Path

from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from cryptography.hazmat.primitives.serialization import (
    Encoding,
    NoEncryption,
    PrivateFormat,
    load_pem_private_key,
)

from gpupool.protocol.signing import OrderSigner, key_hash

log = logging.getLogger(__name__)

def load_or_create(path: Path) -> OrderSigner:
    """The signer of the key at `path`, creating the key (and the .pub file beside it) on first use.

    Raises RuntimeError when a key file exists but is not an Ed25519 private key.
    """
    path.parent.mkdir(parents=True, exist_ok=True)
    if not path.exists():
        _create(path)
    signer = OrderSigner(_load(path))
    public = path.with_suffix(".pub")
    text = f"{signer.public_key}\n{key_hash(signer.public_key)}\n"
    if not public.exists() or public.read_text() != text:
        write_atomically(public, text.encode(), 0o644)
    log.info("orders are signed with key %s (%s)", key_hash(signer.public_key), path)
    return signer


def _load(path: Path) -> Ed25519PrivateKey:
    mode = stat.S_IMODE(path.stat().st_mode)
    if mode & 0o077:
        log.warning("%s is readable by others (mode %o): anyone who reads it can order work on every node", path, mode)
    try:
        key = load_pem_private_key(path.read_bytes(), password=None)
    except (OSError, ValueError, TypeError) as exc:
        raise RuntimeError(f"cannot read the order-signing key {path}: {exc}; restore it (a new key would make "
                           "every registered agent refuse every order)") from exc
    if not isinstance(key, Ed25519PrivateKey):
        raise RuntimeError(f"{path} holds a {type(key).__name__}, not an Ed25519 private key")
    return key


def _create(path: Path) -> None:
    create_exclusively(path, Ed25519PrivateKey.generate().private_bytes(Encoding.PEM, PrivateFormat.PKCS8,
                                                                        NoEncryption()))


def create_exclusively(path: Path, pem: bytes) -> None:
    """Write `pem` to `path` (0600, fsynced) unless the file exists by then: whoever links first wins."""
    tmp = path.with_name(f".{path.name}.{secrets.token_hex(6)}.tmp")
    _write(tmp, pem, 0o600)
    try:
        os.link(tmp, path)
    except FileExistsError:
        pass  # another process made it first: use theirs
    finally:
        tmp.unlink(missing_ok=True)
    _fsync_dir(path.parent)


def write_atomically(path: Path, data: bytes, mode: int) -> None:
    tmp = path.with_name(f".{path.name}.{secrets.token_hex(6)}.tmp")
    _write(tmp, data, mode)
    os.replace(tmp, path)
    _fsync_dir(path.parent)


def _write(path: Path, data: bytes, mode: int) -> None:
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, mode)
    with os.fdopen(fd, "wb") as out:
        out.write(data)
        out.flush()
        os.fsync(out.fileno())
    os.chmod(path, mode)  # O_CREAT's mode is masked by the umask, and a leftover file keeps its old mode


def _fsync_dir(directory: Path) -> None:
    fd = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
