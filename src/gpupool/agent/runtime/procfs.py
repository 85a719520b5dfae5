"""Small readers of /proc used to tell a live workload from a dead one or a reused pid (Linux only)."""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

PROC = Path("/proc")


@dataclass(frozen=True, slots=True)
class ProcStat:
    """The two fields of /proc/<pid>/stat the runtime needs: state letter and start time in clock ticks."""

    state: str
    start_ticks: int

    @property
    def is_dead(self) -> bool:
        """True for a zombie ("Z") or dead ("X") process: it has ended but is not reaped yet."""
        return self.state in ("Z", "X")


def read_stat(pid: int, proc: Path = PROC) -> ProcStat | None:
    """The stat of `pid`, or None when no such process exists (or it vanished while being read)."""
    try:
        raw = (proc / str(pid) / "stat").read_bytes()
    except (FileNotFoundError, ProcessLookupError, NotADirectoryError):
        return None
    return parse_stat(raw)


def parse_stat(raw: bytes) -> ProcStat:
    """Parse /proc/<pid>/stat; the command name (field 2) may hold spaces and ')' so split after the LAST ')'."""
    rest = raw[raw.rindex(b")") + 2 :].split()
    # rest[0] is field 3 (state); field 22 (starttime) is rest[19].
    return ProcStat(state=rest[0].decode(), start_ticks=int(rest[19]))


def host_boot_id(proc: Path = PROC) -> str:
    """This kernel boot's random id ("" when unreadable): pids and start ticks only compare within one boot."""
    try:
        return (proc / "sys" / "kernel" / "random" / "boot_id").read_text().strip()
    except OSError:
        return ""


def reap_if_child(pid: int) -> None:
    """Collect `pid` if it is an exited child of this process, so it does not linger as a zombie."""
    try:
        os.waitpid(pid, os.WNOHANG)
    except ChildProcessError:
        pass
