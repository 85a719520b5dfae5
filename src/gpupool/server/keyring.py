"""Envelope encryption of job secrets (RELIABILITY.md S9, §4.4).

Every organisation has a random 256-bit data key, stored in `org_keys` wrapped (AES-256-GCM) by the master key;
a job's secret environment is sealed with its organisation's data key into `job_secrets`. The master key is a
file outside the database (DATA_DIR/master.key by default, made 0600 at first start), so a copy of the database,
its WAL or a dump holds no secret in the clear. Secrets are opened only when the binder builds a launch order.

Rotation (`python -m gpupool.server rotate-master-key`) re-wraps the data keys, never the secrets themselves:
1. the new key is written next to the old one as `master.key.next` (reused if a rotation died after step 2);
2. one transaction re-wraps every data key with it (each row names its master key by id);
3. `master.key.next` replaces `master.key`; rows still wrapped by the old key (made by a server that had not
   seen the new file yet) are re-wrapped again; every data key and secret is then opened to count failures.
A running control plane re-reads the key files when it meets an id it does not hold, so rotation needs no restart.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import json
import logging
import os
from dataclasses import dataclass
from pathlib import Path

from cryptography.exceptions import InvalidTag
from cryptography.hazmat.primitives.ciphers.aead import AESGCM
from sqlalchemy import select
from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import Session

from gpupool.server import pool_keys
from gpupool.server.db.engine import Database
from gpupool.server.db.models import Job, JobSecret, OrgKey, utcnow

log = logging.getLogger(__name__)
KEY_BYTES = 32
NONCE_BYTES = 12


class KeyringError(Exception):
    """A key is missing, malformed or does not open what it should (the message names the file or row)."""


def key_id(key: bytes) -> str:
    """A master key's public name: a hash prefix that reveals nothing about the key."""
    return hashlib.sha256(b"gpupool-master-key:" + key).hexdigest()[:16]


def _write_key(path: Path, key: bytes) -> None:
    """Create `path` (0600, never overwriting) holding `key` in base64, durably."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "w") as handle:
        handle.write(base64.b64encode(key).decode() + "\n")
        handle.flush()
        os.fsync(handle.fileno())
    _sync_dir(path.parent)


def _sync_dir(folder: Path) -> None:
    fd = os.open(folder, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def read_key(path: Path) -> bytes:
    try:
        key = base64.b64decode(path.read_text().strip(), validate=True)
    except (OSError, binascii.Error, ValueError) as exc:
        raise KeyringError(f"master key {path}: cannot read it ({exc.__class__.__name__})") from None
    if len(key) != KEY_BYTES:
        raise KeyringError(f"master key {path}: must hold {KEY_BYTES} bytes in base64")
    if path.stat().st_mode & 0o077:
        log.warning("master key %s is readable by group or others; chmod 600 it", path)
    return key


def ensure_master_key(path: Path) -> None:
    """Make a fresh random master key at `path` unless one is there (first start)."""
    if not path.exists():
        try:
            _write_key(path, AESGCM.generate_key(bit_length=256))
        except FileExistsError:
            pass  # another process made it first


def _next(path: Path) -> Path:
    return path.with_name(path.name + ".next")


def read_keys(path: Path) -> dict[str, bytes]:
    """The master keys on disk by id: `path`, plus `path.next` while a rotation is under way."""
    keys = {}
    for candidate in (path, _next(path)):
        if candidate.exists():
            key = read_key(candidate)
            keys[key_id(key)] = key
    if not path.exists():
        raise KeyringError(f"master key {path}: no such file")
    return keys


def _seal(key: bytes, plaintext: bytes, context: str) -> bytes:
    nonce = os.urandom(NONCE_BYTES)
    return nonce + AESGCM(key).encrypt(nonce, plaintext, context.encode())


def _open(key: bytes, sealed: bytes, context: str) -> bytes:
    return AESGCM(key).decrypt(sealed[:NONCE_BYTES], sealed[NONCE_BYTES:], context.encode())


def _wrap_context(org_id: str) -> str:
    return f"gpupool/org-key/{org_id}"


def _secret_context(org_id: str, job_id: str) -> str:
    return f"gpupool/job-secret/{org_id}/{job_id}"


class Keyring:
    """The control plane's master keys (read lazily from `path`) and a cache of opened data keys.

    Thread-safe enough for its use: dict reads and writes only, and a data key never changes once made.
    """

    def __init__(self, path: Path) -> None:
        self.path = path
        self._keys: dict[str, bytes] = {}
        self._primary = ""
        self._stamp: tuple[int, int] | None = None
        self._data_keys: dict[str, bytes] = {}

    def load(self) -> None:
        """(Re-)read the key files."""
        self._keys = read_keys(self.path)
        self._primary = key_id(read_key(self.path))
        status = self.path.stat()
        self._stamp = (status.st_ino, status.st_mtime_ns)

    def held(self) -> tuple[str, ...]:
        """The ids of the master keys on disk, the primary (`master.key` itself) first (re-read)."""
        self.load()
        return (self._primary, *sorted(set(self._keys) - {self._primary}))

    def _fresh(self) -> None:
        """Reload when master.key was replaced (a rotation), so new data keys are wrapped by the new key."""
        status = self.path.stat() if self.path.exists() else None
        if self._stamp is None or status is None or (status.st_ino, status.st_mtime_ns) != self._stamp:
            self.load()

    def master(self, wanted: str) -> bytes:
        if wanted not in self._keys:
            self.load()
        if wanted not in self._keys:
            raise KeyringError(f"a data key is wrapped by master key {wanted}, which {self.path} does not hold")
        return self._keys[wanted]

    def data_key(self, session: Session, org_id: str) -> bytes:
        """The organisation's data key, made and wrapped on first use (in the caller's transaction)."""
        cached = self._data_keys.get(org_id)
        if cached is not None:
            return cached
        row = session.get(OrgKey, org_id)
        if row is None:
            return self._new_data_key(session, org_id)
        key = self.unwrap(row)
        self._data_keys[org_id] = key  # only keys read from the database: a new one may yet roll back
        return key

    def _new_data_key(self, session: Session, org_id: str) -> bytes:
        self._fresh()
        key = AESGCM.generate_key(bit_length=256)
        try:
            with session.begin_nested():
                session.add(OrgKey(org_id=org_id, master_key_id=self._primary,
                                   wrapped=_seal(self._keys[self._primary], key, _wrap_context(org_id))))
        except IntegrityError:  # another request made it meanwhile: use that one
            row = session.get(OrgKey, org_id)
            if row is None:
                raise
            return self.unwrap(row)
        return key

    def unwrap(self, row: OrgKey) -> bytes:
        try:
            return _open(self.master(row.master_key_id), row.wrapped, _wrap_context(row.org_id))
        except InvalidTag:
            raise KeyringError(f"the data key of organisation {row.org_id} does not open with its master key") \
                from None

    def seal_job(self, session: Session, job: Job, values: dict[str, str]) -> None:
        """Store `values` as `job`'s secret environment, sealed with its organisation's data key."""
        plaintext = json.dumps(values, sort_keys=True).encode()
        sealed = _seal(self.data_key(session, job.org_id), plaintext, _secret_context(job.org_id, job.id))
        session.add(JobSecret(job_id=job.id, org_id=job.org_id, sealed=sealed))

    def open_job(self, session: Session, job: Job) -> dict[str, str]:
        """`job`'s secret environment in the clear ({} when it has none). Only the binder calls this."""
        row = session.get(JobSecret, job.id)
        if row is None:
            return {}
        try:
            plaintext = _open(self.data_key(session, row.org_id), row.sealed, _secret_context(row.org_id, job.id))
        except InvalidTag:
            raise KeyringError(f"the secrets of job {job.id} do not open with their organisation's key") from None
        return dict(json.loads(plaintext))

    def start(self, session: Session) -> None:
        """At control-plane start: make the master key on a database that has no data key yet, then refuse
        (KeyringError) when a data key is wrapped by a master key that is not on disk."""
        wrapped = set(session.scalars(select(OrgKey.master_key_id).distinct()))
        if not self.path.exists() and wrapped:
            raise KeyringError(f"master key {self.path} is missing but the database holds data keys wrapped by it: "
                               "restore the file (or set GPUPOOL_MASTER_KEY_FILE to it)")
        ensure_master_key(self.path)
        self.load()
        unknown = sorted(wrapped - set(self._keys))
        if unknown:
            raise KeyringError(f"master key {self.path} is not the one that wrapped the data keys in the database "
                               f"(key ids {', '.join(unknown)}): restore the right file")


