"""The docs hold: every `src/...`, `tests/...` or `benchmarks/...` path a page cites exists; the generated references
(CLI, settings, OpenAPI schema) equal a fresh generation, so a command, setting or route added without `make docs`
fails here, and a setting without a description fails generation; the README stays a short front door whose figures
each link to the docs page that names the command behind them. (`make test` also builds the site with
`mkdocs build --strict`: broken links and pages missing from the nav.)"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import typer

from gpupool.devtools import docgen
from gpupool.server.settings import Settings

REPO = Path(__file__).resolve().parents[1]
README = REPO / "README.md"
DOCS = sorted((REPO / "docs").rglob("*.md")) + [README, REPO / "CHANGELOG.md"]
PATH = re.compile(r"`((?:src|tests|benchmarks|examples|docs|scripts|reports)/[\w./-]+)`")


@pytest.mark.parametrize("doc", DOCS, ids=lambda p: str(p.relative_to(REPO)))
def test_cited_paths_exist(doc):
    missing = [p for p in PATH.findall(doc.read_text()) if not (REPO / p).exists()]
    assert not missing, f"{doc.name} cites missing paths: {missing}"


def test_there_are_design_notes():
    assert any(d.parent.name == "design" for d in DOCS)


def test_generated_references_are_up_to_date():
    assert docgen.stale() == [], "run `make docs` (python -m gpupool.devtools.docgen) and commit the result"


def test_a_new_command_changes_the_cli_reference():
    app = typer.Typer()

    @app.command()
    def reticulate(splines: int = typer.Option(3, help="how many")) -> None:
        """Reticulate the splines."""

    page = docgen.cli_reference(app)
    assert "Reticulate the splines." in page and "`--splines <int>`: how many  [default: 3]" in page


class _Undocumented(Settings):
    flux_capacity: int = 3


class _Documented(Settings):
    #: gigawatts the flux capacitor draws
    flux_capacity: int = 3


def test_a_setting_without_a_description_fails_generation():
    with pytest.raises(ValueError, match="flux_capacity"):
        docgen.settings_reference(_Undocumented)
    assert "| `GPUPOOL_FLUX_CAPACITY` | `3` | integer | gigawatts the flux capacitor draws |" in \
        docgen.settings_reference(_Documented)


def test_the_readme_is_a_short_front_door():
    text = README.read_text()
    assert len(text.splitlines()) <= 180
    assert not re.search(r"\b20\d\d-\d\d-\d\d\b", text), "no dated measurement in the README"
    assert not re.search(r"before\s*(→|->)\s*now", text), "no before -> now diary in the README"


def test_every_readme_figure_links_to_a_page_naming_its_command():
    """Rows of the README's figures table: `| what | figure | `command` | [page](docs/...) |`."""
    rows = [line for line in README.read_text().splitlines() if re.match(r"\|.*\|\s*`[^`]+`\s*\|.*\]\(docs/", line)]
    assert len(rows) >= 4
    for row in rows:
        command = re.search(r"\|\s*`([^`]+)`\s*\|", row).group(1)
        page = REPO / re.search(r"\]\((docs/[\w./-]+\.md)\)", row).group(1)
        assert command in page.read_text(), f"{page.name} does not name `{command}`"


def test_the_strict_build_refuses_a_broken_link_and_a_page_left_out_of_the_nav(tmp_path):
    """What `make test`'s `mkdocs build --strict` guards, shown on a copy of the site with both faults."""
    pytest.importorskip("mkdocs")
    pytest.importorskip("material")
    shutil.copytree(REPO / "docs", tmp_path / "docs")
    shutil.copy(REPO / "mkdocs.yml", tmp_path)
    shutil.copytree(REPO / "reports", tmp_path / "reports")
    (tmp_path / "docs" / "orphan.md").write_text("# Not in the nav\n")
    with (tmp_path / "docs" / "billing.md").open("a") as page:
        page.write("\nSee [the missing page](operating/missing.md).\n")
    build = subprocess.run([sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(tmp_path / "site")],
                           cwd=tmp_path, capture_output=True, text=True, timeout=300,
                           env={**os.environ, "NO_MKDOCS_2_WARNING": "1"})
    assert build.returncode != 0
    assert "orphan.md" in build.stderr and "operating/missing.md" in build.stderr, build.stderr
