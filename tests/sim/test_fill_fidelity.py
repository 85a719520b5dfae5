"""The fill benchmark's comparison with the FGD artifact: published means over the chosen seeds, and the noise of a
difference of means, a 95 % Welch interval (benchmarks/fill_fidelity.py)."""

from __future__ import annotations

import math
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))
import fill_fidelity  # noqa: E402

HEADER = "workload,sc_policy,tune,seed,total_gpus," + ",".join(str(i) for i in range(131))


def row(seed: int, at_100: float, at_130: float, policy: str = "04-GpuPacking") -> str:
    levels = ["0"] * 131
    levels[100], levels[130] = str(at_100), str(at_130)
    return f"openb_pod_list_multigpu30,{policy},1.3,{seed},6212," + ",".join(levels)


def test_published_means_keep_the_chosen_seeds_with_their_spread(tmp_path):
    path = tmp_path / "results.csv"
    path.write_text("\n".join([HEADER, row(42, 94.0, 95.0), row(43, 95.0, 96.0), row(44, 99.0, 99.0),
                               row(42, 90.0, 91.0, "06-FGD")]) + "\n")
    means = fill_fidelity.published_means(path, {42, 43})
    mean, sd, seeds = means[("multigpu30", "gpupacking", 100)]
    assert (mean, seeds) == (94.5, 2)
    assert sd == pytest.approx(math.sqrt(0.5))  # sample sd of 94 and 95
    assert means[("multigpu30", "fgd", 130)] == (91.0, 0.0, 1)


def test_noise_is_the_welch_interval_of_a_difference_of_means():
    # sd 0.6 over 3 seeds on both sides: standard error sqrt(0.36/3 + 0.36/3) = sqrt(0.24), Welch df 4, t = 2.7764
    assert fill_fidelity.noise(0.6, 3, 0.6, 3) == pytest.approx(2.7764451 * math.sqrt(0.24))
    # 10 seeds: df 18, t = 2.1009; unequal spreads weigh the df toward the noisier side
    assert fill_fidelity.noise(0.6, 10, 0.6, 10) == pytest.approx(2.1009220 * math.sqrt(0.072))
    assert fill_fidelity.noise(0.7, 10, 0.3, 10) < fill_fidelity.noise(0.7, 10, 0.7, 10)
    assert fill_fidelity.noise(0.6, 1, 0.6, 10) == math.inf
    assert fill_fidelity.noise(0.0, 3, 0.0, 3) == 0.0
