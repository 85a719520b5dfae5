"""CLI output for people (issue 43): `--version`, one-line failures with `--debug` for the traceback, validation
errors as `field: message`, human units, ids never cut; and the check tests/conftest.py runs over every CLI test's
output catches what it should."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

import gpupool
from gpupool.cli import render
from gpupool.devtools.cli_output import problems as cli_output_problems
from gpupool.devtools.harness import Server, free_port, start_server, stop_server

GPUPOOL = [sys.executable, "-m", "gpupool.cli.main"]


def _run(*args: str, url: str, token: str = "none", status: int = 0,
         columns: int = 80) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "GPUPOOL_URL": url, "GPUPOOL_TOKEN": token, "COLUMNS": str(columns)}
    done = subprocess.run([*GPUPOOL, *args], env=env, capture_output=True, text=True, timeout=60)
    assert done.returncode == status, f"{args}: exit {done.returncode}\n{done.stdout}{done.stderr}"
    return done


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    server = start_server(Path(tmp_path_factory.mktemp("output")) / "data")
    try:
        yield server
    finally:
        stop_server(server)


def test_version() -> None:
    assert _run("--version", url="http://127.0.0.1:1").stdout.strip() == f"gpupool {gpupool.__version__}"


def test_an_unreachable_control_plane_is_one_line_and_debug_shows_the_traceback() -> None:
    url = f"http://127.0.0.1:{free_port()}"
    done = _run("jobs", url=url, status=3)
    said = (done.stdout + done.stderr).strip()
    assert said.startswith(f"error: cannot reach the control plane at {url}") and "GPUPOOL_URL" in said
    assert len(said.splitlines()) == 1
    debug = _run("--debug", "jobs", url=url, status=3)
    assert "Traceback (most recent call last)" in debug.stderr and "ConnectError" in debug.stderr


def test_a_validation_error_names_the_field_without_pydantic_words(server: Server) -> None:
    done = _run("submit", "--gpus", "0.55", "--", "true", url=server.url, token=server.token, status=1)
    said = done.stdout + done.stderr
    assert "gpus: fractions of a GPU go in 10 % steps" in said and "Value error" not in said


def test_queue_create_prints_a_summary_and_tables_show_quotas_in_words(server: Server) -> None:
    said = _run("queue", "create", "words", "--guaranteed-gpus", "0.5", url=server.url, token=server.token).stdout
    assert said.startswith("created queue words (shared) at the top: guaranteed gpus=0.5, limit none")
    assert "warning: guaranteed.gpus: queue 'words' guarantees 0.5 GPU, above the pool's 0 GPUs" in said
    table = _run("queues", url=server.url, token=server.token, columns=200).stdout
    assert "gpus=0.5" in table


def test_a_job_id_is_never_cut_and_a_prefix_names_it(server: Server) -> None:
    job = _run("submit", "--queue", "words", "--gpus", "8", "--json", "--", "true", url=server.url,
               token=server.token).stdout
    job_id = job.split('"id": "')[1][:32]
    table = _run("jobs", url=server.url, token=server.token).stdout  # 80 columns
    assert job_id[:12] in table and "…" not in table.split(job_id[:12])[1][:2]
    assert job_id in _run("jobs", "--wide", url=server.url, token=server.token).stdout.replace("\n", "")
    assert job_id in _run("job", "show", job_id[:12], url=server.url, token=server.token).stdout
    missing = _run("job", "show", "fffffffffffz", url=server.url, token=server.token, status=1)
    assert (missing.stdout + missing.stderr).strip() == "error: job not found: fffffffffffz"


@pytest.mark.parametrize(("hours", "want"), [(6.2e-05, "< 0.0001"), (0.00062, "0.0006"), (0.5, "0.5"),
                                             (12.345, "12.35"), (1234.56, "1,234.6"), (0, "0")])
def test_gpu_hours_read_as_a_person_reads_them(hours: float, want: str) -> None:
    assert render.gpu_hours(hours) == want


def test_texts_of_api_values_hold_no_repr() -> None:
    assert render.text({"gpus": "1", "per_model": {}}) == "gpus=1"
    assert render.text(["A100", "H100"]) == "A100, H100"
    assert render.text(None) == "" and render.text(True) == "yes"
    assert render.money(1234, "EUR") == "12.34 EUR"


def test_short_ids_are_unique_prefixes_of_at_least_twelve() -> None:
    ids = ["a" * 12 + "b" * 20, "a" * 12 + "c" * 20, "d" * 32]
    assert render.short_ids(ids) == {ids[0]: "a" * 12 + "b", ids[1]: "a" * 12 + "c", ids[2]: "d" * 12}


def test_the_output_check_catches_reprs_and_tracebacks() -> None:
    for bad in ("{'gpus': '1'}", "['A100']", "Value error, must be", "Traceback (most recent call last):"):
        assert cli_output_problems(bad), bad
    assert not cli_output_problems('{"gpus": "1"}', b"gpus=1 A100, H100")


@pytest.mark.parametrize("command", [["usage"], ["samples"], ["budget", "list"], ["price", "list"], ["org", "list"],
                                     ["project", "list"], ["user", "list"], ["token", "list"], ["whoami"], ["top"],
                                     ["nodes"], ["queues"], ["audit"], ["jobs"]], ids=" ".join)
def test_every_table_prints_for_people(server: Server, command: list[str]) -> None:
    """Each listing runs at 80 columns (the output check of tests/conftest.py reads it) and its --json parses."""
    _run(*command, url=server.url, token=server.token)
    if command != ["usage"]:
        json.loads(_run(*command, "--json", url=server.url, token=server.token).stdout)
