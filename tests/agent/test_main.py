"""The agent entry point's pieces: saved identity, machine resources, registration, early exits of run_agent."""

from __future__ import annotations

import asyncio
import dataclasses
import os
import re

import pytest

from gpupool.agent.devices import FakeDiscovery
from gpupool.agent.main import (
    EXIT_CONFIG,
    EXIT_CREDENTIAL,
    NODE_FILE,
    JobSetup,
    NodeIdentity,
    announce,
    build_registration,
    default_node_name,
    load_identity,
    machine_resources,
    new_boot_id,
    obtain_identity,
    read_join_token,
    run_agent,
    save_identity,
    split_servers,
)
from gpupool.agent.runtime.identity import AgentUser, RootUser

IDENTITY = NodeIdentity(
    server="http://cp:8080", name="n1", node_id="node-1", credential="secret", heartbeat_s=5.0, fence_s=40.0,
    order_key="A" * 43 + "=",
)


def test_identity_round_trips_with_private_permissions(tmp_path):
    save_identity(tmp_path, IDENTITY)
    assert (tmp_path / NODE_FILE).stat().st_mode & 0o777 == 0o600
    assert load_identity(tmp_path) == IDENTITY


def test_a_corrupt_identity_is_ignored(tmp_path):
    assert load_identity(tmp_path) is None
    (tmp_path / NODE_FILE).write_text("{broken")
    assert load_identity(tmp_path) is None


def test_server_takes_one_control_plane_or_several():
    assert split_servers("http://a:8181") == ["http://a:8181"]
    assert split_servers(" http://a:8181, https://b:8181 ,") == ["http://a:8181", "https://b:8181"]
    with pytest.raises(ValueError, match="--server"):
        split_servers(" , ")
    with pytest.raises(ValueError, match="bad control-plane URL 'ftp://a'"):
        split_servers("http://a:8181,ftp://a")


def test_a_saved_identity_skips_registration(tmp_path):
    save_identity(tmp_path, IDENTITY)
    got = asyncio.run(obtain_identity(["http://cp:8080"], None, tmp_path, None, asyncio.Event()))
    assert got == IDENTITY


def test_no_identity_and_no_token_is_a_configuration_error(tmp_path, job_root):
    with pytest.raises(ValueError, match="join token"):
        asyncio.run(obtain_identity(["http://cp:8080"], None, tmp_path, None, asyncio.Event()))
    data = tmp_path / "data"
    assert run_agent("http://127.0.0.1:9", None, data, "n1", "", work_dir=job_root / "work") == EXIT_CONFIG
    assert (tmp_path / "data").stat().st_mode & 0o777 == 0o700


def test_machine_resources(tmp_path):
    meminfo = tmp_path / "meminfo"
    meminfo.write_text("MemTotal:       16384000 kB\nMemFree:          100 kB\n")
    cpu_milli, memory_mib = machine_resources(meminfo)
    assert cpu_milli % 1000 == 0 and cpu_milli >= 1000
    assert memory_mib == 16000
    assert machine_resources(tmp_path / "missing")[1] == 0


def test_registration_describes_this_machine_and_its_gpus(tmp_path):
    discovery = FakeDiscovery("2xH100", node="n1")
    reg = build_registration("abcdef.0123456789abcdef", "n1", "boot", discovery, JobSetup(AgentUser(), tmp_path))
    assert [g.uuid for g in reg.gpus] == [g.uuid for g in discovery.list_devices()]
    assert reg.cpu_milli > 0 and reg.name == "n1" and reg.boot_id == "boot"
    assert reg.jobs_as == "agent-user"


