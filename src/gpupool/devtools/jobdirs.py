"""What tests and benchmarks that run real agents as root need now that jobs run as transient uids (issue 41): folders
a job can reach and an interpreter a job can start. pytest's temporary folders live under a 0700 folder, and this
venv's Python may sit under /root (0700); neither is reachable by another user. Never used by the product itself.
"""

from __future__ import annotations

import contextlib
import shutil
import stat
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

#: where `job_python` looks when this process's interpreter is out of the jobs' reach
SYSTEM_PATH = ("/usr/local/bin", "/usr/bin", "/bin")


def reachable(path: Path) -> bool:
    """True when a user with no special rights may pass every folder from / down to `path` (o+x on each)."""
    resolved = path.resolve()
    return all(folder.stat().st_mode & stat.S_IXOTH for folder in [resolved, *resolved.parents] if folder.is_dir())


@contextlib.contextmanager
def open_folder(prefix: str = "gpupool-jobs-") -> Iterator[Path]:
    """A fresh folder in the system's temporary folder that any job may pass through (0711) but not list; removed
    afterwards, with whatever jobs left in it."""
    folder = Path(tempfile.mkdtemp(prefix=prefix))
    folder.chmod(0o711)
    try:
        yield folder
    finally:
        shutil.rmtree(folder, ignore_errors=True)


def drop_box(folder: Path) -> Path:
    """`folder`, made world-writable (1777, like /tmp) so that jobs of any uid may leave files there for the test."""
    folder.mkdir(parents=True, exist_ok=True)
    folder.chmod(0o1777)
    return folder


def job_python() -> str:
    """A Python interpreter every user may start (standard library only for what the job runs): this process's own
    when it is within reach, else the first python3 of SYSTEM_PATH that is."""
    candidates = [Path(sys.executable), *(Path(folder) / "python3" for folder in SYSTEM_PATH)]
    for candidate in candidates:
        real = candidate.resolve()
        if real.exists() and real.stat().st_mode & stat.S_IXOTH and reachable(real.parent):
            return str(candidate)
    return sys.executable
