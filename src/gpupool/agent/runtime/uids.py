"""Transient uids for process jobs, as systemd's `DynamicUser=`: a configured range, the processes of a uid, and
host-wide claims so that no two jobs (of this agent or of another agent on the same host) ever share a uid.

A uid is claimed by creating `<claims dir>/<uid>` (O_EXCL, under an flock of the claims dir) after checking that no
live process has it as any of its user or group ids and that it names no account or group of this host. The file
holds the claimer's workload folder. A claim whose folder is gone and whose uid no process has is stale (its agent's
data was deleted) and may be taken over. The claimer releases its claim (`release`) only after every process of the
uid is gone; the claims dir lives on /run, so a reboot clears it together with every process.
"""

from __future__ import annotations

import contextlib
import fcntl
import grp
import os
import pwd
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from gpupool.agent.runtime.procfs import PROC

DEFAULT_RANGE = "61184-65519"  # systemd's range for dynamic users
CLAIMS_DIR = Path("/run/gpupool/uids")
#: never handed out: root, nobody (65534, also the default container user) and the kernel's overflow id 65535
FORBIDDEN = frozenset({0, 65534, 65535})
MAX_ID = (1 << 31) - 1


@dataclass(frozen=True, slots=True)
class UidRange:
    """The uids `first..last` (both included)."""

    first: int
    last: int

    @classmethod
    def parse(cls, text: str) -> UidRange:
        """"FIRST-LAST"; ValueError (naming `--job-uid-range`) when malformed, reversed, outside 1..2^31-1, or holding
        an id of FORBIDDEN."""
        parts = text.strip().split("-")
        if len(parts) != 2 or not all(part.isdigit() for part in parts):
            raise ValueError(f"--job-uid-range {text!r}: must be FIRST-LAST, e.g. {DEFAULT_RANGE}")
        first, last = int(parts[0]), int(parts[1])
        if not 1 <= first <= last <= MAX_ID:
            raise ValueError(f"--job-uid-range {text!r}: needs 1 <= FIRST <= LAST <= {MAX_ID}")
        held = sorted(uid for uid in FORBIDDEN if first <= uid <= last)
        if held:
            raise ValueError(f"--job-uid-range {text!r}: holds {held[0]}, which is never a job's uid")
        return cls(first, last)

    def __len__(self) -> int:
        return self.last - self.first + 1

    def after(self, uid: int) -> Iterator[int]:
        """Every uid of the range once, starting after `uid` and wrapping around (round robin, so that a released
        uid is handed out again as late as possible)."""
        start = uid + 1 if self.first <= uid < self.last else self.first
        yield from range(start, self.last + 1)
        yield from range(self.first, start)


def _status_ids(text: str) -> tuple[str, set[int], set[int]]:
    """(state letter, user ids, group ids) of a /proc/<pid>/status text."""
    fields = dict(line.split(":", 1) for line in text.splitlines() if ":" in line)
    state = fields.get("State", "?").strip()[:1]
    return state, {int(v) for v in fields.get("Uid", "").split()}, {int(v) for v in fields.get("Gid", "").split()}


def _live_statuses(proc: Path) -> Iterator[tuple[int, set[int], set[int]]]:
    """(pid, user ids, group ids) of every live process (zombies excluded: they have ended)."""
    for entry in os.scandir(proc):
        if not entry.name.isdigit():
            continue
        try:
            state, uids, gids = _status_ids((proc / entry.name / "status").read_text())
        except (OSError, ValueError):
            continue  # it ended while we looked
        if state not in ("Z", "X"):
            yield int(entry.name), uids, gids


def ids_in_use(proc: Path = PROC) -> set[int]:
    """Every user and group id (real, effective, saved, file system) of a live process."""
    found: set[int] = set()
    for _, uids, gids in _live_statuses(proc):
        found |= uids | gids
    return found


def processes_of(uid: int, proc: Path = PROC) -> list[int]:
    """The live processes that have `uid` as one of their user ids."""
    return [pid for pid, uids, _ in _live_statuses(proc) if uid in uids]


def names_an_account(uid: int) -> bool:
    """True when `uid` is a user or a group id this host knows by name (never hand those out)."""
    for lookup in (pwd.getpwuid, grp.getgrgid):
        try:
            lookup(uid)
            return True
        except KeyError:
            pass
    return False


class UidClaims:
    """Claims transient uids of `uid_range` in `directory` (see the module docstring). Thread-safe and safe across
    processes (the flock)."""

    def __init__(self, uid_range: UidRange, directory: Path = CLAIMS_DIR, proc: Path = PROC) -> None:
        self.range = uid_range
        self.directory = directory
        self._proc = proc
        self._last = uid_range.last

    def claim(self, owner: Path) -> int:
        """A free uid, now claimed for `owner` (a workload folder that exists). LookupError when none is free."""
        with self._locked():
            busy = ids_in_use(self._proc)
            for uid in self.range.after(self._last):
                if uid not in busy and self._unclaimed(uid) and not names_an_account(uid):
                    _write_private(self.directory / str(uid), str(owner))
                    self._last = uid
                    return uid
        raise LookupError(f"no free uid in {self.range.first}-{self.range.last}: every one is claimed or in use")

    def _unclaimed(self, uid: int) -> bool:
        """No claim, or a stale one: its workload folder is gone (the caller checked that no process has the uid)."""
        try:
            owner = (self.directory / str(uid)).read_text()
        except FileNotFoundError:
            return True
        return not Path(owner).exists()

    @contextlib.contextmanager
    def _locked(self) -> Iterator[None]:
        self.directory.mkdir(parents=True, exist_ok=True, mode=0o700)
        fd = os.open(self.directory / ".lock", os.O_RDWR | os.O_CREAT, 0o600)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)
            yield
        finally:
            os.close(fd)


def _write_private(path: Path, text: str) -> None:
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as out:
        out.write(text)


def release(claim: Path, owner: Path) -> None:
    """Drop the claim file `claim` if it is still `owner`'s (after a reboot it may be gone, or another's). Call it only
    once no process of the uid is left. No lock needed: nobody takes over a claim while its owner folder exists."""
    try:
        if claim.read_text() == str(owner):
            claim.unlink()
    except FileNotFoundError:
        pass
