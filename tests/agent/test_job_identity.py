"""Who process jobs run as (issue 41): uid ranges and host-wide claims, the identity modes, and ProcessRuntime with
real transient uids (the tests run as root, as in CI): the job's credentials, its work folder, and every process of
its uid killed when it ends, is stopped or fences itself, before the uid is handed out again."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from gpupool.agent.runtime import LaunchError, LaunchSpec, ProcessRuntime, RunHandle, RunState
from gpupool.agent.runtime._wrapper import kill_uid
from gpupool.agent.runtime.identity import AgentUser, LocalUsers, RootUser, TransientUsers, open_identity
from gpupool.agent.runtime.procfs import read_stat
from gpupool.agent.runtime.uids import (
    CLAIMS_DIR,
    UidClaims,
    UidRange,
    ids_in_use,
    names_an_account,
    processes_of,
    release,
)

ROOT_ONLY = pytest.mark.skipif(os.geteuid() != 0, reason="only root gives jobs other uids")
BASE_ENV = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "HOME": "/root", "USER": "root"}


def wait_until(predicate: Callable[[], object], timeout_s: float = 15.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not predicate():
        assert time.monotonic() < deadline, "timed out waiting"
        time.sleep(0.02)


def wait_exit(runtime: ProcessRuntime, handle: RunHandle) -> RunState:
    wait_until(lambda: not runtime.poll(handle).running)
    return runtime.poll(handle)


def shell(script: str, allocation: str = "a1", **kwargs: object) -> LaunchSpec:
    return LaunchSpec(allocation, 0, "job-1", ("sh", "-c", script), **kwargs)  # type: ignore[arg-type]


def fake_proc(root: Path, uids: dict[int, tuple[int, str]]) -> Path:
    """A /proc with one process per pid: (uid, state letter)."""
    for pid, (uid, state) in uids.items():
        (root / str(pid)).mkdir(parents=True)
        (root / str(pid) / "status").write_text(
            f"Name:\tx\nState:\t{state} (x)\nUid:\t{uid}\t{uid}\t{uid}\t{uid}\nGid:\t{uid}\t{uid}\t{uid}\t{uid}\n")
    return root


def claimed(uid: int) -> bool:
    """A live claim (gpupool.agent.runtime.uids): its owner's folder still exists."""
    try:
        return Path((CLAIMS_DIR / str(uid)).read_text()).exists()
    except FileNotFoundError:
        return False


@pytest.fixture
def free_range(worker_id: str) -> Callable[[int], UidRange]:
    """`size` consecutive uids for this test: outside the default range and S12's, in a band of this xdist worker's
    own (tests on the other worker pick at the same moment), naming no account, used and claimed by no one."""
    band = 59000 + 300 * (int(worker_id[2:]) if worker_id.startswith("gw") else 0)

    def pick(size: int) -> UidRange:
        busy = ids_in_use()
        first = next(u for u in range(band, band + 300 - size) if all(
            v not in busy and not names_an_account(v) and not claimed(v) for v in range(u, u + size)))
        return UidRange(first, first + size - 1)
    return pick


# ranges and claims ------------------------------------------------------------------------------------------------

def test_a_range_hands_out_every_uid_once_round_robin():
    uids = UidRange(10, 13)
    assert list(uids.after(11)) == [12, 13, 10, 11]
    assert list(uids.after(13)) == [10, 11, 12, 13]
    assert list(uids.after(99)) == [10, 11, 12, 13] and len(uids) == 4


