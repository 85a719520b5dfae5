"""Run workloads as plain processes, each in its own session and process group, under a tiny exit-code wrapper.

Layout under the runtime's directory (0700, the agent's alone), one folder per (allocation, attempt):

    <dir>/<allocation>.<attempt>/state.json   pid, pgid, /proc start ticks, host boot id, log path, note, uid (0600)
    <dir>/<allocation>.<attempt>/output.log   the workload's stdout and stderr (0600)
    <dir>/<allocation>.<attempt>/exit_code    written by the wrapper (or by `stop` after a SIGKILL)
    <dir>/<allocation>.<attempt>/fenced       created by the wrapper when it self-fenced the workload
    <dir>/lease                               when the agent last heard from the control plane (see below)

and under the work root (0711: anyone may pass through, nobody may list it), the workload's own work folder:

    <work root>/<allocation>.<attempt>/       0700, owned by the user the workload runs as; its HOME, TMPDIR and
                                              working directory when the order names none

The files are what lets a restarted agent `adopt()` workloads that outlived it, refuse to signal a reused pid,
and learn the exit code of a workload that ended while no agent was watching. A workload with a uid of its own can
write none of them, nor read another workload's.

Who a workload runs as is the `identity`'s choice (gpupool.agent.runtime.identity): a transient uid, a local
account, or the agent's own user; in every case with no_new_privs and umask 077 (see the wrapper). A transient uid
is the workload's alone: when it ends or is stopped every process of that uid is killed (a job that left its group
by setsid or a double fork included), and `forget` releases the uid only once none is left.

With `fence_s` set (the agent sets it), every wrapper is also the workload's watchdog: `renew_lease` records the
CLOCK_MONOTONIC time the agent last heard from the control plane, and a wrapper whose lease is older than `fence_s`
stops its workload (SIGTERM, `fence_grace_s`, SIGKILL) even when the agent itself is dead or hung, so a lost node's
attempt cannot run on after the control plane has started the next one elsewhere (RELIABILITY.md §2.2, T2).

Environment of a workload: a few variables of the agent's own environment (`BASE_ENV_KEYS`), then the order's
`env`, then the variables gpupool owns (see `gpu_env` and `workload_env`), which always win.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import logging
import os
import re
import shutil
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path

from gpupool.agent.clock import Clock, MonotonicClock, WallClock
from gpupool.agent.rendezvous import HOSTFILE, hostfile_text, rendezvous_env
from gpupool.agent.runtime import uids
from gpupool.agent.runtime._wrapper import FENCED_FILE
from gpupool.agent.runtime.base import (
    RUNNING,
    LaunchError,
    LaunchSpec,
    RunHandle,
    RunState,
    WorkloadKey,
    WorkloadRuntime,
)
from gpupool.agent.runtime.identity import AgentUser, JobIdentity, JobUser
from gpupool.agent.runtime.procfs import PROC, host_boot_id, read_stat, reap_if_child
from gpupool.protocol.agent import GpuGrant

log = logging.getLogger(__name__)

BASE_ENV_KEYS = ("PATH", "HOME", "USER", "LOGNAME", "LANG", "LC_ALL", "TZ", "TMPDIR", "LD_LIBRARY_PATH")
DEFAULT_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
WRAPPER = Path(__file__).with_name("_wrapper.py")
STATE_FILE = "state.json"
EXIT_FILE = "exit_code"
LOG_FILE = "output.log"
LEASE_FILE = "lease"
KILL_WAIT_S = 5.0
POLL_STEP_S = 0.02
STATE_VERSION = 2


def gpu_env(gpus: Sequence[GpuGrant]) -> dict[str, str]:
    """The device variables for `gpus`, in the order the workload sees them.

    * no GPU: `CUDA_VISIBLE_DEVICES=""` and `NVIDIA_VISIBLE_DEVICES=void`, so the workload sees none;
    * else both list the grant UUIDs (MIG instance UUIDs for MIG slices), comma-separated;
    * when some grant is a fraction (milli < 1000): `GPUPOOL_GPU_FRACTION` (per device, e.g. "0.25,1"),
      `CUDA_MPS_ACTIVE_THREAD_PERCENTAGE` = the smallest fractional milli / 10 (at least 1), and
      `CUDA_MPS_PINNED_DEVICE_MEM_LIMIT` = "<ordinal>=<memory_mib>M" for each fractional grant with memory_mib > 0.
    """
    if not gpus:
        return {"CUDA_VISIBLE_DEVICES": "", "NVIDIA_VISIBLE_DEVICES": "void"}
    uuids = ",".join(grant.uuid for grant in gpus)
    env = {"CUDA_VISIBLE_DEVICES": uuids, "NVIDIA_VISIBLE_DEVICES": uuids}
    shared = [grant for grant in gpus if grant.milli < 1000]
    if shared:
        env["GPUPOOL_GPU_FRACTION"] = ",".join(f"{grant.milli / 1000:g}" for grant in gpus)
        env["CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"] = str(max(1, min(grant.milli for grant in shared) // 10))
        limits = [f"{i}={g.memory_mib}M" for i, g in enumerate(gpus) if g.milli < 1000 and g.memory_mib > 0]
        if limits:
            env["CUDA_MPS_PINNED_DEVICE_MEM_LIMIT"] = ",".join(limits)
    return env


def gpupool_env(spec: LaunchSpec, gpus: Sequence[GpuGrant]) -> dict[str, str]:
    """The variables gpupool owns: identity of the workload plus `gpu_env(gpus)`."""
    return {
        "GPUPOOL_ALLOCATION_ID": spec.allocation_id,
        "GPUPOOL_ATTEMPT": str(spec.attempt),
        "GPUPOOL_JOB_ID": spec.job_id,
        "GPUPOOL_TASK_INDEX": str(spec.task_index),
        **gpu_env(gpus),
        **(rendezvous_env(spec.rendezvous) if spec.rendezvous is not None else {}),
    }


def workload_env(spec: LaunchSpec, gpus: Sequence[GpuGrant], base_env: Mapping[str, str],
                 account: Mapping[str, str] | None = None) -> dict[str, str]:
    """The whole environment: `BASE_ENV_KEYS` from `base_env` (PATH defaulted), then `account` (the variables of the
    user the workload runs as: `JobUser.env`), then `spec.env`, then gpupool's."""
    env = {key: base_env[key] for key in BASE_ENV_KEYS if key in base_env}
    env.setdefault("PATH", DEFAULT_PATH)
    env.update(account or {})
    env.update(spec.env)
    env.update(gpupool_env(spec, gpus))
    return env


