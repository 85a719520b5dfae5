"""The figure lines of the reliability tests and the soak report (gpupool.devtools.figures)."""

from __future__ import annotations

from pathlib import Path

import pytest

from gpupool.devtools import figures


def test_figure_prints_and_appends_to_the_figures_file(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                       capsys: pytest.CaptureFixture[str]):
    target = tmp_path / "figures.txt"
    monkeypatch.setenv(figures.ENV, str(target))
    lines = ["T1  kills=10 acked=100 (sqlite)", "T10 migrations=2 killed_mid=2 partial=0 refused_half_applied=3/3 (pg)"]
    for line in lines:
        assert figures.figure(line) == line
    assert capsys.readouterr().out.splitlines() == lines
    assert target.read_text().count("\n") == 2


@pytest.mark.parametrize("line", ["kills=10", "T1", "X1  a=1", "T1  a=1\nT2  b=2", "details (T1): 5 s"],
                         ids=["no-id", "id-only", "other-letter", "two-lines", "detail-line"])
def test_figure_refuses_what_is_not_one_figure_line(line: str):
    with pytest.raises(ValueError, match="not a figure line"):
        figures.figure(line)


def test_collect_keeps_order_drops_duplicates_and_noise():
    log = "noise\nT1  kills=10 (sqlite)\n  T2 indented\nS4  ops=3\nT1  kills=10 (sqlite)\nT2a partitions=20\n"
    assert figures.collect([log, "T1  kills=100 (pg)\n"]) == [
        "T1  kills=10 (sqlite)", "S4  ops=3", "T2a partitions=20", "T1  kills=100 (pg)"]


def test_main_writes_the_report_with_date_machine_and_command(tmp_path: Path):
    source = tmp_path / "figures.txt"
    source.write_text("T6  disk_full_events=2 lost=0 partial=0 recover_s=0.01 integrity=ok\n")
    out = tmp_path / "reports" / "reliability.md"
    assert figures.main([str(source), str(tmp_path / "missing.log"), "--out", str(out), "--command", "make soak"]) == 0
    text = out.read_text()
    assert "| T6 | `disk_full_events=2 lost=0 partial=0 recover_s=0.01 integrity=ok` |" in text
    assert "- command: `make soak`" in text and "- date: " in text and "CPUs" in text
    assert "- result:" not in text  # no pytest summary among the files


@pytest.mark.parametrize(("log", "expected"), [
    ("....\n575 passed, 2 skipped, 2 xfailed in 3937.81s (1:05:37)\n",
     "575 passed, 2 skipped, 2 xfailed in 3937.81s (1:05:37)"),
    ("== 1 failed, 12 passed in 3.10s ==\n", "1 failed, 12 passed in 3.10s"),
    ("T1  passed=3 in 2s\nno summary here\n", ""),
], ids=["quiet", "framed", "none"])
def test_the_report_carries_the_pytest_result_line(tmp_path: Path, log: str, expected: str):
    assert figures.result([log]) == expected
    text = figures.report(["T6  lost=0"], "make soak", outcome=figures.result([log]))
    assert (f"- result: {expected}\n" in text) == bool(expected)


def test_parts_hand_every_part_to_the_one_add_that_completes_them(tmp_path: Path):
    folder = figures.session_folder(tmp_path / "popen-gw1", "gw1", "s9-parts")
    assert folder == tmp_path / "s9-parts"
    first, second = figures.Parts(folder, ["a/1 x", "b"]), figures.Parts(folder, ["a/1 x", "b"])  # two workers
    assert first.add("a/1 x", n=1) is None
    assert first.add("a/1 x", n=2) is None  # replaced, not added
    assert second.add("b", n=3) == {"a/1 x": {"n": 2}, "b": {"n": 3}}
    assert first.add("b", n=3) is None  # once only
    with pytest.raises(ValueError, match="not one of the expected parts"):
        first.add("c")