def test_a_claim_skips_uids_in_use_named_or_claimed_and_takes_over_stale_ones(tmp_path, monkeypatch):
    monkeypatch.setattr("gpupool.agent.runtime.uids.names_an_account", lambda uid: uid == 102)
    proc = fake_proc(tmp_path / "proc", {7: (100, "S"), 8: (104, "Z")})  # a zombie holds nothing
    claims = UidClaims(UidRange(100, 105), tmp_path / "claims", proc)
    owner = tmp_path / "state" / "w1"
    owner.mkdir(parents=True)
    assert [claims.claim(owner) for _ in range(3)] == [101, 103, 104]
    assert (tmp_path / "claims" / "101").read_text() == str(owner)
    assert (tmp_path / "claims" / "101").stat().st_mode & 0o777 == 0o600
    (tmp_path / "claims" / "105").write_text(str(tmp_path / "state" / "gone"))  # its agent's data was deleted
    assert claims.claim(owner) == 105
    with pytest.raises(LookupError, match="no free uid in 100-105"):
        claims.claim(owner)
    release(tmp_path / "claims" / "103", tmp_path / "state" / "someone-else")  # not its claim: kept
    release(tmp_path / "claims" / "101", owner)
    assert sorted(p.name for p in (tmp_path / "claims").iterdir()) == [".lock", "103", "104", "105"]
    assert claims.claim(owner) == 101


def test_a_stale_claim_whose_uid_still_runs_is_not_taken(tmp_path):
    proc = fake_proc(tmp_path / "proc", {7: (100, "S")})
    claims = UidClaims(UidRange(100, 100), tmp_path / "claims", proc)
    claims.directory.mkdir()
    (claims.directory / "100").write_text(str(tmp_path / "gone"))
    with pytest.raises(LookupError):
        claims.claim(tmp_path)


# identity modes ---------------------------------------------------------------------------------------------------

@pytest.mark.parametrize(
    ("requested", "euid", "want"),
    [("dynamic-uid", 0, TransientUsers), ("local-user", 0, LocalUsers), ("root", 0, RootUser),
     ("dynamic-uid", 1000, AgentUser)],
    ids=["default-as-root", "local-user", "explicit-root", "agent-not-root-runs-jobs-as-itself"],
)
def test_the_mode_in_effect(requested, euid, want, tmp_path):
    identity = open_identity(requested, "61184-65519", euid=euid, claims_dir=tmp_path)
    assert type(identity) is want
    assert identity.switches == (want in (TransientUsers, LocalUsers))


@pytest.mark.parametrize("requested", ["root", "local-user"])
def test_an_agent_that_is_not_root_refuses_to_promise_another_user(requested):
    with pytest.raises(ValueError, match=f"--run-jobs-as {requested}: the agent must run as root"):
        open_identity(requested, "61184-65519", euid=1000)


@pytest.mark.parametrize(
    ("user", "want"),
    [("", "names no user"), ("root", "is root or in group 0"), ("no-such-account-gpupool", "has no account")],
    ids=["no-user", "root", "unknown"],
)
def test_local_users_refuse_root_and_unknown_accounts(user, want, tmp_path):
    with pytest.raises(LaunchError, match=want):
        LocalUsers().user_for(shell("true", user=user), tmp_path)


# the runtime with transient uids ----------------------------------------------------------------------------------

@pytest.fixture
def uid_range(free_range: Callable[[int], UidRange]) -> UidRange:
    return free_range(2)


@pytest.fixture
def make_runtime(tmp_path: Path, job_root: Path) -> Iterator[Callable[..., ProcessRuntime]]:
    made: list[ProcessRuntime] = []

    def make(uids: UidRange, **kwargs: object) -> ProcessRuntime:
        runtime = ProcessRuntime(tmp_path / f"workloads{len(made)}", base_env=BASE_ENV, work_root=job_root / "work",
                                 identity=TransientUsers(UidClaims(uids)), **kwargs)  # type: ignore[arg-type]
        made.append(runtime)
        return runtime

    yield make
    for runtime in made:  # never leave a job (or its uid's claim) behind
        for handle in runtime.adopt():
            runtime.stop(handle, grace_s=0)
            runtime.forget(handle)


def daemon_pid(handle: RunHandle) -> int:
    path = handle.work_dir / "daemon.pid"  # type: ignore[operator]
    wait_until(lambda: path.exists() and path.read_text().strip())
    return int(path.read_text())


