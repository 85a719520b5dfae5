"""The agent <-> control-plane channel, version 1.

An agent registers once with a single-use join token (`Registration` -> `RegistrationReply`), then
keeps ONE outbound WebSocket to `/api/v1/agent/channel`, authenticated with its node credential.
Every frame is a JSON object with a `type`. Agent frames carry a `seq` that grows within a boot
(`boot_id`); the control plane applies each (boot_id, seq) at most once and answers with `Ack`.
Launch orders carry the allocation's attempt and the control plane's epoch, and expire: an agent
refuses expired orders and orders from an older epoch than one it has seen. Launch and stop orders name
the node they are for and are signed by the control plane (gpupool.protocol.signing); the agent pins the
control plane's public key from its `RegistrationReply` and refuses an order that does not verify or names
another node. The control plane answers a frame it refuses to apply (a report about another node's
allocation, or a task status about a closed attempt) with `Rejected` instead of `Ack`.

Transport (RELIABILITY.md §4.2): registration goes over the API; the channel is served on a separate TLS 1.3
listener that requires a client certificate from the control plane's agent CA. The agent makes its key itself and
sends a CSR (PEM) with its registration; the reply carries its certificate (subject CN = node id) and the CA
certificate, which the agent may pin (gpupool.protocol.tls.ca_hash). Before its certificate reaches 2/3 of its
lifetime the agent sends `Renew` (a new CSR) over the live channel and gets `Certificate` back.
"""

from __future__ import annotations

import re
from typing import Annotated, Literal

from pydantic import AfterValidator, BaseModel, ConfigDict, Field

from gpupool.protocol import launch
from gpupool.protocol.devices import MAX_COUNT, GpuInfo, GpuTelemetry, Uuid

PROTOCOL_VERSION = 1
MAX_FRAME_BYTES = 1 << 20

# Bounds of every field an agent sends (untrusted input, RELIABILITY.md §3.2 S11): ids as the control plane makes
# them, counters within the database's integer columns, exit codes in the shell convention (0..255), pids within
# Linux's PID_MAX_LIMIT. Agent frames carry no timestamps (the control plane stamps what it receives).
BootId = Annotated[str, Field(max_length=64)]
Seq = Annotated[int, Field(ge=0, le=(1 << 62))]
AllocationId = Annotated[str, Field(max_length=64)]
Attempt = Annotated[int, Field(ge=0, le=MAX_COUNT)]
ExitCode = Annotated[int, Field(ge=0, le=255)]
Protocol = Annotated[int, Field(ge=1, le=1000)]
MAX_WORKLOADS = 4096
MAX_LAUNCH_ENV = 256  # a job's env (128) and secret_env (64), and what the control plane adds
#: who the node's process jobs run as (gpupool.agent.runtime.identity): a transient uid per job, the submitting
#: user's local account, the agent's own (non-root) user, or root; "unknown" for an agent that does not say
JobsAs = Literal["dynamic-uid", "local-user", "agent-user", "root", "unknown"]
#: a host name or an IP address other nodes may reach (`ADDRESS.fullmatch` says whether a string is one)
ADDRESS = re.compile(r"[A-Za-z0-9._:-]{1,253}")
Address = Annotated[str, Field(min_length=1, max_length=253, pattern=r"^[A-Za-z0-9._:-]+$")]
Port = Annotated[int, Field(ge=1, le=65535)]
MAX_GANG = 256


