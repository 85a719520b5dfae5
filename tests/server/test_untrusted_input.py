"""Outbound requests and untrusted input (RELIABILITY.md §3.2 S11).

gpupool itself requests nothing outbound; the one outbound fetch it causes is the image pull of a job with an
image (podman on the node). So image references are validated at the API: a well-formed OCI reference, and no
registry host that is a loopback, private, link-local (cloud metadata) or otherwise non-global address literal,
unless an operator allows the host with GPUPOOL_REGISTRY_ALLOW. Agent reports are untrusted input too: every
field of every frame an agent sends is bounded (numbers from both sides, strings and lists in length).
"""

from __future__ import annotations

import types
import typing
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import annotated_types
import pytest
from pydantic import BaseModel, ValidationError
from pydantic.fields import FieldInfo

from gpupool.agent.runtime.base import LaunchSpec, RunHandle
from gpupool.agent.runtime.container import podman_argv
from gpupool.agent.runtime.process import EXIT_FILE, read_exit_code
from gpupool.devtools.figures import figure
from gpupool.devtools.harness import Server, start_server, stop_server
from gpupool.protocol import agent, api, devices

ALLOWED = "10.1.2.3:5000,[fd00::5]"
GOOD = ["alpine", "alpine:3.20", "library/alpine", "docker.io/library/alpine:3", "ghcr.io/acme/train:v1.2-rc.1",
        "registry.example.com:5000/team/train@sha256:" + "a" * 64, "localhost.example.com/x",
        "10.1.2.3:5000/team/train:1", "[fd00::5]:443/team/train", "8.8.8.8/team/x"]
MALFORMED = ["", "Alpine", "alpine:", "alpine@sha256:abc", "https://registry.example.com/x", "--privileged",
             "-v", "a//b", "a b", "a:tag with space", "registry.example.com/x/", "x" * 300, "a:" + "t" * 129,
             "ex\u00e4mple.com/x", "a\x00b", "registry..example.com/x", "[::1/x"]
PRIVATE = ["127.0.0.1/x", "127.1.2.3:5000/x", "localhost/x", "localhost:5000/x", "169.254.169.254/latest",
           "10.0.0.1/x", "172.16.5.4/x", "172.31.255.255/x", "192.168.1.1:5000/x", "[::1]/x", "[::1]:5000/x",
           "[fc00::1]/x", "[fd12:3456::1]/x", "[fe80::1]/x", "[::ffff:127.0.0.1]/x", "[::ffff:169.254.169.254]/x",
           "0.0.0.0/x", "100.64.0.1/x", "0177.0.0.1/x", "0x7f.0.0.1/x", "2130706433.0/x", "10.1.2.3:6000/x",
           "metadata.google.internal/x", "app.localhost/x"]


