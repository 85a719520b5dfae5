"""The node agent's entry point: discover devices, register once, adopt surviving workloads, run the channel.

`run_agent` is what `gpupool agent` calls. Files under `data_dir` (0700, made so at every start; the agent's alone):

    node.json        node id, credential, heartbeat_s, fence_s, kill_grace_s and the control plane's order key from
                     registration (0600); it means "registered": a restarted agent reuses it and never spends a join
                     token again. The order key is PINNED here: orders not signed by it are refused (a node.json
                     without one, from before signed orders, is refused too: register the node again). It also
                     keeps the channel's TLS identity: the node's private key (made here, never sent), its client
                     certificate (renewed over the channel) and the agent CA certificate, the only one trusted for
                     the channel (pinned with `ca_hash` at registration when given)
    epoch            the highest control-plane epoch seen (stale orders stay refused across restarts)
    workloads/       the runtime's per-workload folders (state, exit code, log)

The join token (first start only) comes from `--join-token` (shown by `ps`), $GPUPOOL_JOIN_TOKEN or
`--join-token-file` (read_join_token). It registers a new node name only: a registered node keeps its identity in
node.json, and its name is free for a new token only after an operator's `gpupool node reset NAME`.

Jobs run as `--run-jobs-as` says (gpupool.agent.runtime.identity; default: a transient uid per job from
`--job-uid-range`, when the agent runs as root; the agent's own user otherwise, which the log says loudly), each in
its own 0700 folder under the work root (`--work-dir`, default DATA_DIR's sibling "<name>-work", made 0711 so that
a job reaches its own folder and lists nobody's; /var/lib/gpupool/work/<hash of DATA_DIR> when a folder above that
sibling is closed to others, as a home folder is). Jobs that switch users must be able to pass every parent folder
of the work root: the agent refuses to start otherwise.

Each process start gets a fresh `boot_id`. SIGTERM or SIGINT ends the agent WITHOUT stopping workloads: the next
agent process adopts them, provided it reaches the control plane within `fence_s` of the last frame this one heard;
past that, each workload's watchdog stops it (see runtime/process.py), as the control plane may requeue it elsewhere.
Exit codes: 0 after a signal, 2 for bad configuration or a refused registration (also: the control plane's key is
not the one pinned with `cp_key_hash`, or its CA not the one pinned with `ca_hash`), 3 when the control plane
rejects the saved credential or certificate (revoked, expired), or node.json pins no order key or holds no
certificate.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import logging
import os
import random
import re
import signal
import socket
import stat
import uuid
from collections.abc import Sequence
from dataclasses import asdict, dataclass, replace
from functools import partial
from pathlib import Path

from gpupool.agent import toolkit
from gpupool.agent.channel import Channel, ChannelConfig
from gpupool.agent.clock import WallClock
from gpupool.agent.connection import CredentialRejected, websocket_connector
from gpupool.agent.devices import DeviceDiscovery, open_discovery
from gpupool.agent.registration import RegistrationError, endpoint, locate_leader, register
from gpupool.agent.runtime.container import DEFAULT_USER, open_runtime, podman_path
from gpupool.agent.runtime.identity import JobIdentity, TransientUsers, open_identity
from gpupool.agent.runtime.uids import DEFAULT_RANGE
from gpupool.agent.timing import DEFAULT_KILL_GRACE_S, Backoff, reconnect_cap_s
from gpupool.agent.tls import ChannelTls, Renewal, csr_for, new_key
from gpupool.protocol.agent import Registration

log = logging.getLogger(__name__)

NODE_FILE = "node.json"
EPOCH_FILE = "epoch"
WORKLOADS_DIR = "workloads"
EXIT_OK, EXIT_CONFIG, EXIT_CREDENTIAL = 0, 2, 3


#: where work folders go when the data dir's sibling is out of the jobs' reach
SYSTEM_WORK_ROOT = Path("/var/lib/gpupool/work")


@dataclass(frozen=True)
class JobSetup:
    """Who process jobs run as, and the work root that holds their work folders."""

    identity: JobIdentity
    work_root: Path


def private_dir(path: Path) -> Path:
    """`path`, made if needed, with mode 0700 (also when it existed with another mode)."""
    path.mkdir(parents=True, exist_ok=True, mode=0o700)
    path.chmod(0o700)
    return path


def default_work_root(data_dir: Path, switches: bool) -> Path:
    """`data_dir`'s sibling "<name>-work"; when jobs switch users and cannot pass a folder above it (a data dir under
    a 0700 home), a folder of SYSTEM_WORK_ROOT named after the data dir instead."""
    sibling = data_dir.absolute().with_name(data_dir.absolute().name + "-work")
    if not switches or _closed_parent(sibling) is None:
        return sibling
    return SYSTEM_WORK_ROOT / hashlib.sha256(str(data_dir.absolute()).encode()).hexdigest()[:16]


def _closed_parent(path: Path) -> Path | None:
    """The first existing folder from `path` up that others may not pass (o+x), or None."""
    return next((folder for folder in [path, *path.parents] if folder.exists() and
                 not folder.stat().st_mode & stat.S_IXOTH), None)


def job_setup(jobs_as: str, uid_range: str, work_dir: str | Path | None, data_dir: Path) -> JobSetup:
    """Check the job flags (ValueError naming the flag) and make the work root (0711; default: `default_work_root`).
    When jobs switch users, every folder from / down to the work root must let others pass."""
    identity = open_identity(jobs_as, uid_range)
    root = Path(work_dir) if work_dir else default_work_root(data_dir, identity.switches)
    root = root.absolute()
    root.mkdir(parents=True, exist_ok=True, mode=0o711)
    root.chmod(0o711)
    closed = _closed_parent(root)
    if identity.switches and closed is not None:
        raise ValueError(f"--work-dir {root}: jobs run as other users, who cannot pass {closed} (mode "
                         f"{stat.S_IMODE(closed.stat().st_mode):o}); choose a work folder every parent of which "
                         "others may enter (o+x)")
    return JobSetup(identity, root)


def announce(setup: JobSetup) -> None:
    """Say in the log who jobs run as; loudly when that is the agent's own user or root."""
    identity, root = setup.identity, setup.work_root
    if isinstance(identity, TransientUsers):
        uids = identity.claims.range
        log.info("process jobs run as transient uids %d-%d (gid = uid, no supplementary groups, no_new_privs); "
                 "work folders in %s", uids.first, uids.last, root)
    elif identity.mode == "local-user":
        log.info("process jobs run as the local account named as their gpupool user; work folders in %s", root)
    elif identity.mode == "root":
        log.warning("process jobs run as ROOT (--run-jobs-as root): every job can read this node's credentials "
                    "and every other job's data")
    else:
        log.warning("this agent does not run as root, so process jobs run as its own user (uid %d) and can read "
                    "everything it can, its data folder included; run the agent as root to give each job a "
                    "transient uid of its own", os.geteuid())


