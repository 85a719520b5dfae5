"""Figure lines of the reliability tests (RELIABILITY.md §3.3) and the report `make soak` writes.

A test reports each result as ONE line that starts with its test id, `T<digit>` or `S<digit>` (for example
`T1  kills=10 acked=100 lost=0 ...`), through `figure(line)`: printed, and appended to the file named by
$GPUPOOL_FIGURES when that is set (pytest captures output; under xdist the file is the only way out).

`python -m gpupool.devtools.figures --out reports/reliability.md --command "make soak" FILE...` collects every
figure line of the given files (figure files or test logs, in order, duplicates dropped) into a Markdown report
with the date, the machine, the command and pytest's result line (the last one found in the files).

A figure whose numbers come from many tests (a parametrised matrix, possibly spread over xdist workers) gathers
them with `Parts`: each test leaves its part in a folder the whole session shares (`session_folder`), and the test
that leaves the last expected part gets them all back, once, and prints the line.
"""

from __future__ import annotations

import argparse
import fcntl
import hashlib
import json
import os
import platform
import re
import socket
import sys
import time
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

ENV = "GPUPOOL_FIGURES"
SOAK_ENV = "GPUPOOL_SOAK"
LINE = re.compile(r"^[TS]\d+[a-z]?\s")
#: pytest's closing summary, e.g. "575 passed, 2 skipped, 2 xfailed in 3937.81s (1:05:37)" (maybe inside "=")
RESULT = re.compile(r"^=*\s*(\d+ (?:passed|failed|errors?)\b.* in \d[\d.]*s\b.*?)\s*=*$")


def soak() -> bool:
    """Whether this run asks for the full (nightly) counts: GPUPOOL_SOAK=1."""
    return os.environ.get(SOAK_ENV, "") == "1"


def figure(line: str) -> str:
    """Report one figure line: print it, and append it to $GPUPOOL_FIGURES if set (whole lines, locked, so that
    parallel test workers never interleave). Returns the line. ValueError if it is not a figure line."""
    if not LINE.match(line) or "\n" in line:
        raise ValueError(f"not a figure line (one line starting with T<digit> or S<digit>): {line!r}")
    print(line, flush=True)
    target = os.environ.get(ENV)
    if target:
        with open(target, "a", encoding="utf-8") as out:
            fcntl.flock(out, fcntl.LOCK_EX)
            out.write(line + "\n")
    return line


def session_folder(basetemp: Path, worker_id: str, name: str) -> Path:
    """A folder every xdist worker of this pytest session shares (`basetemp` is the worker's base temp folder, from
    `tmp_path_factory.getbasetemp()`; `worker_id` is xdist's fixture: "master" without workers)."""
    return (basetemp.parent if worker_id != "master" else basetemp) / name


class Parts:
    """The numbers of one figure line, left by many tests as named parts (JSON objects) in `folder`.

    `add` keeps one part (a later add of the same name replaces it) and returns every part, by name, to the ONE call
    that finds all of `expected` present (an O_EXCL file decides, across processes); every other call gets None.
    """

    def __init__(self, folder: Path, expected: Iterable[str]) -> None:
        self.folder = folder
        self.expected = frozenset(expected)
        folder.mkdir(parents=True, exist_ok=True)

    def add(self, name: str, **numbers: Any) -> dict[str, dict[str, Any]] | None:
        if name not in self.expected:
            raise ValueError(f"part {name!r} is not one of the expected parts")
        stem = hashlib.sha256(name.encode()).hexdigest()[:32]
        scratch = self.folder / f".{stem}.{os.getpid()}"
        scratch.write_text(json.dumps({"name": name, "numbers": numbers}))
        scratch.replace(self.folder / f"{stem}.json")  # whole, for a process reading it at the same moment
        found = {}
        for path in self.folder.glob("*.json"):
            part = json.loads(path.read_text())
            found[part["name"]] = part["numbers"]
        if not self.expected <= found.keys():
            return None
        try:
            os.close(os.open(self.folder / "complete", os.O_CREAT | os.O_EXCL | os.O_WRONLY))
        except FileExistsError:
            return None
        return {name: found[name] for name in sorted(self.expected)}


def collect(texts: Iterable[str]) -> list[str]:
    """Every figure line of `texts`, in order, each once."""
    seen: dict[str, None] = {}
    for text in texts:
        for raw in text.splitlines():
            line = raw.rstrip()
            if LINE.match(line):
                seen.setdefault(line, None)
    return list(seen)


def result(texts: Iterable[str]) -> str:
    """pytest's last summary line in `texts` ("" if none): how the run that printed the figures ended."""
    found = ""
    for text in texts:
        for raw in text.splitlines():
            match = RESULT.match(raw.strip())
            if match:
                found = match.group(1)
    return found


def machine() -> str:
    """One line about where the figures were measured."""
    cpus = os.cpu_count() or 0
    return (f"{socket.gethostname()}: {platform.system()} {platform.release()} {platform.machine()}, {cpus} CPUs, "
            f"Python {platform.python_version()}")


def report(lines: Sequence[str], command: str, when: str | None = None, outcome: str = "") -> str:
    """The Markdown report: when, where, how and with what result, then a table of the figure lines (test id,
    figures). `when` defaults to the current UTC time."""
    when = when or time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())
    outcome_line = f"- result: {outcome}\n" if outcome else ""
    rows = [f"| {line.split(None, 1)[0]} | `{line.split(None, 1)[1] if ' ' in line else ''}` |" for line in lines]
    body = "\n".join(rows) if rows else "| - | no figure line was printed |"
    return (f"# gpupool reliability figures\n\n"
            f"- date: {when}\n- machine: {machine()}\n- command: `{command}`\n{outcome_line}\n"
            f"| test | figures (RELIABILITY.md §3.3) |\n|---|---|\n{body}\n")


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m gpupool.devtools.figures", description=__doc__.splitlines()[0])
    parser.add_argument("files", nargs="*", type=Path, help="figure files or test logs (missing ones are skipped)")
    parser.add_argument("--out", type=Path, default=Path("reports/reliability.md"))
    parser.add_argument("--command", default="make soak")
    args = parser.parse_args(argv)
    texts = [f.read_text(errors="replace") for f in args.files if f.is_file()]
    lines = collect(texts)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(report(lines, args.command, outcome=result(texts)))
    print(f"{len(lines)} figure lines -> {args.out}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
