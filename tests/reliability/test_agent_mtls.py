"""S7 of RELIABILITY.md §3.2, the mTLS cases, against a real control plane and real TLS sockets on loopback.

  1  TLS without a client certificate: the handshake fails (TLS 1.3: the server's "certificate required" alert
     ends it before any HTTP), while a certified client gets an HTTP answer on the same port;
  2  a certificate from another CA (for a real node id) or self-signed: the handshake fails;
  3  (identity binding) node A's certificate with node B's credential: 403 before the upgrade;
  7  `gpupool agent --ca-hash` of another CA: the agent refuses to join (exit 2, nothing saved); the right one joins;
  8  a revoked certificate (an operator reset the node, and it joined again): its open channel is closed at once and
     a new connection with it is refused (403); an expired one fails the handshake;
  9  certificates renewed over the live channels of real agents under load (short lifetimes): 0 nodes lost,
     0 jobs requeued, and an agent restarted after its first certificate expired reconnects with the renewed one.

The parts are marked in the CaseBook of test_agent_channel_security.py, which prints the S7 figure line.
"""

from __future__ import annotations

import json
import socket
import ssl
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from agent_cluster import SCALED, Cluster, wait_for
from test_agent_channel_security import CaseBook, book, join_token, registration  # noqa: F401 - `book` is a fixture
from websockets.exceptions import ConnectionClosed, InvalidStatus, WebSocketException

from gpupool.agent.tls import ChannelTls
from gpupool.devtools import hand_tls
from gpupool.devtools.hand_tls import HandTls, channel_url
from gpupool.protocol.tls import ca_hash
from gpupool.server.agent_ca import AgentCA

ENV = {"GPUPOOL_HEARTBEAT_S": "0.5", "GPUPOOL_SUSPECT_AFTER_S": "3000", "GPUPOOL_LOST_AFTER_S": "3600",
       "GPUPOOL_MAX_DISCONNECT_S": "30", "GPUPOOL_KILL_GRACE_S": "1", "GPUPOOL_CYCLE_INTERVAL_S": "0.1"}


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    with Cluster(tmp_path_factory.mktemp("mtls"), env=dict(ENV)) as c:
        yield c
    assert c.violations == []


class Node:
    """A node registered by hand with a CSR: its credential, certificate and client context."""

    def __init__(self, cluster: Cluster, name: str | None = None, tls: HandTls | None = None) -> None:
        self.name = name or f"tls-{uuid.uuid4().hex[:8]}"
        self.tls = tls or HandTls()
        body = registration(join_token(cluster), self.name, 0, "none", self.tls.csr(self.name))
        response = httpx.post(f"{cluster.url}/api/v1/agent/register", json=body, timeout=30)
        assert response.status_code == 200, response.text
        self.reply: dict[str, Any] = response.json()
        self.credential, self.node_id = self.reply["credential"], self.reply["node_id"]
        self.context = self.tls.context(self.reply)


def open_channel(cluster: Cluster, credential: str, context: ssl.SSLContext) -> Any:
    """As an agent opens it (`hand_tls.open_channel`)."""
    assert cluster.server is not None
    return hand_tls.open_channel(cluster.server, context, credential, open_timeout=15)


def hello_acked(ws: Any) -> bool:
    ws.send(json.dumps({"type": "hello", "boot_id": uuid.uuid4().hex, "seq": 0, "running": []}))
    deadline = time.monotonic() + 15
    while time.monotonic() < deadline:
        frame = json.loads(ws.recv(timeout=15))
        if frame["type"] == "ack" and frame["seq"] == 0:
            return True
    return False


def exchange(cluster: Cluster, context: ssl.SSLContext) -> bytes:
    """One raw TLS connection to the channel port: an HTTP request, and the first bytes of the answer."""
    port = int(channel_url(cluster.url).split(":")[2].split("/")[0])
    with socket.create_connection(("127.0.0.1", port), timeout=15) as raw, \
            context.wrap_socket(raw, server_hostname="127.0.0.1") as tls:
        tls.sendall(b"GET /api/v1/agent/channel HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n")
        return tls.recv(64)


def trusting(ca_pem: str) -> ssl.SSLContext:
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    context.load_verify_locations(cadata=ca_pem)
    return context


def refused_handshake(cluster: Cluster, context: ssl.SSLContext) -> str:
    with pytest.raises((ssl.SSLError, ConnectionResetError, BrokenPipeError)) as failed:
        got = exchange(cluster, context)
        if got == b"":  # closed without a word: count it as the failure it is
            raise ConnectionResetError("closed")
    return str(failed.value)


# cases 1 and 2: who may complete a handshake -------------------------------------------------------------------------


