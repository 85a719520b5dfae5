"""Run independent simulations in parallel processes, with a Rich progress bar."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from concurrent.futures import ProcessPoolExecutor, as_completed
from typing import TypeVar

from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

T = TypeVar("T")
R = TypeVar("R")


def run_all(worker: Callable[[T], R], tasks: Sequence[T], jobs: int, description: str,
            quiet: bool = False) -> list[R]:
    """worker(task) for every task, `jobs` at a time (1 = in this process); results in task order."""
    results: list[R | None] = [None] * len(tasks)
    with Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
                  disable=quiet) as progress:
        bar = progress.add_task(description, total=len(tasks))
        if jobs <= 1:
            for i, task in enumerate(tasks):
                results[i] = worker(task)
                progress.advance(bar)
        else:
            with ProcessPoolExecutor(max_workers=jobs) as pool:
                futures = {pool.submit(worker, task): i for i, task in enumerate(tasks)}
                for future in as_completed(futures):
                    results[futures[future]] = future.result()
                    progress.advance(bar)
    return [r for r in results if r is not None]


def parse_seeds(text: str) -> list[int]:
    """"42-51" -> 42..51; "1,5,9" -> [1, 5, 9]; ranges and lists combine ("1-3,7")."""
    seeds: list[int] = []
    for part in text.split(","):
        part = part.strip()
        try:
            if "-" in part:
                low, high = (int(x) for x in part.split("-", 1))
                if high < low:
                    raise ValueError
                seeds.extend(range(low, high + 1))
            else:
                seeds.append(int(part))
        except ValueError:
            raise ValueError(f"--seeds: {part!r} is not a seed or a range like 42-51") from None
    if not seeds:
        raise ValueError("--seeds: no seeds given")
    return seeds