@dataclass(frozen=True)
class NodeIdentity:
    """What registration gave this node, as saved in `node.json`."""

    server: str
    name: str
    node_id: str
    credential: str
    heartbeat_s: float
    fence_s: float
    kill_grace_s: float = DEFAULT_KILL_GRACE_S
    order_key: str = ""
    tls_key: str = ""
    certificate: str = ""
    ca_certificate: str = ""

    @property
    def tls(self) -> ChannelTls | None:
        if not (self.tls_key and self.certificate and self.ca_certificate):
            return None
        return ChannelTls(self.tls_key, self.certificate, self.ca_certificate)


def load_identity(data_dir: Path) -> NodeIdentity | None:
    """The saved identity, or None when absent or unreadable. It belongs to the pool whose agent CA it pins, not to
    one control plane's URL: the agent takes it to whichever of the pool's control planes leads."""
    path = data_dir / NODE_FILE
    if not path.exists():
        return None
    try:
        return NodeIdentity(**json.loads(path.read_text()))
    except (OSError, ValueError, TypeError) as exc:
        log.warning("ignoring unreadable %s: %s", path, exc)
        return None


def split_servers(server: str) -> list[str]:
    """The control planes of `--server` ("URL[,URL...]": a pool's control planes, tried in turn); ValueError naming
    the option for an empty list or a URL that is not http(s)."""
    servers = [part.strip() for part in server.split(",") if part.strip()]
    if not servers:
        raise ValueError("--server: give the control plane's URL (several, comma-separated, for a pool with standbys)")
    for url in servers:
        endpoint(url, "/")  # ValueError for a malformed one
    return servers