def test_tls_without_a_client_certificate_fails_the_handshake(cluster: Cluster, book: CaseBook) -> None:  # noqa: F811
    with book.part("mtls_no_cert"):
        node = Node(cluster)
        assert exchange(cluster, node.context).startswith(b"HTTP/1.1 401")  # certified, no credential: HTTP
        reason = refused_handshake(cluster, trusting(node.reply["ca_certificate"]))
        assert "CERTIFICATE_REQUIRED" in reason.upper() or "closed" in reason or "reset" in reason.lower()
        with pytest.raises((ssl.SSLError, WebSocketException, OSError)):
            open_channel(cluster, node.credential, trusting(node.reply["ca_certificate"])).close()


def test_a_certificate_from_another_ca_fails_the_handshake(cluster: Cluster, tmp_path: Path,
                                                           book: CaseBook) -> None:  # noqa: F811
    with book.part("mtls_other_ca"):
        node = Node(cluster)
        impostor = AgentCA.load_or_create(tmp_path / "other-ca")
        assert impostor.hash != ca_hash(node.reply["ca_certificate"])
        forged = impostor.issue(node.tls.csr(node.name), node.node_id, 3600)  # the right node, the wrong CA
        context = ChannelTls(node.tls.key, forged.pem, node.reply["ca_certificate"]).context()
        reason = refused_handshake(cluster, context)
        assert "UNKNOWN_CA" in reason.upper() or "closed" in reason or "reset" in reason.lower()
        with pytest.raises((ssl.SSLError, WebSocketException, OSError)):
            open_channel(cluster, node.credential, context).close()
        with open_channel(cluster, node.credential, node.context) as ws:  # its own certificate works
            assert hello_acked(ws)


def test_no_session_resumes_so_every_connection_shows_its_certificate(cluster: Cluster) -> None:  # noqa: F811
    node = Node(cluster)
    with open_channel(cluster, node.credential, node.context) as ws:
        assert hello_acked(ws)  # a TLS 1.3 server sends its tickets after the handshake: read past them
        tls = ws.socket
        assert isinstance(tls, ssl.SSLSocket) and tls.version() == "TLSv1.3"
        assert tls.session is not None and not tls.session.has_ticket


# case 3 (binding) and case 8: whose certificate, and still valid? -----------------------------------------------------


def test_a_certificate_opens_only_its_own_nodes_channel(cluster: Cluster, book: CaseBook) -> None:  # noqa: F811
    with book.part("mtls_swapped"):
        a, b = Node(cluster), Node(cluster)
        for credential, context in ((b.credential, a.context), (a.credential, b.context)):
            with pytest.raises(InvalidStatus) as refused:
                open_channel(cluster, credential, context).close()
            assert refused.value.response.status_code == 403
        with pytest.raises(InvalidStatus) as refused:  # a user's token is no node's credential
            open_channel(cluster, cluster.server.token, a.context).close()
        assert refused.value.response.status_code == 403
        with open_channel(cluster, a.credential, a.context) as ws:
            assert hello_acked(ws)


def test_a_revoked_certificate_is_cut_off_and_refused(cluster: Cluster, book: CaseBook) -> None:  # noqa: F811
    with book.part("mtls_revoked"):
        first = Node(cluster)
        with open_channel(cluster, first.credential, first.context) as ws:
            assert hello_acked(ws)
            started = time.monotonic()
            reset = cluster.api.post(f"/nodes/{first.name}/reset")  # the first certificate goes on the denylist
            assert reset.status_code == 200, reset.text
            with pytest.raises(ConnectionClosed) as closed:
                while True:
                    ws.recv(timeout=10)
            assert closed.value.rcvd is not None and closed.value.rcvd.code == 4403
            assert time.monotonic() - started < 5  # the session kill, not a timeout
        again = Node(cluster, first.name)  # a fresh join token takes the reset name
        assert again.node_id == first.node_id
        for credential, status in ((first.credential, 401), (again.credential, 403)):  # revoked with the node
            with pytest.raises(InvalidStatus) as refused:
                open_channel(cluster, credential, first.context).close()
            assert refused.value.response.status_code == status
        with open_channel(cluster, again.credential, again.context) as fresh:
            assert hello_acked(fresh)


def test_an_expired_certificate_fails_the_handshake(cluster: Cluster, book: CaseBook) -> None:  # noqa: F811
    with book.part("mtls_expired"):
        node = Node(cluster)
        ca = AgentCA.load_or_create(cluster.server.data_dir)
        short = ca.issue(node.tls.csr(node.name), node.node_id, 1.0)
        time.sleep(1.5)
        context = ChannelTls(node.tls.key, short.pem, node.reply["ca_certificate"]).context()
        reason = refused_handshake(cluster, context)
        assert "EXPIRED" in reason.upper() or "closed" in reason or "reset" in reason.lower()


