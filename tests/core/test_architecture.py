"""docs/design/architecture.md draws the code's imports: each solid arrow of its two Mermaid diagrams is an import
between two rooms, and every such import is an arrow (the package's rooms, then the core's layers)."""

from __future__ import annotations

import re
from collections.abc import Callable
from pathlib import Path

import grimp
import pytest

REPO = Path(__file__).resolve().parents[2]
DOC = REPO / "docs" / "design" / "architecture.md"
#: the core's children drawn as their own box; every other child of the core is a model module
CORE_BOXES = {"cycle", "profile", "registry", "testing", "actions", "plugins", "framework"}


def _diagrams() -> list[str]:
    return re.findall(r"```mermaid\n(.*?)```", DOC.read_text(), flags=re.DOTALL)


def _arrows(diagram: str) -> set[tuple[str, str]]:
    return set(re.findall(r"^\s*(\w+) --> (\w+)\s*$", diagram, flags=re.MULTILINE))


def _imports(graph: grimp.ImportGraph, room: Callable[[str], str | None]) -> set[tuple[str, str]]:
    """(importer's room, imported room) for every import between two rooms; `room` names a module's room or None."""
    pairs = set()
    for module in graph.modules:
        importer = room(module)
        for imported in graph.find_modules_directly_imported_by(module):
            target = room(imported)
            if importer and target and importer != target:
                pairs.add((importer, target))
    return pairs


def _package_room(module: str) -> str | None:
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else None


def _core_room(module: str) -> str | None:
    parts = module.split(".")
    if parts[:2] != ["gpupool", "core"] or len(parts) < 3:
        return None
    return parts[2] if parts[2] in CORE_BOXES else "model"


@pytest.fixture(scope="module")
def graph() -> grimp.ImportGraph:
    return grimp.build_graph("gpupool")


def test_the_doc_has_the_two_diagrams():
    assert len(_diagrams()) == 2


def test_the_package_diagram_has_every_room_and_every_import_between_rooms(graph):
    diagram = _diagrams()[0]
    rooms = {p.name for p in (REPO / "src" / "gpupool").iterdir() if p.is_dir() and p.name != "__pycache__"}
    assert set(re.findall(r"^\s*(\w+)\[", diagram, flags=re.MULTILINE)) == rooms
    assert _arrows(diagram) == _imports(graph, _package_room)


def test_the_core_diagram_has_every_import_between_layers(graph):
    assert _arrows(_diagrams()[1]) == _imports(graph, _core_room)
