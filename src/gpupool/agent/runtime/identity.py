"""Who a process job runs as (issue 41: no job runs as root unless the operator says so, and `gpupool nodes` shows it).

Modes (the agent's `--run-jobs-as`, reported to the control plane as `jobs_as`):

* "dynamic-uid", the default of an agent running as root: a transient uid per job, as systemd's `DynamicUser=`,
  claimed from `--job-uid-range` (gpupool.agent.runtime.uids), gid = uid, no supplementary groups; the uid owns only
  the job's work folder and is free again only once every process of it is gone;
* "local-user" (Slurm-style, for sites with shared home folders whose accounts are gpupool's user names): the local
  account named as the submitting gpupool user, with its groups; an unknown account, or one with uid or a group 0,
  fails the launch;
* "agent-user": the agent's own user, because the agent does not run as root and cannot switch users;
* "root": only with `--run-jobs-as root`.

In every mode the runtime also gives the job no_new_privs, umask 077, its own session and process group, and its own
0700 work folder.
"""

from __future__ import annotations

import os
import pwd
from abc import ABC, abstractmethod
from dataclasses import dataclass
from pathlib import Path
from typing import ClassVar

from gpupool.agent.runtime.base import LaunchError, LaunchSpec
from gpupool.agent.runtime.uids import CLAIMS_DIR, UidClaims, UidRange
from gpupool.protocol.agent import JobsAs

#: the modes an operator may ask for with `--run-jobs-as`
REQUESTABLE = ("dynamic-uid", "local-user", "root")


@dataclass(frozen=True, slots=True)
class JobUser:
    """The identity of one job. `uid` None: the agent's own (no switch). `claim` is the claim file of a transient
    uid (empty otherwise): its processes are killed by uid when the job ends, and the claim is released after."""

    uid: int | None = None
    gid: int | None = None
    groups: tuple[int, ...] = ()
    name: str = ""
    home: str = ""
    claim: str = ""

    def env(self, work_dir: Path) -> dict[str, str]:
        """HOME, TMPDIR, USER and LOGNAME for the job: its account's where it has one, else its work folder."""
        env = {"HOME": self.home or str(work_dir), "TMPDIR": str(work_dir)}
        if self.name:
            env.update(USER=self.name, LOGNAME=self.name)
        return env


class JobIdentity(ABC):
    """Picks the identity of each job; `mode` is what the agent reports."""

    mode: ClassVar[JobsAs]

    @abstractmethod
    def user_for(self, spec: LaunchSpec, owner: Path) -> JobUser:
        """The identity `spec` runs as, called once per launch; `owner` is the workload's state folder (it exists).
        Raises LaunchError when there is none (the launch is then reported failed)."""

    @property
    def switches(self) -> bool:
        """True when jobs run under another uid than the agent's."""
        return False


class AgentUser(JobIdentity):
    """Jobs run as the agent's own user (an agent that does not run as root)."""

    mode = "agent-user"

    def user_for(self, spec: LaunchSpec, owner: Path) -> JobUser:
        return JobUser()


class RootUser(JobIdentity):
    """Jobs run as root, the agent's user: only with `--run-jobs-as root`."""

    mode = "root"

    def user_for(self, spec: LaunchSpec, owner: Path) -> JobUser:
        return JobUser()


class LocalUsers(JobIdentity):
    """Jobs run as the local account named as their submitting user (`spec.user`), with its groups."""

    mode = "local-user"

    def user_for(self, spec: LaunchSpec, owner: Path) -> JobUser:
        if not spec.user:
            raise LaunchError("this node runs jobs as local users, and the launch order names no user")
        try:
            account = pwd.getpwnam(spec.user)
        except KeyError:
            raise LaunchError(f"this node runs jobs as local users and has no account {spec.user!r}") from None
        groups = tuple(os.getgrouplist(account.pw_name, account.pw_gid))
        if account.pw_uid == 0 or account.pw_gid == 0 or 0 in groups:
            raise LaunchError(f"account {spec.user!r} is root or in group 0: jobs never run so")
        return JobUser(account.pw_uid, account.pw_gid, groups, account.pw_name, account.pw_dir)

    @property
    def switches(self) -> bool:
        return True


class TransientUsers(JobIdentity):
    """Each job runs as a transient uid of `claims`' range (see the module docstring)."""

    mode = "dynamic-uid"

    def __init__(self, claims: UidClaims) -> None:
        self.claims = claims

    def user_for(self, spec: LaunchSpec, owner: Path) -> JobUser:
        try:
            uid = self.claims.claim(owner)
        except LookupError as exc:
            raise LaunchError(str(exc)) from None
        return JobUser(uid, uid, (), claim=str(self.claims.directory / str(uid)))

    @property
    def switches(self) -> bool:
        return True


def open_identity(requested: str, uid_range: str, *, euid: int | None = None,
                  claims_dir: Path = CLAIMS_DIR) -> JobIdentity:
    """The identity for `--run-jobs-as requested` (one of REQUESTABLE) with `--job-uid-range uid_range`, for an agent
    running as `euid` (default: this process's). An agent that is not root runs jobs as itself when the default
    ("dynamic-uid") is asked for; ValueError (naming the flag) for anything else it cannot do, or a malformed range."""
    if requested not in REQUESTABLE:
        raise ValueError(f"--run-jobs-as {requested!r}: must be one of {', '.join(REQUESTABLE)}")
    parsed = UidRange.parse(uid_range)
    if (os.geteuid() if euid is None else euid) != 0:
        if requested != "dynamic-uid":
            raise ValueError(f"--run-jobs-as {requested}: the agent must run as root to switch users")
        return AgentUser()
    if requested == "root":
        return RootUser()
    if requested == "local-user":
        return LocalUsers()
    return TransientUsers(UidClaims(parsed, claims_dir))