def gone(pid: int) -> bool:
    stat = read_stat(pid)
    return stat is None or stat.is_dead


DAEMON = "setsid sh -c 'echo $$ > daemon.pid.tmp; mv daemon.pid.tmp daemon.pid; exec sleep 300' & "


@ROOT_ONLY
def test_a_job_runs_as_its_own_transient_uid_with_nothing_more(make_runtime, uid_range):
    runtime = make_runtime(uid_range)
    handle = runtime.launch(shell("id -u; id -g; id -G; umask; grep NoNewPrivs /proc/self/status; pwd; "
                                  "echo $HOME $TMPDIR; stat -c %a:%u:%g .; cat /proc/1/environ"))
    assert wait_exit(runtime, handle).exit_code not in (None, 0)  # the last command is denied
    uid, gid, groups, umask, nnp, cwd, env, mode, *_ = handle.log_path.read_text().splitlines()
    assert handle.uid == int(uid) == int(gid) == int(groups) and uid_range.first <= handle.uid <= uid_range.last
    assert (umask, nnp.split()[-1]) == ("0077", "1")
    assert cwd == str(handle.work_dir) and env == f"{handle.work_dir} {handle.work_dir}"
    assert mode == f"700:{uid}:{gid}"
    assert handle.work_dir.parent.stat().st_mode & 0o777 == 0o711  # type: ignore[union-attr]
    assert "Permission denied" in handle.log_path.read_text()


@ROOT_ONLY
def test_jobs_at_once_get_distinct_uids_and_a_uid_waits_until_its_workload_is_forgotten(make_runtime, free_range):
    runtime = make_runtime(free_range(2))
    first, second = (runtime.launch(shell("exec sleep 300", allocation=a)) for a in ("a1", "a2"))
    assert first.uid != second.uid
    with pytest.raises(LaunchError, match="no free uid"):
        runtime.launch(shell("true", allocation="a3"))
    runtime.stop(first, grace_s=0)
    with pytest.raises(LaunchError, match="no free uid"):  # stopped, but still recorded (not yet reported)
        runtime.launch(shell("true", allocation="a3"))
    runtime.forget(first)
    assert runtime.launch(shell("true", allocation="a3")).uid == first.uid


@ROOT_ONLY
def test_two_agents_on_one_host_never_share_a_uid(make_runtime, free_range):
    uids = free_range(1)
    runtime, neighbour = make_runtime(uids), make_runtime(uids)
    runtime.launch(shell("exec sleep 300"))
    with pytest.raises(LaunchError, match="no free uid"):
        neighbour.launch(shell("exec sleep 300"))


@ROOT_ONLY
def test_a_daemon_is_killed_when_its_job_ends(make_runtime, uid_range):
    runtime = make_runtime(uid_range)
    handle = runtime.launch(shell(DAEMON + "sleep 0.3; exit 5"))
    pid = daemon_pid(handle)
    assert wait_exit(runtime, handle) == RunState("exited", 5)
    assert gone(pid) and processes_of(handle.uid) == []  # the wrapper killed it before recording the exit


@ROOT_ONLY
def test_a_daemon_is_killed_when_its_job_is_stopped_even_by_sigkill(make_runtime, uid_range):
    runtime = make_runtime(uid_range)
    handle = runtime.launch(shell("trap '' TERM; " + DAEMON + "sleep 300"))  # SIGKILL ends the wrapper too
    pid = daemon_pid(handle)
    assert runtime.stop(handle, grace_s=0.2) == RunState("exited", 128 + signal.SIGKILL)
    assert gone(pid) and processes_of(handle.uid) == []  # the runtime's own kill by uid


@ROOT_ONLY
def test_a_daemon_is_killed_when_its_job_fences_itself_with_no_agent_around(make_runtime, uid_range):
    runtime = make_runtime(uid_range, fence_s=0.5, fence_grace_s=0.2)  # nobody renews the lease
    handle = runtime.launch(shell("trap '' TERM; " + DAEMON + "sleep 300"))
    pid = daemon_pid(handle)
    assert wait_exit(runtime, handle) == RunState("exited", 128 + signal.SIGKILL)
    assert runtime.self_fenced(handle) and gone(pid) and processes_of(handle.uid) == []


