"""Tiny parent of every process workload: runs the command and records its exit code in a file.

Usage: `python -I -S _wrapper.py EXIT_FILE -- COMMAND [ARG...]`. Standard library only (it runs with -S).

The wrapper leads the workload's process group, so a signal sent to the group reaches the command directly; the
wrapper itself ignores SIGTERM/SIGINT/SIGHUP (with a no-op handler, which exec resets to the default in the
command) and keeps waiting. When the command ends it writes the exit code (shell convention: 128 + N after signal
N, 127 when the command cannot be started) to EXIT_FILE atomically, then exits with that code. Only a SIGKILL of
the wrapper itself loses the code; the agent that sent it records 137 instead.
"""

import os
import signal
import subprocess
import sys


def _ignore(signum, frame):
    """A no-op handler: the group signal already reached the command."""


def _run(command):
    try:
        child = subprocess.Popen(command, stdin=subprocess.DEVNULL)
    except OSError as exc:
        print(f"gpupool: cannot start {command[0]!r}: {exc}", file=sys.stderr, flush=True)
        return 127
    code = child.wait()
    return 128 - code if code < 0 else code


def _record(exit_file, code):
    tmp = exit_file + ".tmp"
    with open(tmp, "w") as out:
        out.write(f"{code}\n")
        out.flush()
        os.fsync(out.fileno())
    os.replace(tmp, exit_file)


def main(argv):
    if len(argv) < 4 or argv[2] != "--":
        print("usage: _wrapper.py EXIT_FILE -- COMMAND [ARG...]", file=sys.stderr)
        return 2
    for signum in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
        signal.signal(signum, _ignore)
    code = _run(argv[3:])
    _record(argv[1], code)
    return code


if __name__ == "__main__":
    sys.exit(main(sys.argv))