def save_identity(data_dir: Path, identity: NodeIdentity) -> None:
    """Write `node.json` atomically with mode 0600 (it holds the node credential)."""
    path = data_dir / NODE_FILE
    tmp = path.with_name(path.name + ".tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as out:
        json.dump(asdict(identity), out)
        out.flush()
        os.fsync(out.fileno())
    os.replace(tmp, path)


def machine_resources(meminfo: Path = Path("/proc/meminfo")) -> tuple[int, int]:
    """(cpu_milli, memory_mib) of this machine: os.cpu_count() * 1000 and MemTotal (0 when unreadable)."""
    cpu_milli = (os.cpu_count() or 0) * 1000
    try:
        match = re.search(r"^MemTotal:\s+(\d+)\s*kB", meminfo.read_text(), re.MULTILINE)
    except OSError:
        match = None
    return cpu_milli, int(match[1]) // 1024 if match else 0


def default_node_name() -> str:
    """The short host name, cleaned to the characters a node name allows."""
    name = re.sub(r"[^A-Za-z0-9._-]", "-", socket.gethostname().split(".")[0]).lstrip("._-")
    return name[:128] or "node"


def new_boot_id() -> str:
    """A fresh id for this agent process: frame seqs restart from 0 under it."""
    return uuid.uuid4().hex


def read_join_token(given: str | None, path: Path | None) -> str | None:
    """The join token given (on the command line or in $GPUPOOL_JOIN_TOKEN) or read from the file at `path`;
    ValueError, naming the option, when both are given or the file cannot be read or is empty."""
    if path is None:
        return given
    if given:
        raise ValueError("--join-token-file: a join token is also given (--join-token or $GPUPOOL_JOIN_TOKEN); "
                         "give one")
    try:
        token = path.read_text().strip()
    except (OSError, UnicodeDecodeError) as exc:
        raise ValueError(f"--join-token-file {path}: cannot read it: {exc}") from None
    if not token:
        raise ValueError(f"--join-token-file {path}: the file is empty")
    return token


def build_registration(join_token: str, name: str, boot_id: str, discovery: DeviceDiscovery,
                       jobs: JobSetup | None = None) -> Registration:
    """This machine's registration, with the container-toolkit verdict (gpupool.agent.toolkit) of what is on PATH
    and who its jobs run as (`jobs`; None: not said)."""
    cpu_milli, memory_mib = machine_resources()
    gpus = discovery.list_devices()
    return Registration(
        join_token=join_token,
        name=name,
        boot_id=boot_id,
        cpu_milli=cpu_milli,
        memory_mib=memory_mib,
        gpus=gpus,
        untrusted_images=toolkit.untrusted_images(podman_path(), toolkit.ctk_path(), gpus),
        jobs_as=jobs.identity.mode if jobs is not None else "unknown",
    )


async def obtain_identity(
    servers: Sequence[str],
    join_token: str | None,
    data_dir: Path,
    registration: Registration | None,
    stop: asyncio.Event,
    key_pin: str | None = None,
    ca_pin: str | None = None,
) -> NodeIdentity | None:
    """The saved identity, else register with the first of `servers` that accepts (trying the next on network errors,
    5xx such as a standby's 503, and 429, with backoff after each round, until `stop`) and save it. Registering makes
    the node's key here and sends only a CSR for it.

    Raises RegistrationError for a refused registration or a control-plane key or CA that does not match `key_pin`
    or `ca_pin`, ValueError when there is nothing to register with. Returns None when `stop` was set first.
    """
    saved = load_identity(data_dir)
    if saved is not None:
        return saved
    if registration is None or not join_token:
        raise ValueError(f"this node is not registered with {', '.join(servers)}: give a join token")
    backoff = Backoff(random.Random())
    key = new_key()
    registration = registration.model_copy(update={"csr": csr_for(key, registration.name)})
    turn = 0
    while not stop.is_set():
        server = servers[turn % len(servers)]
        turn += 1
        try:
            reply = await asyncio.to_thread(register, server, registration, key_pin=key_pin, ca_pin=ca_pin)
        except RegistrationError as exc:
            if not exc.retryable:
                raise
            delay = backoff.next_delay() if turn % len(servers) == 0 else 0.0
            log.warning("%s; retrying in %.1f s", exc, delay)
            await _sleep_unless(stop, delay)
            continue
        identity = NodeIdentity(
            server, registration.name, reply.node_id, reply.credential, reply.heartbeat_s, reply.fence_s,
            reply.kill_grace_s, reply.order_key, key, reply.certificate, reply.ca_certificate,
        )
        save_identity(data_dir, identity)
        log.info("registered as node %s (%s)", identity.node_id, identity.name)
        return identity
    return None


def run_agent(
    server: str,
    join_token: str | None,
    data_dir: str | Path,
    name: str | None,
    fake_gpus: str | None,
    heartbeat_s: float | None = None,
    cp_key_hash: str | None = None,
    ca_hash: str | None = None,
    run_jobs_as: str = "dynamic-uid",
    job_uid_range: str = DEFAULT_RANGE,
    work_dir: str | Path | None = None,
) -> int:
    """Run the node agent until SIGTERM/SIGINT; see the module docstring for files, job identities and exit codes.

    `fake_gpus` is a FakeDiscovery spec ("" for a GPU-less node); None means real GPUs through NVML.
    `heartbeat_s` overrides the control plane's heartbeat interval. `cp_key_hash` ("sha256:<hex>") pins the
    control plane's order key at registration, `ca_hash` ("sha256:<hex>") its agent CA. `run_jobs_as`,
    `job_uid_range` and `work_dir` are the job flags (`job_setup`). `server` is one control plane's URL, or several,
    comma-separated: a pool's control planes, whichever leads is used (`split_servers`).
    """
    if not logging.getLogger().handlers:
        logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    directory = private_dir(Path(data_dir))
    node_name = name or default_node_name()
    try:
        servers = split_servers(server)
        jobs = job_setup(run_jobs_as, job_uid_range, work_dir, directory)
        announce(jobs)
        with open_discovery(fake_gpus, node=node_name) as discovery:
            return asyncio.run(_agent(servers, join_token, directory, node_name, discovery, heartbeat_s, cp_key_hash,
                                      ca_hash, jobs=jobs))
    except (RegistrationError, ValueError) as exc:
        log.error("%s", exc)
        return EXIT_CONFIG


async def _agent(
    servers: list[str],
    join_token: str | None,
    data_dir: Path,
    name: str,
    discovery: DeviceDiscovery,
    heartbeat_s: float | None,
    cp_key_hash: str | None = None,
    ca_hash: str | None = None,
    *,
    jobs: JobSetup,
) -> int:
    stop = _stop_on_signals()
    boot_id = new_boot_id()
    registration = build_registration(join_token, name, boot_id, discovery, jobs) if join_token else None
    identity = await obtain_identity(servers, join_token, data_dir, registration, stop, cp_key_hash, ca_hash)
    if identity is None:
        return EXIT_OK
    if not identity.order_key:
        log.error("%s pins no control-plane order key (saved before orders were signed): remove it, have an "
                  "operator reset the node (gpupool node reset) and register again with a new join token",
                  data_dir / NODE_FILE)
        return EXIT_CREDENTIAL
    tls = identity.tls
    if tls is None:
        log.error("%s holds no channel certificate (saved before the channel used mTLS): remove it, have an "
                  "operator reset the node (gpupool node reset) and register again with a new join token",
                  data_dir / NODE_FILE)
        return EXIT_CREDENTIAL
    runtime = open_runtime(data_dir / WORKLOADS_DIR, fence_s=identity.fence_s, fence_grace_s=identity.kill_grace_s,
                           user=os.environ.get("GPUPOOL_CONTAINER_USER", DEFAULT_USER), identity=jobs.identity,
                           work_root=jobs.work_root)
    adopted = runtime.adopt()
    log.info("boot %s: adopted %d workload(s) from %s", boot_id, len(adopted), runtime.directory)
    config = ChannelConfig(
        server_url=",".join(servers),
        credential=identity.credential,
        boot_id=boot_id,
        heartbeat_s=heartbeat_s or identity.heartbeat_s,
        fence_s=identity.fence_s,
        kill_grace_s=identity.kill_grace_s,
        backoff_cap_s=reconnect_cap_s(identity.fence_s),
        idle_threshold_pct=float(os.environ.get("GPUPOOL_IDLE_THRESHOLD_PCT", "5")),
        idle_window_s=float(os.environ.get("GPUPOOL_IDLE_WINDOW_S", "1800")),
        epoch_path=data_dir / EPOCH_FILE,
        node_id=identity.node_id,
        order_key=identity.order_key,
        untrusted_images=toolkit.untrusted_images(podman_path(), toolkit.ctk_path(), discovery.list_devices()),
        jobs_as=jobs.identity.mode,
        advertise_address=os.environ.get("GPUPOOL_ADVERTISE_ADDRESS") or None,
    )
    try:
        skew_s = float(os.environ.get("GPUPOOL_TEST_CLOCK_SKEW_S", "0"))  # tests of clock skew (RELIABILITY.md T4)
        renewal = Renewal(tls, identity.name, now=lambda: channel.server_clock.now(),
                          on_renewed=partial(_save_renewed, data_dir, identity), scratch=data_dir)
        channel = Channel(config, runtime, discovery, adopted=adopted, wall_clock=WallClock(skew_s),
                          connect=websocket_connector(ping_s=min(20.0, config.fence_s / 4), tls=renewal.context),
                          locate=partial(locate_leader, servers), renewal=renewal)
        await channel.run(stop)
    except CredentialRejected as exc:
        log.error("%s; if an operator reset this node (gpupool node reset), remove %s and register again with a new "
                  "join token", exc, data_dir / NODE_FILE)
        return EXIT_CREDENTIAL
    log.info("agent stopped; workloads keep running and will be adopted by the next agent")
    return EXIT_OK


def _save_renewed(data_dir: Path, identity: NodeIdentity, tls: ChannelTls) -> None:
    """Keep a renewed certificate (and the key it is for) in node.json."""
    save_identity(data_dir, replace(identity, tls_key=tls.key, certificate=tls.certificate))


def _stop_on_signals() -> asyncio.Event:
    """An event set by SIGTERM or SIGINT (the running loop's handlers replace the default ones)."""
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for signum in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(signum, stop.set)
    return stop


async def _sleep_unless(stop: asyncio.Event, seconds: float) -> None:
    try:
        await asyncio.wait_for(stop.wait(), seconds)
    except TimeoutError:
        pass
