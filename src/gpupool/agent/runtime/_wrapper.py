"""Tiny parent of every process workload: runs the command and records its exit code in a file.

Usage: `python -I -S _wrapper.py EXIT_FILE [LEASE_FILE FENCE_S GRACE_S] -- COMMAND [ARG...]`. Standard library
only (it runs with -S).

The wrapper leads the workload's process group, so a signal sent to the group reaches the command directly; the
wrapper itself only notes SIGTERM/SIGINT/SIGHUP (with a handler, which exec resets to the default in the command)
and keeps waiting. A signal that came before the command started never reached it: noted before, the command is not
started (exit code 128 + N); noted while it was being started, it is sent on to the command (which may then get it
twice). When the command ends it writes the exit code (shell convention: 128 + N after signal
N, 127 when the command cannot be started) to EXIT_FILE atomically, then exits with that code. Only a SIGKILL of
the wrapper itself loses the code; the agent that sent it records 137 instead.

With a LEASE_FILE the wrapper is also the workload's watchdog, so that a workload never outlives its agent's
contact with the control plane (the agent may be SIGKILLed or hung, and the control plane requeues the job
elsewhere after the lost grace G > FENCE_S + GRACE_S). The agent writes into LEASE_FILE the CLOCK_MONOTONIC time
at which it last heard from the control plane; when that is more than FENCE_S seconds ago (or, while the file is
missing, the wrapper started more than FENCE_S seconds ago) the wrapper self-fences: it creates FENCED_FILE next
to EXIT_FILE, sends SIGTERM to the group, waits GRACE_S, then records 137 and SIGKILLs the group (itself included).
"""

import os
import select
import signal
import subprocess
import sys
import time

FENCED_FILE = "fenced"


#: termination signals received so far (the command, once running, got them from the group itself)
_received = []


def _note(signum, frame):
    _received.append(signum)


def _code(returncode):
    return 128 - returncode if returncode < 0 else returncode


def _heard_at(lease_file, default):
    try:
        with open(lease_file) as lease:
            return float(lease.read().strip())
    except (OSError, ValueError):
        return default


def _waiter(child):
    """`wait(timeout)` for the child that sleeps on a pidfd (Linux 5.3+) instead of polling, where there is one."""
    try:
        pidfd = os.pidfd_open(child.pid)
    except (AttributeError, OSError):
        return lambda timeout: child.wait(timeout=timeout)

    def wait(timeout):
        select.select([pidfd], [], [], timeout)
        return child.wait(timeout=0)

    return wait


def _watch(child, exit_file, lease_file, fence_s, grace_s):
    """Wait for the child while the lease is fresh; self-fence (see the module docstring) once it is stale."""
    started = time.monotonic()
    step = max(0.01, min(0.25, fence_s / 8))
    wait = _waiter(child)
    while True:
        try:
            return wait(step)
        except subprocess.TimeoutExpired:
            pass
        if time.monotonic() - _heard_at(lease_file, started) > fence_s:
            break
    print(f"gpupool: self-fencing: the agent heard nothing from the control plane for {fence_s:g} s",
          file=sys.stderr, flush=True)
    open(os.path.join(os.path.dirname(exit_file), FENCED_FILE), "w").close()
    leader = os.getpgrp() == os.getpid()  # the runtime starts us in a new session; never signal a foreign group
    os.killpg(0, signal.SIGTERM) if leader else child.terminate()
    try:
        return child.wait(timeout=grace_s)
    except subprocess.TimeoutExpired:
        _record(exit_file, 128 + signal.SIGKILL)
        os.killpg(0, signal.SIGKILL) if leader else child.kill()
        return child.wait()


def _run(command, exit_file, lease):
    if _received:
        return 128 + _received[0]
    try:
        child = subprocess.Popen(command, stdin=subprocess.DEVNULL)
    except OSError as exc:
        print(f"gpupool: cannot start {command[0]!r}: {exc}", file=sys.stderr, flush=True)
        return 127
    if _received:
        child.send_signal(_received[0])
    if lease is None:
        return _code(child.wait())
    return _code(_watch(child, exit_file, lease[0], float(lease[1]), float(lease[2])))


def _record(exit_file, code):
    tmp = exit_file + ".tmp"
    with open(tmp, "w") as out:
        out.write(f"{code}\n")
        out.flush()
        os.fsync(out.fileno())
    os.replace(tmp, exit_file)


def main(argv):
    split = argv.index("--") if "--" in argv else -1
    if split not in (2, 5) or len(argv) <= split + 1:
        print("usage: _wrapper.py EXIT_FILE [LEASE_FILE FENCE_S GRACE_S] -- COMMAND [ARG...]", file=sys.stderr)
        return 2
    for signum in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
        signal.signal(signum, _note)
    code = _run(argv[split + 1:], argv[1], argv[2:5] if split == 5 else None)
    _record(argv[1], code)
    return code


if __name__ == "__main__":
    sys.exit(main(sys.argv))