# case 7: the CA pin --------------------------------------------------------------------------------------------------


def test_the_agent_refuses_a_control_plane_whose_ca_is_not_pinned(cluster: Cluster, tmp_path: Path,
                                                                   book: CaseBook) -> None:  # noqa: F811
    with book.part("mtls_ca_pin"):
        created = cluster.api.post("/join-tokens", json={"ttl_s": 600}).json()
        real = ca_hash((cluster.server.data_dir / "ca.crt").read_text())
        assert created["ca_hash"] == real  # what `gpupool join-token create` prints
        other = AgentCA.load_or_create(tmp_path / "other-ca").hash
        for name, pin, joins in ((f"ca-wrong-{uuid.uuid4().hex[:6]}", other, False),
                                 (f"ca-right-{uuid.uuid4().hex[:6]}", real, True)):
            agent = cluster.start_agent(name, "", extra=("--ca-hash", pin))  # stopped with the cluster
            if joins:
                cluster.wait_ready([name])
                wait_for((agent.data_dir / "node.json").exists, 30, "the agent to save its identity")
                identity = json.loads((agent.data_dir / "node.json").read_text())
                assert ca_hash(identity["ca_certificate"]) == real and "PRIVATE KEY" in identity["tls_key"]
                assert (agent.data_dir / "node.json").stat().st_mode & 0o077 == 0
            else:
                assert agent.wait(60) == 2
                assert "refusing to join" in agent.log() and other in agent.log()
                assert not (agent.data_dir / "node.json").exists()


# case 9: renewal under load ------------------------------------------------------------------------------------------

LIFETIME_S = 6.0


def test_certificates_renew_under_load_and_no_node_is_lost(tmp_path: Path, book: CaseBook) -> None:  # noqa: F811
    env = {**SCALED, "GPUPOOL_AGENT_CERT_LIFETIME_S": str(LIFETIME_S)}
    with book.part("mtls_renewal"), Cluster(tmp_path, env=env) as cluster:
        names = [f"renew{i}" for i in range(3)]
        agents = [cluster.start_agent(name, "2xA100-80GB") for name in names]
        cluster.wait_ready(names)
        for a in agents:  # a node can be ready a moment before its agent has written node.json
            wait_for((a.data_dir / "node.json").exists, 30, "the agent to save its identity")
        first = {a.name: json.loads((a.data_dir / "node.json").read_text())["certificate"] for a in agents}
        long_jobs = [cluster.submit(command=["sleep", "120"], gpus="1") for _ in range(4)]
        for job_id in long_jobs:
            cluster.wait_job(job_id, ("running",))
        short_jobs: list[str] = []
        seen = {a.name: {first[a.name]} for a in agents}
        deadline = time.monotonic() + 3 * LIFETIME_S
        while time.monotonic() < deadline:  # load: a stream of short jobs while every certificate renews
            short_jobs.append(cluster.submit(command=["true"], gpus="0.5"))
            for a in agents:
                seen[a.name].add(json.loads((a.data_dir / "node.json").read_text())["certificate"])
            time.sleep(0.25)
        assert all(len(certs) >= 3 for certs in seen.values()), {n: len(c) for n, c in seen.items()}
        for job_id in short_jobs:
            assert cluster.wait_job(job_id, timeout_s=60)["state"] == "succeeded"
        for job_id in long_jobs:
            job = cluster.job(job_id)
            assert job["state"] == "running" and job["attempt"] == 1, cluster.events(job_id)  # never requeued
            cluster.api.post(f"/jobs/{job_id}/cancel")
        assert {n["state"] for n in cluster.nodes().values()} == {"ready"}
        lost = [e for j in long_jobs + short_jobs for e in cluster.events(j) if "lost" in e["message"]]
        assert lost == []
        assert "channel refused" not in cluster.server.log_path.read_text()

        restarted = agents[0]  # its registration certificate expired long ago: the renewed one must open the channel
        # stop it just after a renewal, so the restart has the certificate's whole lifetime to reconnect in (a restart
        # took 3.3 s on a busy 2-core machine; stopped just before a renewal, it had 3.5 s left and once ran out)
        saved = restarted.data_dir / "node.json"
        before = json.loads(saved.read_text())["certificate"]
        wait_for(lambda: json.loads(saved.read_text())["certificate"] != before, 2 * LIFETIME_S, "a renewal")
        restarted.signal(15)
        restarted.wait()
        cluster.start_agent(restarted.name, restarted.fake_gpus, join=False)
        time.sleep(LIFETIME_S)  # past the lost grace (3 s): only heartbeats over the channel keep the node ready
        assert restarted.alive and cluster.nodes()[restarted.name]["state"] == "ready"
        assert "channel to" not in restarted.log().rsplit("adopted", 1)[-1]  # no failed connection since
