"""Design notes name real files: every `src/...`, `tests/...` or `benchmarks/...` path they cite exists."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
DOCS = sorted((REPO / "docs" / "design").glob("*.md")) + [REPO / "README.md"]
PATH = re.compile(r"`((?:src|tests|benchmarks|examples|docs|scripts)/[\w./-]+)`")


@pytest.mark.parametrize("doc", DOCS, ids=lambda p: p.name)
def test_cited_paths_exist(doc):
    missing = [p for p in PATH.findall(doc.read_text()) if not (REPO / p).exists()]
    assert not missing, f"{doc.name} cites missing paths: {missing}"


def test_there_are_design_notes():
    assert any(d.parent.name == "design" for d in DOCS)
