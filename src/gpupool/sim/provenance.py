"""Provenance of a simulation output: what produced it, from which inputs, with which software (summary.json).

Everything here is a function of the inputs, the code and the installed libraries, except `created_utc`, the one
declared timestamp (listed under `timestamps`): two runs of the same command give byte-identical outputs apart from
it (with `--no-timing`, which leaves out wall-clock figures).
"""

from __future__ import annotations

import datetime as dt
import hashlib
import platform
import subprocess
from collections.abc import Iterable, Mapping
from dataclasses import asdict, is_dataclass
from importlib import metadata
from pathlib import Path
from typing import Any

import gpupool
from gpupool.core import Profile

#: the fields of summary.json that hold the time of the run (everything else repeats exactly)
TIMESTAMPS = ("provenance.created_utc",)
_LIBRARIES = ("numpy", "scipy", "matplotlib")


def sha256(path: str | Path) -> str:
    digest = hashlib.sha256()
    with Path(path).open("rb") as handle:
        while block := handle.read(1 << 20):
            digest.update(block)
    return digest.hexdigest()


def _version(package: str) -> str | None:
    try:
        return metadata.version(package)
    except metadata.PackageNotFoundError:
        return None


def source_commit() -> dict[str, object]:
    """The git commit of gpupool's source, and whether its tracked files differ from it (None outside git)."""
    root = Path(gpupool.__file__).resolve().parents[2]
    try:
        head = subprocess.run(["git", "-C", str(root), "rev-parse", "HEAD"], capture_output=True, text=True,
                              timeout=10)
        dirty = subprocess.run(["git", "-C", str(root), "status", "--porcelain", "--untracked-files=no"],
                               capture_output=True, text=True, timeout=10)
    except (OSError, subprocess.SubprocessError):
        return {"commit": None, "modified": None}
    if head.returncode:
        return {"commit": None, "modified": None}
    return {"commit": head.stdout.strip(), "modified": bool(dirty.stdout.strip())}


def profile_config(profile: Profile) -> dict[str, object]:
    """A profile as plain data; a target workload argument is named, not dumped (it is derived from the inputs)."""
    args = {plugin: {k: "<target workload of the trace>" if k == "workload" else _plain(v) for k, v in a.items()}
            for plugin, a in sorted(profile.args.items())}
    return {"name": profile.name, "actions": list(profile.actions), "queue_order": profile.queue_order,
            "filters": list(profile.filters), "scores": [list(s) for s in profile.scores], "devices": profile.devices,
            "tie_break": profile.tie_break, "victims": profile.victims, "args": args}


def _plain(value: Any) -> Any:
    if is_dataclass(value) and not isinstance(value, type):
        return _plain(asdict(value))
    if isinstance(value, Mapping):
        return {str(k): _plain(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_plain(v) for v in value]
    if isinstance(value, float) and value in (float("inf"), float("-inf")):
        return str(value)
    return value if isinstance(value, str | int | float | bool | type(None)) else str(value)


def provenance(inputs: Iterable[str | Path], config: Mapping[str, object], seeds: list[int]) -> dict[str, object]:
    """The provenance block: version, commit, inputs' SHA-256, the resolved configuration, seeds, Python and
    library versions, and the declared timestamp."""
    return {
        "gpupool_version": _version("gpupool") or getattr(gpupool, "__version__", None),
        **source_commit(),
        "inputs": {p: {"sha256": sha256(p), "bytes": Path(p).stat().st_size} for p in sorted(set(map(str, inputs)))},
        "config": _plain(config),
        "seeds": list(seeds),
        "python": platform.python_version(),
        "libraries": {name: _version(name) for name in _LIBRARIES},
        "created_utc": dt.datetime.now(dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ"),
        "timestamps": list(TIMESTAMPS),
    }
