"""Failpoints (gpupool.server.failpoints): the GPUPOOL_FAILPOINTS parser, each action, the cost of an unarmed
failpoint, start-up validation, and the API's 503 for an injected error."""

from __future__ import annotations

import subprocess
import sys
import time
import timeit
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from gpupool.devtools.harness import start_server, stop_server
from gpupool.server import failpoints
from gpupool.server.failpoints import Action, FailpointError, configure, failpoint, parse

BINDER, SUBMIT = "binder.after_allocation_insert", "jobs.before_job_update"


@pytest.fixture(autouse=True)
def disarmed() -> Iterator[None]:
    configure({})
    yield
    configure({})


@pytest.mark.parametrize(("spec", "want"), [
    ("", {}),
    (" , ", {}),
    (f"{BINDER}=crash", {BINDER: Action("crash")}),
    (f"{BINDER}=crash@3", {BINDER: Action("crash", nth=3)}),
    (f"{SUBMIT}=sleep(250)", {SUBMIT: Action("sleep", ms=250)}),
    (f" {BINDER}=error@1 , {SUBMIT}=sleep(0)@2 ", {BINDER: Action("error", nth=1), SUBMIT: Action("sleep", 0, 2)}),
], ids=["empty", "only-commas", "crash", "crash-on-3rd-hit", "sleep", "two-entries-with-spaces"])
def test_parse_accepts(spec: str, want: dict[str, Action]):
    assert parse(spec) == want


@pytest.mark.parametrize(("spec", "want_in_message"), [
    ("binder.after_alloc=crash", "unknown failpoint 'binder.after_alloc'"),
    (f"{BINDER}=explode", f"bad entry '{BINDER}=explode'"),
    (f"{BINDER}=sleep()", "bad entry"),
    (f"{BINDER}=sleep(-5)", "bad entry"),
    (f"{BINDER}=crash@0", "@N counts hits from 1"),
    (f"{BINDER}", "bad entry"),
    (f"{BINDER}=crash,{BINDER}=error", "given twice"),
    (f"{SUBMIT}=sleep(5),oops", "bad entry 'oops'"),
], ids=["typo-in-name", "unknown-action", "sleep-without-ms", "negative-sleep", "zeroth-hit", "no-action",
        "duplicate", "second-entry-bad"])
def test_parse_refuses_naming_the_entry(spec: str, want_in_message: str):
    with pytest.raises(ValueError, match="GPUPOOL_FAILPOINTS") as caught:
        parse(spec)
    assert want_in_message in str(caught.value)


def test_every_named_place_is_known_and_placed_in_the_code():
    assert {BINDER, SUBMIT, "jobs.after_commit_before_response", "metering.mid_ledger_batch",
            "migrate.mid_migration"} <= set(failpoints.NAMES)
    source = "".join(p.read_text() for p in Path(failpoints.__file__).parents[1].rglob("*.py")
                     if p.name != "failpoints.py")
    assert not [n for n in failpoints.NAMES if f'"{n}"' not in source], "a listed failpoint that no code reaches"


def test_unarmed_failpoint_does_nothing_and_costs_next_to_nothing():
    failpoint(BINDER)
    per_call = min(timeit.repeat(lambda: failpoint(BINDER), number=100_000, repeat=5)) / 100_000
    assert per_call < 2e-6, f"an unarmed failpoint costs {per_call * 1e9:.0f} ns"


def test_armed_elsewhere_leaves_other_places_alone():
    configure({"GPUPOOL_FAILPOINTS": f"{BINDER}=error"})
    failpoint(SUBMIT)
    failpoint("jobs.after_commit_before_response")


def test_sleep_blocks_the_caller():
    configure({"GPUPOOL_FAILPOINTS": f"{SUBMIT}=sleep(80)"})
    started = time.monotonic()
    failpoint(SUBMIT)
    assert time.monotonic() - started >= 0.08


def test_error_raises_on_every_hit_or_only_the_nth():
    configure({"GPUPOOL_FAILPOINTS": f"{SUBMIT}=error,{BINDER}=error@2"})
    for _ in range(2):
        with pytest.raises(FailpointError, match=SUBMIT):
            failpoint(SUBMIT)
    failpoint(BINDER)
    with pytest.raises(FailpointError, match="hit 2"):
        failpoint(BINDER)
    failpoint(BINDER)


def test_configure_resets_hit_counts():
    configure({"GPUPOOL_FAILPOINTS": f"{BINDER}=error@2"})
    failpoint(BINDER)
    configure({"GPUPOOL_FAILPOINTS": f"{BINDER}=error@2"})
    failpoint(BINDER)
    with pytest.raises(FailpointError):
        failpoint(BINDER)


CRASH_SCRIPT = """
import sys
from gpupool.server.failpoints import configure, failpoint
configure({"GPUPOOL_FAILPOINTS": sys.argv[1]})
for hit in range(1, 4):
    print(f"before hit {hit}", flush=True)
    failpoint("binder.after_allocation_insert")
print("survived", flush=True)
"""


@pytest.mark.parametrize(("spec", "want_printed"), [
    (f"{BINDER}=crash", ["before hit 1"]),
    (f"{BINDER}=crash@3", ["before hit 1", "before hit 2", "before hit 3"]),
], ids=["first-hit", "third-hit"])
def test_crash_kills_the_process_at_once_like_kill_9(spec: str, want_printed: list[str]):
    done = subprocess.run([sys.executable, "-c", CRASH_SCRIPT, spec], capture_output=True, text=True, timeout=60)
    assert done.returncode == -9, (done.returncode, done.stderr)
    assert done.stdout.splitlines() == want_printed
    assert f"failpoint {BINDER}: crash" in done.stderr


def test_server_refuses_a_bad_spec_at_start_up(tmp_path: Path):
    done = subprocess.run([sys.executable, "-m", "gpupool.server", "--data-dir", str(tmp_path / "cp")],
                          capture_output=True, text=True, timeout=60,
                          env={"PATH": "/usr/bin:/bin", "GPUPOOL_FAILPOINTS": f"{SUBMIT}=crash,bogus.place=error"})
    assert done.returncode == 2, done.stderr
    assert "unknown failpoint 'bogus.place'" in done.stderr
    assert not (tmp_path / "cp" / "gpupool.db").exists(), "a refused start must not touch the database"


def test_injected_error_is_a_503_with_retry_after_and_the_retry_succeeds(tmp_path: Path):
    server = start_server(tmp_path / "cp", env={"GPUPOOL_FAILPOINTS": f"{SUBMIT}=error@1"})
    try:
        body = {"command": ["true"], "gpus": "0", "cpus": "0.1", "memory_mib": 64}
        with server.client() as api:
            first = api.post("/jobs", json=body, headers={"Idempotency-Key": "k1"})
            assert first.status_code == 503, first.text
            assert first.headers["Retry-After"] == "1"
            assert "injected error" in first.json()["detail"] and "Traceback" not in first.text
            again = api.post("/jobs", json=body, headers={"Idempotency-Key": "k1"})
            assert again.status_code == 201, again.text
            assert [j["id"] for j in api.get("/jobs").json()["items"]] == [again.json()["id"]]
    finally:
        stop_server(server)
    assert httpx  # the client library the harness uses