@dataclass(frozen=True)
class Rotation:
    old_key_id: str
    new_key_id: str
    data_keys: int
    job_secrets: int
    undecryptable: int


def rotate_master_key(db: Database, path: Path) -> Rotation:
    """Re-wrap every data key with a new master key (see the module docstring for the steps)."""
    old_keys = read_keys(path)
    old_id = key_id(read_key(path))
    following = _next(path)
    if not following.exists():
        _write_key(following, AESGCM.generate_key(bit_length=256))  # step 1
    new_key = read_key(following)
    new_id = key_id(new_key)
    keys = {**old_keys, new_id: new_key}
    count = _rewrap(db, keys, new_id)  # step 2
    os.replace(following, path)  # step 3
    _sync_dir(path.parent)
    _rewrap(db, keys, new_id)
    with db.session() as session:  # the pool's master key is the new one: standbys need the new file to lead
        pool_keys.record_master_key(session, new_id)
    keyring = Keyring(path)
    keyring.load()
    data_keys, secrets_, undecryptable = _verify(db, keyring)
    log.warning("master key rotated: %s -> %s, %d data keys re-wrapped", old_id, new_id, count)
    return Rotation(old_id, new_id, data_keys, secrets_, undecryptable)


def _rewrap(db: Database, keys: dict[str, bytes], new_id: str) -> int:
    count = 0
    with db.session() as session:
        rows = session.scalars(select(OrgKey).where(OrgKey.master_key_id != new_id).with_for_update())
        for row in rows:
            if row.master_key_id not in keys:
                raise KeyringError(f"the data key of organisation {row.org_id} is wrapped by master key "
                                   f"{row.master_key_id}, which is not on disk; nothing was changed")
            try:
                plain = _open(keys[row.master_key_id], row.wrapped, _wrap_context(row.org_id))
            except InvalidTag:
                raise KeyringError(f"the data key of organisation {row.org_id} does not open with master key "
                                   f"{row.master_key_id}; nothing was changed") from None
            row.wrapped = _seal(keys[new_id], plain, _wrap_context(row.org_id))
            row.master_key_id, row.rewrapped_at = new_id, utcnow()
            count += 1
    return count


def _verify(db: Database, keyring: Keyring) -> tuple[int, int, int]:
    """(data keys, job secrets, how many of either fail to open) with the keys on disk now."""
    failed = 0
    with db.session() as session:
        rows = list(session.scalars(select(OrgKey)))
        for row in rows:
            try:
                keyring.unwrap(row)
            except KeyringError:
                failed += 1
        secrets_ = list(session.scalars(select(JobSecret)))
        for secret in secrets_:
            try:
                _open(keyring.data_key(session, secret.org_id), secret.sealed,
                      _secret_context(secret.org_id, secret.job_id))
            except (KeyringError, InvalidTag):
                failed += 1
    return len(rows), len(secrets_), failed
