"""The process wrapper and a stop that comes before its command starts: the command must not outlive it.

A SIGTERM to the workload's group that reaches the wrapper before it has started the command cannot reach the
command; it used to run on until the agent's SIGKILL (exit 137 instead of 143)."""

from __future__ import annotations

import signal
import subprocess
import time

import pytest

from gpupool.agent.runtime import _wrapper


@pytest.fixture(autouse=True)
def no_signals_yet():
    _wrapper._received.clear()
    yield
    _wrapper._received.clear()


def test_a_signal_before_the_start_means_the_command_never_starts(tmp_path):
    _wrapper._note(signal.SIGTERM, None)
    started = time.monotonic()
    assert _wrapper._run(["sleep", "30"], str(tmp_path / "exit"), None) == 128 + signal.SIGTERM
    assert time.monotonic() - started < 5


def test_a_signal_while_the_command_starts_is_sent_on_to_it(tmp_path, monkeypatch):
    real = subprocess.Popen

    def popen_hit_by_a_signal(*args, **kwargs):  # the group signal lands after the check, before the child exists
        _wrapper._note(signal.SIGTERM, None)
        return real(*args, **kwargs)

    monkeypatch.setattr(_wrapper.subprocess, "Popen", popen_hit_by_a_signal)
    started = time.monotonic()
    assert _wrapper._run(["sleep", "30"], str(tmp_path / "exit"), None) == 128 + signal.SIGTERM
    assert time.monotonic() - started < 5


def test_without_a_signal_the_command_runs_to_its_end(tmp_path):
    assert _wrapper._run(["sh", "-c", "exit 3"], str(tmp_path / "exit"), None) == 3