def workload_dir_name(allocation_id: str, attempt: int) -> str:
    """A safe, unique folder name for one attempt: unsafe or long ids are cleaned and suffixed with a hash."""
    safe = re.sub(r"[^A-Za-z0-9._-]", "_", allocation_id)[:80]
    if safe != allocation_id or not safe.strip("."):
        safe = f"{safe}-{hashlib.sha256(allocation_id.encode()).hexdigest()[:12]}"
    return f"{safe}.{attempt}"


def shell_exit_code(returncode: int) -> int:
    """subprocess's returncode in the shell convention: -N (killed by signal N) becomes 128 + N."""
    return 128 - returncode if returncode < 0 else returncode


class ProcessRuntime(WorkloadRuntime):
    """Workloads as local processes; see the module docstring for the on-disk layout and the environment.

    Thread-safe: `stop` may run in a worker thread while the event loop polls. `clock` and `sleep` drive the
    grace-period waits; `wall_clock` stamps `started_at`; `proc` is the /proc root. `fence_s` (None: no watchdog)
    and `fence_grace_s` configure the wrappers' self-fencing (see the module docstring). `identity` says who
    workloads run as (default: the agent's own user); `work_root` holds their work folders (default: the
    directory's sibling "work").
    """

    def __init__(
        self,
        directory: Path,
        *,
        base_env: Mapping[str, str] | None = None,
        clock: Clock | None = None,
        wall_clock: Clock | None = None,
        sleep: Callable[[float], None] = time.sleep,
        python: str = sys.executable,
        proc: Path = PROC,
        fence_s: float | None = None,
        fence_grace_s: float = 10.0,
        identity: JobIdentity | None = None,
        work_root: Path | None = None,
    ) -> None:
        self._root = Path(directory).absolute()  # workloads and their wrappers run in other directories
        self._fence = None if fence_s is None else (self._root / LEASE_FILE, fence_s, fence_grace_s)
        self._root.mkdir(parents=True, exist_ok=True, mode=0o700)
        self._root.chmod(0o700)
        self.identity = identity if identity is not None else AgentUser()
        self._work_root = Path(work_root).absolute() if work_root is not None else self._root.parent / "work"
        self._work_root.mkdir(parents=True, exist_ok=True, mode=0o711)
        self._work_root.chmod(0o711)
        self._base_env = dict(os.environ if base_env is None else base_env)
        self._clock = clock if clock is not None else MonotonicClock()
        self._wall = wall_clock if wall_clock is not None else WallClock()
        self._sleep = sleep
        self._python = python
        self._proc = proc
        self._boot_id = host_boot_id(proc)
        self._children: dict[WorkloadKey, subprocess.Popen[bytes]] = {}
        self._lock = threading.Lock()

    @property
    def directory(self) -> Path:
        return self._root

    def launch(self, spec: LaunchSpec, devices: Sequence[GpuGrant] | None = None) -> RunHandle:
        """Start `spec.command` under the wrapper; raises LaunchError for an image (use ContainerRuntime)."""
        if spec.image is not None:
            raise LaunchError(f"image {spec.image!r} given, but this node runs plain processes only (no podman)")
        gpus = spec.gpus if devices is None else tuple(devices)
        return self._start(spec, list(spec.command), gpus, self.identity)

    def environment(self, spec: LaunchSpec, devices: Sequence[GpuGrant] | None = None) -> dict[str, str]:
        """The environment `launch` would give `spec` (for inspection and tests)."""
        return workload_env(spec, spec.gpus if devices is None else tuple(devices), self._base_env)

    def poll(self, handle: RunHandle) -> RunState:
        """Running, or exited with the recorded exit code (None when it is gone without one)."""
        child = self._child(handle.key)
        if child is not None:
            returncode = child.poll()
            return RUNNING if returncode is None else self._exited(handle, shell_exit_code(returncode))
        recorded = read_exit_code(handle)
        if recorded is not None:
            return RunState("exited", recorded)
        if self.is_alive(handle):
            return RUNNING
        return RunState("exited", read_exit_code(handle))

    def stop(self, handle: RunHandle, grace_s: float) -> RunState:
        """SIGTERM the process group, wait `grace_s`, SIGKILL it, wait up to KILL_WAIT_S; the final state. Then, for a
        transient uid, kill every process of that uid that outlived the group."""
        state = self._stop_group(handle, grace_s)
        self._sweep(handle)
        return state

    def _stop_group(self, handle: RunHandle, grace_s: float) -> RunState:
        state = self.poll(handle)
        if not state.running:
            return state
        self._signal(handle, signal.SIGTERM)
        state = self._wait(handle, grace_s)
        if not state.running:
            return state
        self._signal(handle, signal.SIGKILL)
        state = self._wait(handle, KILL_WAIT_S)
        if not state.running and state.exit_code is None:
            return self._exited(handle, 128 + signal.SIGKILL)
        return state

    def adopt(self) -> list[RunHandle]:
        """Every workload with a readable state file under the directory, oldest first."""
        handles = [h for h in (load_handle(p) for p in self._root.glob(f"*/{STATE_FILE}")) if h is not None]
        return sorted(handles, key=lambda h: (h.started_at, h.allocation_id, h.attempt))

    def forget(self, handle: RunHandle) -> None:
        """Delete the workload's folders (state, exit code, log; work folder) and release its transient uid;
        RuntimeError while it still runs, or while a process of its transient uid is left after a kill."""
        if self.poll(handle).running:
            raise RuntimeError(f"workload {handle.key} still runs; stop it before forgetting it")
        if not self._sweep(handle):
            raise RuntimeError(f"workload {handle.key}: processes of uid {handle.uid} survive SIGKILL; uid kept")
        with self._lock:
            self._children.pop(handle.key, None)
        if handle.work_dir is not None:
            shutil.rmtree(handle.work_dir, ignore_errors=True)
        if handle.uid_claim and handle.state_dir is not None:
            uids.release(Path(handle.uid_claim), handle.state_dir)
        if handle.state_dir is not None:
            shutil.rmtree(handle.state_dir, ignore_errors=True)

    def set_note(self, handle: RunHandle, note: str) -> RunHandle:
        """Persist `note` in the state file and return the updated handle."""
        updated = dataclasses.replace(handle, note=note)
        write_handle(updated)
        return updated

    def renew_lease(self, heard_at: float) -> None:
        """Record `heard_at` (time.monotonic() when the agent last heard from the control plane) for the wrappers."""
        if self._fence is not None:
            tmp = self._root / f"{LEASE_FILE}.tmp"
            tmp.write_text(f"{heard_at:.6f}\n")
            os.replace(tmp, self._fence[0])

    def self_fenced(self, handle: RunHandle) -> bool:
        """True when the workload's wrapper stopped it because the lease ran out."""
        return handle.state_dir is not None and (handle.state_dir / FENCED_FILE).exists()

    def of_this_boot(self, handle: RunHandle) -> bool:
        return handle.host_boot_id == self._boot_id

    def is_alive(self, handle: RunHandle) -> bool:
        """True when the handle's process still runs: same kernel boot, same pid, same start time, not a zombie."""
        if handle.host_boot_id != self._boot_id:
            return False
        stat = read_stat(handle.pid, self._proc)
        if stat is None or stat.start_ticks != handle.start_ticks:
            return False
        if stat.is_dead:
            reap_if_child(handle.pid)
            return False
        return True

    def _start(self, spec: LaunchSpec, argv: list[str], gpus: Sequence[GpuGrant], identity: JobIdentity, *,
               no_new_privs: bool = True) -> RunHandle:
        """Start `argv` under the wrapper in a new session, as the user `identity` picks, with the environment of
        `spec` and `gpus` (and no_new_privs unless told otherwise); persist and return its handle. LaunchError (and
        nothing left behind) when it cannot."""
        _no_nul(argv, spec.env, spec.workdir)
        name = workload_dir_name(spec.allocation_id, spec.attempt)
        state_dir, work_dir = self._root / name, self._work_root / name
        if (state_dir / STATE_FILE).exists():
            raise LaunchError(f"workload {spec.key} already has a record on this node")
        state_dir.mkdir(parents=True, exist_ok=True, mode=0o700)
        user = JobUser()
        try:
            user = identity.user_for(spec, state_dir)
            make_work_dir(work_dir, user)
            env = workload_env(spec, gpus, self._base_env, user.env(work_dir))
            if spec.rendezvous is not None:
                env["GPUPOOL_HOSTFILE"] = str(write_hostfile(work_dir, user, hostfile_text(spec.rendezvous)))
            child = self._spawn(argv, env, spec.workdir or str(work_dir), state_dir, user, no_new_privs,
                                spec.max_disconnect_s)
        except LaunchError:
            discard(state_dir, work_dir, user)
            raise
        except OSError as exc:
            discard(state_dir, work_dir, user)
            raise LaunchError(f"cannot start {argv[0]!r}: {exc}") from exc
        log_path = state_dir / LOG_FILE
        stat = read_stat(child.pid, self._proc)
        handle = RunHandle(
            allocation_id=spec.allocation_id,
            attempt=spec.attempt,
            pid=child.pid,
            started_at=self._wall.now(),
            log_path=log_path,
            job_id=spec.job_id,
            pgid=child.pid,
            start_ticks=stat.start_ticks if stat is not None else None,
            host_boot_id=self._boot_id,
            state_dir=state_dir,
            uid=user.uid,
            uid_claim=user.claim,
            work_dir=work_dir,
            max_disconnect_s=spec.max_disconnect_s,
        )
        with self._lock:
            self._children[spec.key] = child
        write_handle(handle)
        return handle

    def _spawn(
        self, argv: list[str], env: Mapping[str, str], workdir: str, state_dir: Path, user: JobUser, no_new_privs: bool,
        max_disconnect_s: float | None = None,
    ) -> subprocess.Popen[bytes]:
        """The wrapper (as the agent's user, in "/", with an empty environment: nothing of the job's, LD_PRELOAD say,
        may reach it) that runs `argv` as `user` in `workdir` with `env`, handed over in memory; see _wrapper.py. Its
        watchdog fences after `max_disconnect_s` of the control plane's silence (None: the runtime's `fence_s`)."""
        handed = os.memfd_create("gpupool-job-env")
        rest = memoryview(json.dumps(dict(env)).encode())
        while rest:
            rest = rest[os.write(handed, rest):]
        os.lseek(handed, 0, os.SEEK_SET)
        options = ["--workdir", workdir, "--env-fd", str(handed)] + (["--no-new-privs"] if no_new_privs else [])
        if self._fence is not None:
            fence_s = self._fence[1] if max_disconnect_s is None else max_disconnect_s
            options += ["--lease", str(self._fence[0]), f"{fence_s:g}", f"{self._fence[2]:g}"]
        if user.uid is not None:
            options += ["--user", str(user.uid), str(user.gid), ",".join(str(g) for g in user.groups)]
        if user.claim:
            options.append("--sweep")
        wrapped = [self._python, "-I", "-S", str(WRAPPER), str(state_dir / EXIT_FILE), *options, "--", *argv]
        fd = os.open(state_dir / LOG_FILE, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
        try:
            return subprocess.Popen(wrapped, stdin=subprocess.DEVNULL, stdout=fd, stderr=subprocess.STDOUT, cwd="/",
                                    env={}, pass_fds=(handed,), start_new_session=True)
        finally:
            os.close(fd)
            os.close(handed)

    def _sweep(self, handle: RunHandle) -> bool:
        """Kill every process of the workload's transient uid, waiting up to KILL_WAIT_S until none is left; True when
        none is. Nothing to do for another identity, or for a workload of an earlier boot (its uid's claim is gone
        with that boot, so the uid may be another workload's now)."""
        if not handle.uid_claim or handle.uid is None or handle.host_boot_id != self._boot_id:
            return True
        deadline = self._clock.now() + KILL_WAIT_S
        while uids.processes_of(handle.uid, self._proc):
            if self._clock.now() > deadline:
                return False
            kill_uid_processes(handle.uid, self._python)
            self._sleep(POLL_STEP_S)
        return True

    def _child(self, key: WorkloadKey) -> subprocess.Popen[bytes] | None:
        with self._lock:
            return self._children.get(key)

    def _exited(self, handle: RunHandle, fallback: int) -> RunState:
        """Exited: the wrapper's recorded code, else `fallback`, which is then recorded so it survives restarts."""
        code = read_exit_code(handle)
        if code is None:
            code = fallback
            write_exit_code(handle, code)
        return RunState("exited", code)

    def _signal(self, handle: RunHandle, signum: int) -> None:
        """Signal the handle's process group, unless its leader's pid now belongs to another process."""
        if handle.pgid <= 1 or handle.host_boot_id != self._boot_id:
            return
        leader = read_stat(handle.pgid, self._proc)
        if leader is not None and leader.start_ticks != handle.start_ticks:
            log.warning("not signalling %s: pid %d was reused", handle.key, handle.pgid)
            return
        try:
            os.killpg(handle.pgid, signum)
        except (ProcessLookupError, PermissionError):
            pass

    def _wait(self, handle: RunHandle, timeout_s: float) -> RunState:
        deadline = self._clock.now() + max(0.0, timeout_s)
        while True:
            state = self.poll(handle)
            remaining = deadline - self._clock.now()
            if not state.running or remaining <= 0:
                return state
            self._sleep(min(POLL_STEP_S, remaining))


def kill_uid_processes(uid: int, python: str = sys.executable) -> None:
    """SIGKILL every process of the job uid `uid` at once (needs root), through the wrapper's `--kill-uid`: the fork
    it takes is safe there (single-threaded), not in the agent."""
    subprocess.run([python, "-I", "-S", str(WRAPPER), "--kill-uid", str(uid)], stdin=subprocess.DEVNULL,
                   capture_output=True, timeout=KILL_WAIT_S, check=False)


def make_work_dir(path: Path, user: JobUser) -> None:
    """A fresh 0700 work folder at `path`, owned by `user` (a leftover of an earlier try is removed first)."""
    shutil.rmtree(path, ignore_errors=True)
    path.mkdir(mode=0o700)
    path.chmod(0o700)
    if user.uid is not None:
        os.chown(path, user.uid, user.gid if user.gid is not None else -1)


def write_hostfile(work_dir: Path, user: JobUser, text: str) -> Path:
    """The gang's hostfile in the task's work folder, readable by the task's user only."""
    path = work_dir / HOSTFILE
    path.write_text(text)
    path.chmod(0o600)
    if user.uid is not None:
        os.chown(path, user.uid, user.gid if user.gid is not None else -1)
    return path


def discard(state_dir: Path, work_dir: Path, user: JobUser) -> None:
    """Undo a launch that did not start: its folders and its uid claim."""
    shutil.rmtree(work_dir, ignore_errors=True)
    if user.claim:
        uids.release(Path(user.claim), state_dir)
    shutil.rmtree(state_dir, ignore_errors=True)


def _no_nul(argv: Sequence[str], env: Mapping[str, str], workdir: str | None) -> None:
    """LaunchError naming the first string that no process can carry (a NUL byte): exec would refuse it, and the
    wrapper gets the job's environment in memory, where only this check sees it."""
    named = [(f"command[{i}]", arg) for i, arg in enumerate(argv)] + [("workdir", workdir or "")]
    named += [(f"env {key!r}", f"{key}={value}") for key, value in env.items()]
    for field, text in named:
        if "\0" in text:
            raise LaunchError(f"{field}: embedded null byte")


def read_exit_code(handle: RunHandle) -> int | None:
    """The recorded exit code of `handle`, or None when none (or an unreadable one, or one outside the shell
    convention's 0..255, e.g. written by the workload itself) is recorded."""
    if handle.state_dir is None:
        return None
    try:
        code = int((handle.state_dir / EXIT_FILE).read_text().strip())
    except (OSError, ValueError):
        return None
    return code if 0 <= code <= 255 else None


def write_exit_code(handle: RunHandle, code: int) -> None:
    if handle.state_dir is not None:
        _write_atomic(handle.state_dir / EXIT_FILE, f"{code}\n")


def write_handle(handle: RunHandle) -> None:
    """Persist `handle` as JSON in its state folder (atomically, mode 0600)."""
    if handle.state_dir is None:
        raise ValueError("a handle without a state folder cannot be persisted")
    record = {field.name: getattr(handle, field.name) for field in dataclasses.fields(handle)}
    record.update(version=STATE_VERSION, log_path=str(handle.log_path), state_dir=str(handle.state_dir),
                  work_dir=None if handle.work_dir is None else str(handle.work_dir))
    _write_atomic(handle.state_dir / STATE_FILE, json.dumps(record, sort_keys=True))


def load_handle(path: Path) -> RunHandle | None:
    """The handle persisted in `path`, or None (with a warning) when the file is unreadable or malformed."""
    try:
        record = json.loads(path.read_text())
        record.pop("version", None)
        record["log_path"] = Path(record["log_path"])
        record["state_dir"] = path.parent
        record["work_dir"] = None if record.get("work_dir") is None else Path(record["work_dir"])
        return RunHandle(**record)
    except (OSError, ValueError, TypeError, KeyError) as exc:
        log.warning("ignoring unreadable workload state %s: %s", path, exc)
        return None


def _write_atomic(path: Path, text: str) -> None:
    """Write via a temporary file unique to this process and thread, so concurrent writers never collide."""
    tmp = path.with_name(f"{path.name}.{os.getpid()}.{threading.get_ident()}.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as out:
        out.write(text)
        out.flush()
        os.fsync(out.fileno())
    os.replace(tmp, path)