@pytest.mark.parametrize(
    ("flags", "want_in_log"),
    [
        ({"run_jobs_as": "nobody"}, "--run-jobs-as 'nobody': must be one of dynamic-uid, local-user, root"),
        ({"job_uid_range": "61184"}, "--job-uid-range '61184': must be FIRST-LAST"),
        ({"job_uid_range": "0-100"}, "--job-uid-range '0-100': needs 1 <= FIRST <= LAST"),
        ({"job_uid_range": "65000-65534"}, "--job-uid-range '65000-65534': holds 65534"),
        ({"job_uid_range": "70000-60000"}, "--job-uid-range '70000-60000': needs 1 <= FIRST <= LAST"),
    ],
    ids=["unknown-mode", "one-number", "holds-root", "holds-nobody", "reversed"],
)
def test_bad_job_flags_stop_the_agent_before_it_registers(tmp_path, job_root, caplog, flags, want_in_log):
    token = "abcdef.0123456789abcdef"  # never spent: the flags are checked first
    assert run_agent("http://127.0.0.1:9", token, tmp_path, "n1", "", work_dir=job_root / "w", **flags) == EXIT_CONFIG
    assert want_in_log in caplog.text


def test_an_agent_that_cannot_switch_users_says_its_jobs_run_as_itself(tmp_path, caplog):
    announce(JobSetup(AgentUser(), tmp_path))
    assert "does not run as root, so process jobs run as its own user" in caplog.text
    announce(JobSetup(RootUser(), tmp_path))
    assert "process jobs run as ROOT (--run-jobs-as root)" in caplog.text


@pytest.mark.skipif(os.geteuid() != 0, reason="only an agent running as root gives jobs other uids")
def test_a_work_root_other_users_cannot_reach_stops_the_agent(tmp_path, caplog):
    # tmp_path lies under pytest's 0700 folder: a job running as a transient uid could never enter its work folder
    assert run_agent("http://127.0.0.1:9", None, tmp_path / "data", "n1", "", work_dir=tmp_path / "w") == EXIT_CONFIG
    assert f"--work-dir {tmp_path / 'w'}: jobs run as other users, who cannot pass" in caplog.text


def test_names_and_boot_ids():
    assert re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9._-]*", default_node_name())
    assert new_boot_id() != new_boot_id()


def test_a_saved_identity_without_a_pinned_order_key_is_refused(tmp_path, job_root):
    """A node.json from before signed orders pins no key: the agent stops (exit 3) rather than run unverified."""
    save_identity(tmp_path, dataclasses.replace(IDENTITY, order_key=""))
    assert run_agent("http://cp:8080", None, tmp_path, "n1", "", work_dir=job_root / "work") == EXIT_CREDENTIAL



def test_the_join_token_comes_from_the_option_the_variable_or_a_file(tmp_path):
    path = tmp_path / "join.token"
    path.write_text("abc.def\n")
    assert read_join_token("abc.def", None) == "abc.def"
    assert read_join_token(None, path) == "abc.def"
    assert read_join_token(None, None) is None
    with pytest.raises(ValueError, match="--join-token-file: a join token is also given"):
        read_join_token("abc.def", path)
    with pytest.raises(ValueError, match=r"--join-token-file .*missing.*cannot read it"):
        read_join_token(None, tmp_path / "missing")
    path.write_text("\n")
    with pytest.raises(ValueError, match="the file is empty"):
        read_join_token(None, path)


def test_gpupool_agent_reads_the_join_token_from_its_variable(tmp_path, monkeypatch):
    """`gpupool agent` takes $GPUPOOL_JOIN_TOKEN as --join-token (off the command line `ps` shows)."""
    from typer.testing import CliRunner

    from gpupool.cli.main import app

    seen = {}
    monkeypatch.setattr("gpupool.agent.main.run_agent", lambda server, token, *a, **k: seen.setdefault("t", token))
    result = CliRunner().invoke(app, ["agent", "--server", "http://cp", "--data-dir", str(tmp_path)],
                                env={"GPUPOOL_JOIN_TOKEN": "from.env"})
    assert seen == {"t": "from.env"}, result.output
    both = CliRunner().invoke(app, ["agent", "--server", "http://cp", "--join-token-file", str(tmp_path / "f")],
                              env={"GPUPOOL_JOIN_TOKEN": "from.env"})
    assert both.exit_code == EXIT_CONFIG and "--join-token-file" in both.output
