from __future__ import annotations

import contextlib
import os
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from gpupool.devtools import cli_output
from gpupool.devtools.figures import Parts, figure, session_folder

REPO = Path(__file__).resolve().parents[1]


def shared_dir() -> Path:
    """The read-only shared material: $GPUPOOL_SHARED, else ../shared next to the repo, else /work/shared."""
    for candidate in (os.environ.get("GPUPOOL_SHARED"), REPO.parent / "shared", "/work/shared"):
        if candidate and (Path(candidate) / "traces").is_dir():
            return Path(candidate)
    return REPO.parent / "shared"


OPENB = shared_dir() / "traces" / "alibaba-gpu-v2023"


@pytest.fixture(scope="session")
def openb() -> Path:
    if not (OPENB / "openb_node_list_gpu_node.csv").is_file():
        pytest.skip(f"shared openb trace not found at {OPENB}")
    return OPENB


# S8 of RELIABILITY.md §3.2, CPU tier: its cases live in tests/agent, tests/server and tests/core; one figure line ----

S8_CASES = {  # case -> the parts (tests) it takes
    "runtime spec": ("runtime_spec",),
    "visible devices": ("visible_devices",),
    "toolkit gate": ("toolkit_gate_agent", "toolkit_gate_scheduler"),
    "sharing within one tenant": ("share_groups",),
}


class PartBook:
    """Each test of a figure recorded in parts leaves its part with `part` (passed or not, with its numbers); the test
    that records the last part prints the figure line (`line`), on whichever xdist worker it runs."""

    def __init__(self, parts: Parts) -> None:
        self.parts = parts

    @contextlib.contextmanager
    def part(self, name: str) -> Iterator[dict[str, Any]]:
        """Record `name` as passed when the block ends normally, failed when it raises; the numbers the block
        leaves in the yielded dict go with it."""
        numbers: dict[str, Any] = {}
        passed = False
        try:
            yield numbers
            passed = True
        finally:
            found = self.parts.add(name, passed=passed, **numbers)
            if found is not None:
                figure(self.line(found))

    @staticmethod
    def line(found: dict[str, dict[str, Any]]) -> str:
        raise NotImplementedError


class S8Book(PartBook):
    """The S8 figure's parts; its tests record them with `case`."""

    case = PartBook.part

    @staticmethod
    def line(found: dict[str, dict[str, Any]]) -> str:
        passed = [case for case, parts in S8_CASES.items() if all(found[p]["passed"] for p in parts)]
        shares = found["share_groups"]
        failed = ",".join(sorted(set(S8_CASES) - set(passed))) or "none"
        device = "see S8d (tests/agent/test_gpu_visibility.py)" if shutil.which("nvidia-smi") else "not run: no device"
        return (f"S8  cpu-tier cases={len(passed)}/{len(S8_CASES)} cross_tenant_coresidency="
                f"{shares.get('coresident', '?')}/{shares.get('placements', '?')} failed={failed} ; "
                f"device-tier {device}")


@pytest.fixture(scope="session")
def s8(tmp_path_factory: pytest.TempPathFactory, worker_id: str) -> S8Book:
    folder = session_folder(tmp_path_factory.getbasetemp(), worker_id, "s8-parts")
    return S8Book(Parts(folder, [part for parts in S8_CASES.values() for part in parts]))


# S18 (issue 41, findings 18, 19, 9): hostile trace files in tests/sim, CSV injection in tests/sim and tests/server,
# the job log cap in tests/server; one figure line ----------------------------------------------------------------

S18_PARTS = ("traces", "fuzz", "csv_sim", "csv_server", "log")


class S18Book:
    """Each S18 test leaves its numbers with `add`; the one that leaves the last part prints the S18 line."""

    def __init__(self, parts: Parts) -> None:
        self.parts = parts

    def add(self, part: str, **numbers: Any) -> None:
        found = self.parts.add(part, **numbers)
        if found is not None:
            figure(self.line(found))

    @staticmethod
    def line(found: dict[str, dict[str, Any]]) -> str:
        traces, log = found["traces"], found["log"]
        cells = sum(p["cells"] for p in (found["csv_sim"], found["csv_server"]))
        neutralised = sum(p["neutralised"] for p in (found["csv_sim"], found["csv_server"]))
        return (f"S18 hostile_traces={traces['cases']} ended_within_10s={traces['ended']}/{traces['cases']} "
                f"file_line_errors={traces['file_line']}/{traces['cases']} peak_rss_mb={traces['peak_rss_mb']} "
                f"fuzz_examples={found['fuzz']['examples']} "
                f"csv_cells_neutralised={neutralised}/{cells} "
                f"log_cap_bytes={log['cap_bytes']} log_kept_tail={log['kept_tail']}")