class _Frame(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class Registration(_Frame):
    join_token: str = Field(min_length=8, max_length=128)
    name: str = Field(min_length=1, max_length=128, pattern=r"^[A-Za-z0-9][A-Za-z0-9._-]*$")
    boot_id: str = Field(min_length=1, max_length=64)
    cpu_milli: int = Field(ge=0, le=1 << 24)
    memory_mib: int = Field(ge=0, le=1 << 30)
    gpus: list[GpuInfo] = Field(default_factory=list, max_length=64)
    site: str = Field(default="", max_length=64)
    rack: str = Field(default="", max_length=64)
    csr: str = Field(default="", max_length=8192, description="PEM certificate request for the channel's client "
                                                             "certificate; without one the node cannot open it")
    untrusted_images: bool = Field(default=False, description="the node's container toolkit is safe for any "
                                                              "tenant's image (gpupool.agent.toolkit); else no job "
                                                              "with an image is placed on it")
    jobs_as: JobsAs = Field(default="unknown", description="who the node's process jobs run as")
    protocol: Protocol = PROTOCOL_VERSION


class RegistrationReply(_Frame):
    node_id: str
    credential: str
    heartbeat_s: float
    fence_s: float
    kill_grace_s: float = 10.0
    order_key: str = Field(min_length=1, description="the control plane's Ed25519 public key (base64) for orders")
    certificate: str = Field(default="", description="PEM client certificate for the channel (when a CSR was sent)")
    ca_certificate: str = Field(default="", description="PEM certificate of the agent CA (pinned by the agent)")
    agent_port: int = Field(default=0, description="the TLS port of the channel (also in /readyz)")


class RunningReport(_Frame):
    allocation_id: AllocationId
    attempt: Attempt
    pid: int | None = Field(default=None, ge=1, le=1 << 22)
    state: Literal["starting", "running", "exited"]
    exit_code: ExitCode | None = None


class Hello(_Frame):
    type: Literal["hello"] = "hello"
    boot_id: BootId
    seq: Seq
    running: list[RunningReport] = Field(default_factory=list, max_length=MAX_WORKLOADS)
    protocol: Protocol = PROTOCOL_VERSION
    untrusted_images: bool | None = Field(default=None, description="the node's container-toolkit verdict as of "
                                                                    "this boot (as in Registration); None: unsaid")
    jobs_as: JobsAs | None = Field(default=None, description="who the node's process jobs run as, this boot (as in "
                                                             "Registration); None: unsaid")
    address: Address | None = Field(default=None, description=(
        "where other nodes reach this one (`gpupool agent --advertise-address`, else the local address of this "
        "channel): the MASTER_ADDR of gangs whose task 0 runs here, and this node's line in their hostfile; None: "
        "unsaid (the control plane then uses the node's name)"))


class Heartbeat(_Frame):
    type: Literal["heartbeat"] = "heartbeat"
    boot_id: BootId
    seq: Seq
    telemetry: list[GpuTelemetry] = Field(default_factory=list, max_length=64)
    idle_gpus: list[Uuid] = Field(default_factory=list, max_length=64)  # below the idle threshold for the whole window


class TaskStatus(_Frame):
    type: Literal["task_status"] = "task_status"
    boot_id: BootId
    seq: Seq
    allocation_id: AllocationId
    attempt: Attempt
    state: Literal["started", "exited", "failed", "fenced", "refused"]
    exit_code: ExitCode | None = None
    message: str = Field(default="", max_length=2000)
    rendezvous_port: Port | None = Field(default=None, description=(
        "with \"started\" for task 0 of a gang: the port its agent picked and held for MASTER_PORT until the task "
        "started; the control plane then launches the other tasks with it"))


class LogChunk(_Frame):
    type: Literal["log"] = "log"
    boot_id: BootId
    seq: Seq
    allocation_id: AllocationId
    attempt: Attempt
    offset: int = Field(ge=0, le=1 << 40)
    data: str = Field(max_length=65536)


class Renew(_Frame):
    """A request for a fresh client certificate, sent over the live channel before the current one reaches 2/3 of
    its lifetime. Answered with `Certificate` (and acked); the certificate is issued to the channel's own node."""

    type: Literal["renew"] = "renew"
    boot_id: BootId
    seq: Seq
    csr: str = Field(min_length=1, max_length=8192)


AgentFrame = Annotated[Hello | Heartbeat | TaskStatus | LogChunk | Renew, Field(discriminator="type")]


class GpuGrant(_Frame):
    uuid: str
    index: int = Field(ge=0)
    milli: int = Field(ge=1, le=1000)
    memory_mib: int = Field(ge=0)


class GangHost(_Frame):
    """One line of a gang's hostfile: a node's address and how many of the gang's tasks it runs."""

    address: Address
    slots: int = Field(ge=1, le=MAX_GANG)


class Rendezvous(_Frame):
    """What one task of a gang (a job of several tasks) needs to meet the others, as torchrun, NCCL and MPI read it.

    The agent sets WORLD_SIZE, RANK, LOCAL_RANK, LOCAL_WORLD_SIZE, MASTER_ADDR and MASTER_PORT from it, and writes
    `hosts` as the hostfile named by GPUPOOL_HOSTFILE ("ADDRESS slots=N" per node, task 0's node first). Task 0's order
    carries `master_port` 0: its agent picks a free port, holds it until the task starts, and reports it in the task's
    "started" status (`TaskStatus.rendezvous_port`); the other tasks' orders are sent only then, carrying it. A re-sent
    order of task 0 carries the port reported, which its agent then keeps."""

    world_size: int = Field(ge=1, le=MAX_GANG)
    rank: int = Field(ge=0, lt=MAX_GANG)
    local_rank: int = Field(ge=0, lt=MAX_GANG)
    local_world_size: int = Field(ge=1, le=MAX_GANG)
    master_addr: Address
    master_port: int = Field(default=0, ge=0, le=65535)
    hosts: list[GangHost] = Field(min_length=1, max_length=MAX_GANG)


class Launch(_Frame):
    """An order to start one attempt of one task. Its strings follow gpupool.protocol.launch as the API's do (a NUL,
    a lone surrogate, an overlong value, a bad variable name or a relative workdir is a ValidationError), so an agent
    refuses such an order instead of crashing on it; names gpupool reserves are allowed here, since the control plane
    sets `GPUPOOL_TASK_INDEX` itself. The frame's own bound (MAX_FRAME_BYTES) bounds them together."""

    type: Literal["launch"] = "launch"
    allocation_id: AllocationId  # bounded as a task status names it: every order can be answered
    attempt: Attempt
    job_id: str = Field(max_length=64)
    task_index: int = Field(ge=0)
    command: list[launch.Arg] = Field(min_length=1, max_length=launch.MAX_ARGS)
    env: dict[launch.EnvName, launch.EnvValue] = Field(default_factory=dict, max_length=MAX_LAUNCH_ENV)
    workdir: launch.Workdir | None = None
    image: Annotated[str, Field(max_length=512), AfterValidator(launch.process_text)] | None = None
    gpus: list[GpuGrant] = Field(default_factory=list)
    epoch: int = Field(ge=0)
    expires_at: float
    user: str = ""  # the submitting user's name: the local account of a node that runs jobs as local users
    #: how long the workload keeps running while the agent hears from no control plane (None: the node's fence_s)
    max_disconnect_s: float | None = Field(default=None, gt=0)
    #: for a task of a gang: how it meets the others (None: a job of one task)
    rendezvous: Rendezvous | None = None
    node_id: str = ""  # the node this order is for (set when sealed)
    signature: str = ""  # base64 Ed25519 over signing.canonical(order)


class Stop(_Frame):
    type: Literal["stop"] = "stop"
    allocation_id: str
    attempt: int = Field(ge=0)
    grace_s: float = Field(ge=0)
    reason: str = ""
    node_id: str = ""
    signature: str = ""


class Ack(_Frame):
    type: Literal["ack"] = "ack"
    seq: int = Field(ge=0)


class Rejected(_Frame):
    """The answer to agent frame `seq` that the control plane received but refuses to apply (`code` 403: about
    another node's allocation; 409: a task status about an attempt already closed, e.g. requeued after its node was
    lost). Like an Ack it is final: the agent must not send that frame again."""

    type: Literal["rejected"] = "rejected"
    seq: int = Field(ge=0)
    code: int
    reason: str = Field(default="", max_length=2000)


class Certificate(_Frame):
    """The answer to `Renew`: the node's new client certificate (PEM), for its next connection."""

    type: Literal["certificate"] = "certificate"
    certificate: str = Field(min_length=1, max_length=16384)


ServerFrame = Annotated[Launch | Stop | Ack | Rejected | Certificate, Field(discriminator="type")]
