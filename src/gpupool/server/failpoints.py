"""Failpoints: named places in the control plane where a test makes it crash, stall or fail (RELIABILITY.md §3.0).

Armed only by the environment, once, at server start-up::

    GPUPOOL_FAILPOINTS="binder.after_allocation_insert=crash@3,jobs.before_job_update=sleep(200)"

Each entry is `NAME=ACTION[@N]`:

* `crash`: die at once by SIGKILL to itself (no cleanup, no flush, no atexit: kill -9 at exactly that point); a
  line "failpoint NAME: crash" goes to stderr first, unbuffered, so a test can tell a failpoint death from its own
  kill;
* `sleep(MS)`: block the calling thread MS milliseconds;
* `error`: raise `FailpointError` (the API answers 503 with Retry-After, never a 500);
* `@N` (N >= 1): act only on the N-th hit of that failpoint in this process; without it, on every hit.

`failpoint(name)` costs one dict truth test when nothing is armed. Unknown names and malformed actions are
refused by `parse` with a message naming the entry, so a typo never silently tests nothing. Hit counters are
per process and thread-safe.
"""

from __future__ import annotations

import os
import re
import signal
import sys
import threading
import time
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Literal

ENV = "GPUPOOL_FAILPOINTS"

#: Every place that calls `failpoint`, with where it sits. A name not listed here is refused by `parse`.
NAMES: dict[str, str] = {
    "binder.after_allocation_insert": "binder: allocation rows flushed, transaction not yet committed",
    "scheduler.before_bind": "scheduler loop: a cycle's decisions made, the binder's transaction not yet begun",
    "jobs.before_job_update": "jobs service: before a job row is inserted or changed (submit, cancel, decide)",
    "jobs.after_commit_before_response": "POST /jobs: the submission is committed, the response not yet sent",
    "metering.before_advance": "metering: an allocation read to be billed, its metered_until not yet advanced",
    "metering.mid_ledger_batch": "metering: some ledger entries of a batch added, transaction not committed",
    "migrate.mid_migration": "migration: after each Alembic step, inside the migration's transaction",
}

_ENTRY = re.compile(r"^(?P<name>[a-z_.]+)=(?P<kind>crash|error|sleep\((?P<ms>\d+)\))(?:@(?P<nth>\d+))?$")


class FailpointError(RuntimeError):
    """Raised by an armed `error` failpoint: an injected, retryable failure (HTTP 503 in the API)."""


@dataclass(frozen=True, slots=True)
class Action:
    """What an armed failpoint does: `kind`, `ms` for sleep, and `nth` (act on that hit only; 0 = every hit)."""

    kind: Literal["crash", "sleep", "error"]
    ms: int = 0
    nth: int = 0


def parse(spec: str) -> dict[str, Action]:
    """`GPUPOOL_FAILPOINTS` text -> {name: Action}; ValueError naming the first bad entry. Empty text arms nothing."""
    armed: dict[str, Action] = {}
    for raw in (part.strip() for part in spec.split(",")):
        if not raw:
            continue
        match = _ENTRY.match(raw)
        if match is None:
            raise ValueError(f"{ENV}: bad entry {raw!r}: expected NAME=crash|error|sleep(MS)[@N]")
        name, nth = match["name"], int(match["nth"] or 0)
        if name not in NAMES:
            raise ValueError(f"{ENV}: unknown failpoint {name!r} in {raw!r}; known: {', '.join(sorted(NAMES))}")
        if match["nth"] is not None and nth < 1:
            raise ValueError(f"{ENV}: bad entry {raw!r}: @N counts hits from 1")
        if name in armed:
            raise ValueError(f"{ENV}: failpoint {name!r} given twice")
        kind = "sleep" if match["kind"].startswith("sleep") else match["kind"]
        armed[name] = Action(kind, int(match["ms"] or 0), nth)  # type: ignore[arg-type]
    return armed


_armed: dict[str, Action] = {}
_hits: dict[str, int] = {}
_lock = threading.Lock()


def configure(environ: Mapping[str, str] = os.environ) -> dict[str, Action]:
    """Arm what `environ[ENV]` names (replacing any earlier arming, counters reset); returns it. ValueError as
    `parse`. Called once by the server's entry point; tests call it in-process."""
    armed = parse(environ.get(ENV, ""))
    with _lock:
        _armed.clear()
        _armed.update(armed)
        _hits.clear()
    return dict(armed)


def failpoint(name: str) -> None:
    """The named place `name` is reached: do nothing unless armed (see the module docstring)."""
    if _armed:
        _fire(name)


def _fire(name: str) -> None:
    action = _armed.get(name)
    if action is None:
        return
    with _lock:
        _hits[name] = hit = _hits.get(name, 0) + 1
    if action.nth and hit != action.nth:
        return
    if action.kind == "crash":
        crash(name)
    elif action.kind == "sleep":
        time.sleep(action.ms / 1000)
    else:
        raise FailpointError(f"failpoint {name}: injected error (hit {hit})")


def crash(name: str) -> None:
    """Die now as kill -9 would: SIGKILL to this process (os._exit(137) should that ever return)."""
    os.write(sys.stderr.fileno(), f"failpoint {name}: crash (pid {os.getpid()})\n".encode())
    os.kill(os.getpid(), signal.SIGKILL)
    os._exit(137)  # pragma: no cover - SIGKILL cannot be caught
