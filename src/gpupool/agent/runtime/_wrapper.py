"""Tiny parent of every process workload: runs the command and records its exit code in a file.

Usage: `python -I -S _wrapper.py EXIT_FILE [--lease LEASE_FILE FENCE_S GRACE_S] [--user UID GID GROUPS [--sweep]]
[--workdir DIR] [--env-fd FD] [--no-new-privs] -- COMMAND [ARG...]`, or `python -I -S _wrapper.py --kill-uid UID`.
Standard library only (it runs with -S).

The wrapper itself keeps the agent's user (root on a node that switches users): it reads the lease file and writes
the exit code into the agent's private state folder, which the command cannot. So that nothing of the job's reaches
it, the agent starts it with an empty environment and hands the command's environment over in FD (a JSON object in
an in-memory file, read and closed at once; without `--env-fd` the command gets the wrapper's environment). With
`--no-new-privs` it sets no_new_privs on itself (so that nothing it starts gains privileges through a set-user-id or
file-capability executable). It starts the command with umask 077, as UID:GID with exactly the supplementary GROUPS
(comma-separated, maybe none) when `--user` is given, in DIR (entered as that user, so a folder that user may not
enter fails the start: 127). With `--sweep` (a transient uid, owned by this job alone) every process of UID is killed
once the command ends or is fenced, so a job that left the group (setsid, double fork) does not outlive it.
`--kill-uid UID` only does that kill.

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

import argparse
import ctypes
import json
import os
import select
import signal
import subprocess
import sys
import time

FENCED_FILE = "fenced"
PR_SET_NO_NEW_PRIVS = 38
USAGE = ("usage: _wrapper.py EXIT_FILE [--lease LEASE_FILE FENCE_S GRACE_S] [--user UID GID GROUPS [--sweep]] "
         "[--workdir DIR] [--env-fd FD] [--no-new-privs] -- COMMAND [ARG...]")


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


def _watch(child, exit_file, lease_file, fence_s, grace_s, sweep=None):
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
        if sweep is not None:
            kill_uid(sweep)  # before the group kill, which ends this wrapper too
        os.killpg(0, signal.SIGKILL) if leader else child.kill()
        return child.wait()


def kill_uid(uid):
    """SIGKILL every process of `uid` at once (needs root; never uid 0). A child that becomes `uid` calls kill(-1),
    which reaches every process it may signal, i.e. those of its uid (itself excepted), in one pass of the kernel under
    its task-list lock: a job that forks as fast as it can cannot outrun it. Single-threaded callers only (fork)."""
    if uid <= 0:
        raise ValueError(f"kill_uid({uid}): only a job's uid")
    pid = os.fork()
    if pid == 0:
        try:
            os.setgroups([])
            os.setgid(uid)
            os.setuid(uid)  # if this fails, kill(-1) is never reached: as root it would kill every process
            os.kill(-1, signal.SIGKILL)
        except OSError:
            pass
        finally:
            os._exit(0)
    os.waitpid(pid, 0)


def _start(command, user, workdir, env):
    """Popen `command` as `user` ((uid, gid, groups) or None: as this process) with umask 077, in `workdir`, with
    `env` (None: this process's)."""
    identity = {} if user is None else {"user": user[0], "group": user[1], "extra_groups": list(user[2])}
    enter = (lambda: os.chdir(workdir)) if workdir else None  # runs after the switch to `user`
    return subprocess.Popen(command, stdin=subprocess.DEVNULL, umask=0o077, preexec_fn=enter, env=env, **identity)


def _run(command, exit_file, lease, user=None, sweep=None, workdir=None, env=None):
    if _received:
        return 128 + _received[0]
    try:
        child = _start(command, user, workdir, env)
    except OSError as exc:
        print(f"gpupool: cannot start {command[0]!r}: {exc}", file=sys.stderr, flush=True)
        return 127
    except subprocess.SubprocessError:  # only entering the folder runs in the child before exec
        who = "the job's user" if user is None else f"uid {user[0]}"
        print(f"gpupool: cannot start {command[0]!r}: {who} cannot enter the working directory {workdir!r}",
              file=sys.stderr, flush=True)
        return 127
    if _received:
        child.send_signal(_received[0])
    if lease is None:
        return _code(child.wait())
    return _code(_watch(child, exit_file, lease[0], float(lease[1]), float(lease[2]), sweep))


def _record(exit_file, code):
    tmp = exit_file + ".tmp"
    with open(tmp, "w") as out:
        out.write(f"{code}\n")
        out.flush()
        os.fsync(out.fileno())
    os.replace(tmp, exit_file)


def _no_new_privs():
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0:
        raise OSError(ctypes.get_errno(), "prctl(PR_SET_NO_NEW_PRIVS)")


def _options(argv):
    """The options before "--" (argparse exits 2 with the usage when they are malformed)."""
    parser = argparse.ArgumentParser(prog="_wrapper.py", usage=USAGE[len("usage: "):], add_help=False)
    parser.add_argument("exit_file")
    parser.add_argument("--lease", nargs=3, metavar=("LEASE_FILE", "FENCE_S", "GRACE_S"))
    parser.add_argument("--user", nargs=3, metavar=("UID", "GID", "GROUPS"))
    parser.add_argument("--sweep", action="store_true")
    parser.add_argument("--workdir")
    parser.add_argument("--env-fd", type=int)
    parser.add_argument("--no-new-privs", action="store_true")
    options = parser.parse_args(argv)
    if options.user is not None:
        uid, gid, groups = options.user
        options.user = (int(uid), int(gid), [int(g) for g in groups.split(",") if g])
    if options.sweep and options.user is None:
        parser.error("--sweep needs --user")
    return options


def main(argv):
    if argv[1:2] == ["--kill-uid"] and len(argv) == 3:
        kill_uid(int(argv[2]))
        return 0
    split = argv.index("--") if "--" in argv else -1
    if split < 2 or len(argv) <= split + 1:
        print(USAGE, file=sys.stderr)
        return 2
    options = _options(argv[1:split])
    for signum in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
        signal.signal(signum, _note)
    if options.no_new_privs:
        _no_new_privs()
    env = None
    if options.env_fd is not None:
        with os.fdopen(options.env_fd, "rb") as handed:
            env = json.loads(handed.read())
    sweep = options.user[0] if options.sweep else None
    code = _run(argv[split + 1:], options.exit_file, options.lease, options.user, sweep, options.workdir, env)
    if sweep is not None:
        kill_uid(sweep)  # whatever the job left behind, before its end is recorded
    _record(options.exit_file, code)
    return code


if __name__ == "__main__":
    sys.exit(main(sys.argv))
