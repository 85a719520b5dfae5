"""Control-plane settings: defaults from RELIABILITY.md §2.2, overridable by GPUPOOL_* environment variables
or CLI flags. Validated at load: a bad value names its setting."""

from __future__ import annotations

import ipaddress
import os
import re
from pathlib import Path
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator


class Settings(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    #: where the control plane keeps its SQLite database, keys, tokens and logs (made 0700)
    data_dir: Path = Path("gpupool-data")
    #: the database, `postgresql+psycopg://...` for PostgreSQL (needed for standbys); empty: SQLite in
    #: DATA_DIR/gpupool.db
    database_url: str = ""
    #: the API's bind address: keep loopback unless a TLS proxy is in front
    host: str = "127.0.0.1"
    #: the API's HTTP port
    port: int = Field(default=8181, ge=0, le=65535)
    # Liveness (RELIABILITY.md §2.2, docs: "Outages"): a node silent for suspect_after_s is unreachable and takes no
    # new work; its agent keeps running its work for max_disconnect_s without word from any control plane (jobs and
    # queues may ask for less), then stops it (kill_grace_s); the control plane requeues that work only once it is
    # surely stopped: lost_after_s - max_disconnect_s after the work's own max_disconnect (a margin for the last
    # frame in flight and the agent's tick). A node silent for lost_after_s is lost.
    #: how often agents send a heartbeat
    heartbeat_s: float = Field(default=5.0, gt=0)
    #: a node silent this long is unreachable: it takes no new work
    suspect_after_s: float = Field(default=15.0, gt=0)
    #: how long an agent keeps running its work without word from any control plane, then stops it
    max_disconnect_s: float = Field(default=600.0, gt=0)
    #: a node silent this long is lost, and the work it held is requeued
    lost_after_s: float = Field(default=630.0, gt=0)
    #: how long a workload being stopped gets between SIGTERM and SIGKILL
    kill_grace_s: float = Field(default=10.0, ge=0)
    #: how long a launch order stays valid; an agent refuses an expired one
    launch_ttl_s: float = Field(default=120.0, gt=0)
    #: the longest time between two scheduling cycles (a submission, release or node change wakes one)
    cycle_interval_s: float = Field(default=0.5, gt=0)
    #: the scheduling profile (see Scheduling: profiles)
    profile: str = "default"
    #: the placement policy of the profile's allocation (`best`, `fgd`, `bestfit`, ...)
    placement: str = "best"
    #: the largest request body, streamed or not; larger ones get 413
    max_body_bytes: int = Field(default=1 << 20, gt=0)
    #: while more than this share of nodes is silent at once, no node is declared lost
    impaired_silent_share: float = Field(default=0.55, gt=0, le=1)
    #: how often running work is metered into the usage ledger
    metering_interval_s: float = Field(default=10.0, gt=0)
    #: ledger entries never cross a boundary of this period, so running work costs one row per period
    metering_period_s: int = Field(default=3600, gt=0, le=86400)
    # High availability on PostgreSQL (RELIABILITY.md §2.2, client-go defaults): a leader holds the lease for
    # lease_s, steps down when it could not renew for lease_renew_s, and every process tries every lease_retry_s.
    #: how long the scheduler lease lasts (PostgreSQL; one leader at a time)
    lease_s: float = Field(default=15.0, gt=0)
    #: a leader that could not renew its lease for this long steps down
    lease_renew_s: float = Field(default=10.0, gt=0)
    #: how often every control plane tries to take or renew the lease
    lease_retry_s: float = Field(default=2.0, gt=0)
    # Nodes declared lost (and their jobs requeued) per second, token bucket (k8s node-eviction-rate).
    #: nodes declared lost per second, their work requeued (a token bucket)
    requeue_rate_per_s: float = Field(default=0.1, gt=0)
    #: nodes the requeue bucket lets through at once
    requeue_burst: int = Field(default=1, ge=1)
    # API guard (RELIABILITY.md S5, S6). Per token (per source address without one): 50 requests/s sustained
    # with bursts of 200 is ten times what the dashboard or a CLI loop needs, lets a 1,000-job sweep in within
    # about 16 s, and keeps one token from taking the control plane's whole capacity.
    #: API requests per second per token (per client without one); past the burst, 429 with Retry-After
    rate_limit_per_s: float = Field(default=50.0, gt=0)
    #: requests a token may send at once above its rate
    rate_limit_burst: int = Field(default=200, ge=1)
    auth_failures_per_min: int = Field(default=10, ge=1, description="failed authentications per address")
    #: pending jobs an organisation may have; further submissions are refused
    max_pending_jobs_per_org: int = Field(default=10_000, ge=1)
    #: proxies whose client-address header is believed (comma-separated addresses or CIDR networks); the client of a
    #: request from one of them is the right-most address of `client_ip_header` that is not itself a trusted proxy
    trusted_proxies: str = ""
    #: the header in which a trusted proxy names the client
    client_ip_header: str = Field(default="X-Forwarded-For", pattern=r"^[A-Za-z0-9-]{1,64}$")
    # Slow clients (RELIABILITY.md S5): a request's whole body must arrive within request_body_timeout_s of its
    # start, and an idle keep-alive connection is closed after keep_alive_timeout_s (uvicorn's timeout_keep_alive).
    #: a request's whole body must arrive within this time of its start, else 408
    request_body_timeout_s: float = Field(default=30.0, gt=0, le=3600)
    #: an idle connection, or one slow to send its request head, is closed after this
    keep_alive_timeout_s: int = Field(default=5, ge=1, le=3600)
    # The audit log (S10): rows for authenticated mutating requests; refused anonymous ones are counted in /metrics
    # and at most audit_sample_per_min of them per route and minute are written too. Rows older than
    # audit_retention_days are deleted every audit_prune_interval_s (at least two days: the database refuses to
    # delete a row less than a day old, and the second day absorbs a database clock behind this one).
    #: refused anonymous mutating requests written to the audit log per route and minute (all are counted in /metrics)
    audit_sample_per_min: int = Field(default=10, ge=0, le=100_000)
    #: days an audit row is kept
    audit_retention_days: float = Field(default=400.0, ge=2)
    #: how often audit rows past their retention are deleted
    audit_prune_interval_s: float = Field(default=3600.0, gt=0)
    #: what /metrics shows without an operator's token: nothing (401), or only cluster-wide figures (no names)
    metrics_public: bool = False
    #: how long a dashboard session token (POST /api/v1/sessions) lives
    session_ttl_s: int = Field(default=12 * 3600, ge=60, le=7 * 86400)
    #: the key that wraps every organisation's data key (S9); default DATA_DIR/master.key, made 0600 at first start
    master_key_file: Path | None = None
    #: the Ed25519 key that signs launch and stop orders; default DATA_DIR/order-signing.key, made 0600 at first start.
    #: Control planes that take over from one another must use the same one (their agents pinned it).
    order_key_file: Path | None = None
    # The agent channel (RELIABILITY.md §4.2): a TLS 1.3 listener requiring client certificates from the agent CA
    # in DATA_DIR (ca.key, ca.crt). Port: default the API port + 1; 0 picks a free port (agents read it from
    # /readyz at every connect). Its certificate names 127.0.0.1, ::1, localhost, the host name and the host, plus
    # `agent_tls_names` (comma-separated DNS names or addresses agents dial). Client certificates live
    # `agent_cert_lifetime_s` (7 days) and are renewed over the channel at 2/3 of it.
    #: the agent channel's TLS port: default the API port + 1, 0 for any free port (agents read it from /readyz)
    agent_port: int | None = Field(default=None, ge=0, le=65535)
    #: more DNS names or addresses (comma-separated) for the channel's certificate: those agents dial
    agent_tls_names: str = ""
    #: how long an agent's client certificate lives; agents renew it at 2/3 of that
    agent_cert_lifetime_s: float = Field(default=7 * 86400.0, ge=5)
    #: image registries jobs may name although they are private, loopback or link-local addresses (S11):
    #: comma-separated "host" or "host:port" entries, IPv6 addresses in brackets
    registry_allow: str = ""
    #: bytes of one attempt's log the control plane keeps: the tail, with the cut marked (see server.joblogs)
    max_log_bytes_per_job: int = Field(default=100 << 20, ge=64 << 10)
    #: what a queue change whose guarantees exceed the pool's capacity (one queue's, or the top-level queues'
    #: together) gets: `warn` (made, the answer warns with the figures) or `refuse` (422 with the figures)
    quota_above_capacity: Literal["warn", "refuse"] = "warn"
    #: the ISO 4217 code of the currency prices are set in (cents are its hundredths); shown with every amount
    currency: str = Field(default="USD", pattern=r"^[A-Z]{3}$")

    # Kubernetes (docs: Operating: Kubernetes): with a kubeconfig the control plane also schedules the cluster's pods
    # whose spec.schedulerName is gpupool, in the same cycles as agents' jobs.
    #: a kubeconfig file whose cluster's pods gpupool schedules, or "in-cluster" (the pod's service account); empty:
    #: no Kubernetes
    kubeconfig: str = ""
    #: the organisation whose queues Kubernetes pods go to
    kube_org: str = "default"
    #: the queue of each namespace's pods without a gpupool.io/queue label, as comma-separated NAMESPACE=QUEUE
    #: (a namespace not named: the queue named as the namespace if there is one, else "default")
    kube_queues: str = ""

    @property
    def kube_queue_map(self) -> dict[str, str]:
        return dict(item.split("=", 1) for item in self.kube_queues.split(",") if item)

    @field_validator("kube_queues")
    @classmethod
    def _namespace_queues(cls, value: str) -> str:
        for item in filter(None, value.split(",")):
            namespace, _, queue = item.partition("=")
            if not re.fullmatch(r"[a-z0-9][a-z0-9.-]{0,62}", namespace) or not re.fullmatch(r"[A-Za-z0-9._-]{1,64}",
                                                                                             queue):
                raise ValueError(f"{item[:80]} is not NAMESPACE=QUEUE (a Kubernetes namespace, a queue name)")
        return value

    @field_validator("trusted_proxies")
    @classmethod
    def _networks(cls, value: str) -> str:
        for entry in filter(None, (e.strip() for e in value.split(","))):
            try:
                ipaddress.ip_network(entry, strict=False)
            except ValueError:
                raise ValueError(f"{entry!r} is not an IP address or CIDR network") from None
        return value

    @property
    def trusted_proxy_list(self) -> list[str]:
        return [e.strip() for e in self.trusted_proxies.split(",") if e.strip()]

    @model_validator(mode="after")
    def _timing(self) -> Settings:
        if self.max_disconnect_s + self.kill_grace_s >= self.lost_after_s:
            raise ValueError("max_disconnect_s + kill_grace_s must be below lost_after_s, or a lost node's job could "
                             "run twice")
        if self.suspect_after_s >= self.lost_after_s:
            raise ValueError("suspect_after_s must be below lost_after_s")
        if not self.lease_retry_s < self.lease_renew_s < self.lease_s:
            raise ValueError("need lease_retry_s < lease_renew_s < lease_s, or two schedulers could both lead")
        return self

    @property
    def requeue_margin_s(self) -> float:
        """How long after work's own max_disconnect it is requeued: its agent has surely stopped it by then."""
        return self.lost_after_s - self.max_disconnect_s

    def disconnect_limit_s(self, asked_s: float | None) -> float:
        """The max_disconnect that applies to work that asked for `asked_s` (None: the pool's): never above the
        pool's, which bounds how long a node is waited for."""
        return self.max_disconnect_s if asked_s is None else min(float(asked_s), self.max_disconnect_s)

    @property
    def master_key_path(self) -> Path:
        return self.master_key_file or self.data_dir / "master.key"

    @property
    def order_key_path(self) -> Path:
        return self.order_key_file or self.data_dir / "order-signing.key"

    @property
    def channel_port(self) -> int:
        """The agent channel's port as configured (0: any free one)."""
        if self.agent_port is not None:
            return self.agent_port
        return self.port + 1 if 0 < self.port < 65535 else 0

    @property
    def db_url(self) -> str:
        return self.database_url or f"sqlite:///{(self.data_dir / 'gpupool.db').resolve()}"

    @classmethod
    def from_env(cls, **overrides: object) -> Settings:
        """Settings from GPUPOOL_<NAME> variables, then `overrides` (CLI flags) on top."""
        values: dict[str, object] = {}
        for name in cls.model_fields:
            raw = os.environ.get(f"GPUPOOL_{name.upper()}")
            if raw is not None:
                values[name] = raw
        values.update({k: v for k, v in overrides.items() if v is not None})
        try:
            return cls(**values)
        except ValidationError as exc:
            raise ValueError(problems(exc)) from None


def problems(exc: ValidationError) -> str:
    """A settings ValidationError in one line: each problem with its setting and variable, no repr of the input."""
    found = []
    for error in exc.errors(include_url=False):
        message = str(error["msg"]).removeprefix("Value error, ")
        name = str(error["loc"][0]) if error["loc"] else ""
        found.append(f"{name} (GPUPOOL_{name.upper()}): {message}" if name else message)
    return "; ".join(found)