@ROOT_ONLY
def test_forget_removes_the_work_folder_and_releases_the_uid(make_runtime, uid_range):
    runtime = make_runtime(uid_range)
    handle = runtime.launch(shell("echo data > result"))
    wait_exit(runtime, handle)
    claim = Path(handle.uid_claim)
    assert claim.read_text() == str(handle.state_dir)
    runtime.forget(handle)
    assert not claim.exists() and not handle.work_dir.exists() and not handle.state_dir.exists()  # type: ignore


@ROOT_ONLY
def test_a_restarted_agent_adopts_the_uid_with_the_workload(make_runtime, uid_range, tmp_path, job_root):
    runtime = make_runtime(uid_range)
    handle = runtime.launch(shell(DAEMON + "exec sleep 300"))
    pid = daemon_pid(handle)
    restarted = ProcessRuntime(runtime.directory, work_root=job_root / "work")  # another mode now: still killed
    [adopted] = restarted.adopt()
    assert (adopted.uid, adopted.uid_claim, adopted.work_dir) == (handle.uid, handle.uid_claim, handle.work_dir)
    restarted.stop(adopted, grace_s=1)
    restarted.forget(adopted)
    assert gone(pid) and not Path(handle.uid_claim).exists()


@ROOT_ONLY
def test_a_job_as_a_local_account(tmp_path, job_root):
    runtime = ProcessRuntime(tmp_path / "workloads", base_env=BASE_ENV, work_root=job_root, identity=LocalUsers())
    handle = runtime.launch(shell("id -u; id -G; echo $HOME $USER", user="nobody"))
    assert wait_exit(runtime, handle).exit_code == 0
    assert handle.log_path.read_text().splitlines() == ["65534", "65534", "/nonexistent nobody"]
    assert handle.uid_claim == ""  # an account's other processes are not the job's: never killed by uid
    runtime.forget(handle)


def test_kill_uid_never_kills_as_root():
    with pytest.raises(ValueError, match="only a job's uid"):
        kill_uid(0)


PRELOAD_C = r"""
#include <stdio.h>
#include <stdlib.h>
#include <unistd.h>
__attribute__((constructor)) static void loaded(void) {
    const char *out = getenv("PRELOAD_WITNESS");
    FILE *f;
    if (out && geteuid() == 0 && (f = fopen(out, "a"))) { fprintf(f, "loaded as root in %d\n", getpid()); fclose(f); }
}
"""


@ROOT_ONLY
def test_the_jobs_environment_never_reaches_the_root_wrapper(make_runtime, uid_range, tmp_path, job_root):
    """A tenant's order may set LD_PRELOAD (a library an earlier job of its left in a world-readable place): the
    wrapper, which stays root, must not load it, nor see any other variable of the job's."""
    gcc = shutil.which("gcc")
    if gcc is None:
        pytest.skip("gcc not found: cannot build the preload library")
    library, witness = job_root / "evil.so", tmp_path / "witness"
    source = tmp_path / "evil.c"
    source.write_text(PRELOAD_C)
    subprocess.run([gcc, "-shared", "-fPIC", "-o", str(library), str(source)], check=True, capture_output=True)
    library.chmod(0o755)
    runtime = make_runtime(uid_range)
    env = {"LD_PRELOAD": str(library), "PRELOAD_WITNESS": str(witness), "TENANT_SECRET": "s3cret"}
    handle = runtime.launch(shell('echo "job sees $TENANT_SECRET"; sleep 1', env=env))
    wrapper_env = (Path("/proc") / str(handle.pid) / "environ").read_bytes()
    assert wait_exit(runtime, handle).exit_code == 0
    assert "job sees s3cret" in handle.log_path.read_text()
    assert not witness.exists(), witness.read_text()
    assert wrapper_env == b""