@pytest.fixture(scope="session")
def s18(tmp_path_factory: pytest.TempPathFactory, worker_id: str) -> S18Book:
    return S18Book(Parts(session_folder(tmp_path_factory.getbasetemp(), worker_id, "s18-parts"), S18_PARTS))


@pytest.hookimpl(trylast=True)
def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Modules with slow tests first, each module's tests kept together and in order: under xdist the long
    end-to-end tests then start early and the many short ones fill in at the end, instead of one long test
    running alone while the other worker has nothing left."""
    slow = {item.module for item in items if item.get_closest_marker("slow")}
    items.sort(key=lambda item: item.module not in slow)


# S16 (issue 41: the API guard, the audit log, /metrics, the dashboard's headers and sessions): its parts come from
# tests/server/test_api_guard.py and tests/dashboard/test_dashboard_guard.py; one figure line ----------------------

S16_PARTS = ("audit", "lockout", "scheme", "slow", "request_id", "metrics_anon", "queue_gauges_pending",
             "queue_gauges_allocated", "headers", "logout")


class S16Book(PartBook):
    """The S16 figure's parts."""

    @staticmethod
    def line(found: dict[str, dict[str, Any]]) -> str:
        def get(part: str, key: str) -> Any:
            return found[part].get(key, "?")
        gauges = all(found[p]["passed"] for p in ("queue_gauges_pending", "queue_gauges_allocated"))
        failed = ",".join(name for name in S16_PARTS if not found[name]["passed"]) or "none"
        return (f"S16 audit_rows_from_anon={get('audit', 'audit_rows_from_anon')} (bound {get('audit', 'bound')}) "
                f"lockout_blocks_valid_token={get('lockout', 'lockout_blocks_valid_token')} "
                f"scheme_buckets={get('scheme', 'scheme_buckets')} slow_body_cut_s={get('slow', 'slow_body_cut_s')} "
                f"client_request_id_stored_as_id={get('request_id', 'client_request_id_stored_as_id')} "
                f"metrics_anon_org_names={get('metrics_anon', 'metrics_anon_org_names')} "
                f"queue_gauges_filled={'ok' if gauges else 'FAIL'} headers_missing={get('headers', 'headers_missing')} "
                f"token_after_logout={get('logout', 'token_after_logout')} failed={failed}")


@pytest.fixture(scope="session")
def s16(tmp_path_factory: pytest.TempPathFactory, worker_id: str) -> S16Book:
    return S16Book(Parts(session_folder(tmp_path_factory.getbasetemp(), worker_id, "s16-parts"), S16_PARTS))


# Issue 43: no Python repr or traceback reaches a user of the CLI. Every test's `gpupool` runs (a subprocess of
# gpupool.cli.main or the `gpupool` script, or Typer's CliRunner) are checked, unless run with --debug ------------

def _is_cli(command: Any) -> bool:
    words = [str(w) for w in command] if isinstance(command, list | tuple) else [str(command)]
    return "--debug" not in words and (
        "gpupool.cli.main" in words or any(Path(w).name == "gpupool" for w in words[:1]))


@pytest.fixture(autouse=True)
def _cli_output_for_people(monkeypatch: pytest.MonkeyPatch) -> None:
    """Wrap subprocess.run and CliRunner.invoke: a CLI run whose output holds a text of
    gpupool.devtools.cli_output.FORBIDDEN fails the test."""
    import subprocess

    from typer.testing import CliRunner

    real_run, real_invoke = subprocess.run, CliRunner.invoke

    def run(*args: Any, **kwargs: Any) -> Any:
        done = real_run(*args, **kwargs)
        if _is_cli(args[0] if args else kwargs.get("args", [])):
            problems = cli_output.problems(done.stdout, done.stderr)
            assert not problems, "the CLI printed Python internals:\n" + "\n".join(problems)
        return done

    def invoke(self: CliRunner, app: Any, args: Any = None, *rest: Any, **kwargs: Any) -> Any:
        result = real_invoke(self, app, args, *rest, **kwargs)
        if "--debug" not in [str(a) for a in (args or [])]:
            problems = cli_output.problems(result.output)
            assert not problems, "the CLI printed Python internals:\n" + "\n".join(problems)
        return result

    monkeypatch.setattr(subprocess, "run", run)
    monkeypatch.setattr(CliRunner, "invoke", invoke)
