"""The core's import contracts (pyproject.toml) catch what they promise: each case copies the package to a temporary
tree, adds one import (or one module), and runs import-linter on the copy with the project's configuration. The
contracts that must break are named exactly, so each case also shows which contract guards what; the untouched copy
keeps them all, so a failure is the added import's doing."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
NO_CYCLE = "core has no import cycle"
LAYERS = "core layers: wiring over actions and plugins over the framework over the model"
ACTIONS = "actions never import each other, only the helpers below them"
PLUGINS = "plugins never import each other (strand_aware extends fgd)"
CORE_CONTRACTS = {NO_CYCLE, LAYERS, ACTIONS, PLUGINS}
TYPING_ONLY = "\nif TYPE_CHECKING:\n    from {module} import {name}\n"

#: case -> (file under gpupool/core, text appended to it (the file is new when it does not exist), contracts broken)
CASES: dict[str, tuple[str, str, set[str]]] = {
    "the untouched copy keeps every contract": ("units.py", "", set()),
    "an action imports the in-tree registry, which imports every action (a cycle across layers)": (
        "actions/allocate.py", "\nfrom gpupool.core import registry\n", {NO_CYCLE, LAYERS, ACTIONS}),
    "an action types its cycle with run_cycle's module, as all of them did before (a layer broken, no cycle)": (
        "actions/allocate.py", TYPING_ONLY.format(module="gpupool.core.cycle", name="run_cycle"), {LAYERS}),
    "the plugin interfaces import the Cycle for typing only (a cycle inside the framework)": (
        "framework/interfaces.py", TYPING_ONLY.format(module="gpupool.core.framework.session", name="Cycle"),
        {NO_CYCLE}),
    "the framework imports an action": (
        "framework/runtime.py", "\nfrom gpupool.core.actions import allocate\n", {NO_CYCLE, LAYERS}),
    "two model modules import each other (one layer, so only the cycle contract sees it)": (
        "model.py", "\nfrom gpupool.core import quota\n", {NO_CYCLE}),
    "an action imports another action": (
        "actions/preempt.py", "\nfrom gpupool.core.actions import reclaim\n", {ACTIONS}),
    "a plugin imports another plugin": (
        "plugins/score/spread.py", "\nfrom gpupool.core.plugins.score import bestfit\n", {PLUGINS}),
    "a new core module in no layer": ("scratch.py", "from gpupool.core import model\n", {LAYERS}),
}


def _lint(tree: Path) -> tuple[int, dict[str, str], str]:
    """Run import-linter on `tree`'s copy of the package: (exit status, {contract: KEPT or BROKEN}, output)."""
    env = {**os.environ, "PYTHONPATH": str(tree / "src"), "COLUMNS": "500"}
    command = [sys.executable, "-c", "from importlinter.cli import lint_imports_command; lint_imports_command()",
               "--no-cache", str(tree / "pyproject.toml")]
    done = subprocess.run(command, cwd=tree, env=env, capture_output=True, text=True, timeout=300)
    output = done.stdout + done.stderr
    verdicts = dict(re.findall(r"^(.+?) (KEPT|BROKEN)\b", output, flags=re.MULTILINE))
    return done.returncode, verdicts, output


@pytest.mark.parametrize("case", CASES, ids=lambda case: case)
def test_a_contract_breaks_exactly_when_its_rule_is_broken(case, tmp_path):
    path, added, want_broken = CASES[case]
    shutil.copytree(REPO / "src" / "gpupool", tmp_path / "src" / "gpupool",
                    ignore=shutil.ignore_patterns("__pycache__"))
    shutil.copy(REPO / "pyproject.toml", tmp_path / "pyproject.toml")
    target = tmp_path / "src" / "gpupool" / "core" / path
    target.write_text((target.read_text() if target.exists() else "") + added)
    status, verdicts, output = _lint(tmp_path)
    assert CORE_CONTRACTS <= verdicts.keys(), output
    assert {name for name in CORE_CONTRACTS if verdicts[name] == "BROKEN"} == want_broken, output
    assert (status != 0) == bool(want_broken), output