@pytest.fixture(scope="module")
def guarded(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    server = start_server(tmp_path_factory.mktemp("s11") / "data", env={"GPUPOOL_REGISTRY_ALLOW": ALLOWED})
    yield server
    stop_server(server)


def _submit(server: Server, image: str) -> tuple[int, list[dict[str, Any]]]:
    with server.client() as c:
        response = c.post("/jobs", json={"command": ["true"], "gpus": "0.1", "image": image})
    body = response.json()
    return response.status_code, body.get("detail", []) if response.status_code == 422 else []


def _names_image(errors: list[dict[str, Any]]) -> bool:
    return [e["loc"] for e in errors] == [["body", "image"]]


def image_cases(guarded: Server) -> tuple[int, list[str]]:
    """(rejected count, problems) over MALFORMED + PRIVATE through the live API, and GOOD accepted."""
    problems, rejected = [], 0
    for image in MALFORMED + PRIVATE:
        status, errors = _submit(guarded, image)
        if status == 422 and _names_image(errors):
            rejected += 1
        else:
            problems.append(f"{image!r} answered {status} {errors}")
    for image in GOOD:
        status, errors = _submit(guarded, image)
        if status != 201:
            problems.append(f"{image!r} refused: {status} {errors}")
    return rejected, problems


def test_image_references_are_well_formed_and_name_no_private_registry(guarded: Server) -> None:
    rejected, problems = image_cases(guarded)
    bounded, unbounded = report_fields()
    figure(f"S11 image_refs_rejected={rejected}/{len(MALFORMED) + len(PRIVATE)} (malformed={len(MALFORMED)} "
           f"private={len(PRIVATE)}; accepted={len(GOOD) - sum(1 for p in problems if 'refused' in p)}/{len(GOOD)}) "
           f"report_fields_bounded={bounded}/{bounded + len(unbounded)} report_timestamps=none")
    assert problems == []
    assert unbounded == []


def test_the_allow_list_matches_host_or_host_and_port() -> None:
    allow = api.registry_allow("10.1.2.3:5000, [fd00::5] ,registry.internal")
    assert api.registry_problem("10.1.2.3:5000/x", allow) is None
    assert api.registry_problem("10.1.2.3/x", allow) is not None, "the entry names a port"
    assert api.registry_problem("[fd00::5]:8443/x", allow) is None
    assert api.registry_problem("registry.internal:5000/x", allow) is None
    assert "169.254.169.254" in (api.registry_problem("169.254.169.254/x", allow) or "")


def test_an_agent_refuses_an_image_that_is_not_a_reference(tmp_path: Path) -> None:
    """Orders are signed, but an image like "--privileged" must never reach podman's option parser."""
    for image in ("--privileged", "-v=/:/host", "alpine --network=host"):
        with pytest.raises(ValueError, match="image"):
            podman_argv("podman", LaunchSpec("a", 0, "j", ("true",), image=image), (), cdi=False)


# agent reports -------------------------------------------------------------------------------------------------

AGENT_SENDS: tuple[type[BaseModel], ...] = (agent.Registration, agent.Hello, agent.RunningReport, agent.Heartbeat,
                                            agent.TaskStatus, agent.LogChunk, agent.Renew, devices.GpuInfo,
                                            devices.MigInstance, devices.GpuTelemetry)


def _metadata(annotation: Any, metadata: list[Any]) -> tuple[Any, list[Any]]:
    """The bare type of `annotation` (Optional and Annotated removed) and its constraints."""
    found = list(metadata)
    while True:
        origin = typing.get_origin(annotation)
        if origin is typing.Annotated:
            annotation, *extra = typing.get_args(annotation)
            found += [m for e in extra for m in (e.metadata if isinstance(e, FieldInfo) else [e])]
        elif origin in (typing.Union, types.UnionType):
            annotation = next(a for a in typing.get_args(annotation) if a is not type(None))
        else:
            return annotation, found


def _has(metadata: list[Any], *kinds: type) -> bool:
    return any(isinstance(m, kinds) for m in metadata)


def _problems(name: str, annotation: Any, metadata: list[Any]) -> list[str]:
    """Why a field of this type and these constraints is unbounded ([] when bounded)."""
    bare, found = _metadata(annotation, metadata)
    origin = typing.get_origin(bare)
    if origin is list:
        item = typing.get_args(bare)[0]
        own = [] if _has(found, annotated_types.MaxLen) else [f"{name}: list without max_length"]
        return own + _problems(f"{name}[]", item, [])
    if origin is typing.Literal or bare is bool or (isinstance(bare, type) and issubclass(bare, BaseModel)):
        return []
    if bare in (int, float):
        low = _has(found, annotated_types.Ge, annotated_types.Gt)
        high = _has(found, annotated_types.Le, annotated_types.Lt)
        return [] if low and high else [f"{name}: number without {'lower' if not low else 'upper'} bound"]
    if bare is str:
        return [] if _has(found, annotated_types.MaxLen) else [f"{name}: string without max_length"]
    return [f"{name}: unchecked type {bare}"]


def report_fields() -> tuple[int, list[str]]:
    """(bounded fields, problems) over every field of every model an agent sends."""
    bounded, problems = 0, []
    for model in AGENT_SENDS:
        for name, info in model.model_fields.items():
            found = _problems(f"{model.__name__}.{name}", info.annotation, info.metadata)
            problems += found
            bounded += not found
    return bounded, problems


def test_every_field_an_agent_sends_is_bounded() -> None:
    bounded, problems = report_fields()
    assert problems == [], "\n".join(problems)
    assert bounded >= 50


@pytest.mark.parametrize(("model", "fields"), [
    (devices.GpuTelemetry, {"uuid": "GPU-1", "utilization_pct": 101, "memory_used_mib": 0}),
    (devices.GpuTelemetry, {"uuid": "GPU-1", "utilization_pct": 5, "memory_used_mib": -1}),
    (devices.GpuTelemetry, {"uuid": "GPU-1", "utilization_pct": 5, "memory_used_mib": 0, "temperature_c": 1000}),
    (devices.GpuTelemetry, {"uuid": "GPU-1", "utilization_pct": 5, "memory_used_mib": 0, "xid_errors": [79] * 65}),
    (agent.TaskStatus, {"boot_id": "b", "seq": 1, "allocation_id": "a", "attempt": 0, "state": "exited",
                        "exit_code": 1 << 40}),
    (agent.TaskStatus, {"boot_id": "b", "seq": 1, "allocation_id": "a", "attempt": 1 << 40, "state": "exited"}),
    (agent.Heartbeat, {"boot_id": "b", "seq": 1, "idle_gpus": ["x" * 1000]}),
    (agent.Hello, {"boot_id": "b", "seq": 1, "running": [{"allocation_id": "a", "attempt": 0, "state": "running",
                                                          "pid": -5}]}),
    (agent.Registration, {"join_token": "abcdef.0123", "name": "n", "boot_id": "b", "cpu_milli": 1 << 40,
                          "memory_mib": 1}),
], ids=["utilisation>100", "memory<0", "temperature", "xids", "exit_code", "attempt", "idle uuid", "pid", "cpu"])
def test_out_of_range_reports_are_refused(model: type[BaseModel], fields: dict[str, Any]) -> None:
    with pytest.raises(ValidationError):
        model.model_validate(fields)


@pytest.mark.parametrize(("written", "read"), [("0", 0), ("137", 137), ("255", 255), ("256", None),
                                               ("99999999999", None), ("-1", None), ("x", None)])
def test_an_agent_reads_only_shell_exit_codes_from_a_workload_folder(tmp_path: Path, written: str,
                                                                     read: int | None) -> None:
    """A process workload can write its own exit-code file; what it writes must not make the agent send a report
    the control plane refuses (or could not store)."""
    (tmp_path / EXIT_FILE).write_text(written + "\n")
    handle = RunHandle("a", 0, 1, 0.0, tmp_path / "output.log", state_dir=tmp_path)
    assert read_exit_code(handle) == read
