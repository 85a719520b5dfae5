"""A small synthetic cluster and pod list in the openb CSV format, for demos and tests without traces.

The mix is shaped like openb's default list: about 13 % CPU-only pods, 38 % fractions of one GPU,
48 % one whole GPU and 1 % multi-GPU pods, on 8-GPU and 2-GPU nodes of two models.
"""

from __future__ import annotations

import random
from pathlib import Path

from gpupool.protocol.csvsafe import SafeWriter

NODE_TYPES = (("A100", 8, 96_000, 393_216), ("T4", 2, 64_000, 262_144))
SHARES = (250, 320, 470, 500, 810)


def write_synthetic(out: Path, nodes: int = 64, pods: int = 600, seed: int = 0) -> tuple[Path, Path]:
    """Write nodes.csv and pods.csv into `out`; returns their paths."""
    if nodes < 1 or pods < 1:
        raise ValueError("synthetic: nodes and pods must be positive")
    rng = random.Random(seed)
    out.mkdir(parents=True, exist_ok=True)
    node_path, pod_path = out / "nodes.csv", out / "pods.csv"
    with node_path.open("w", newline="") as handle:
        writer = SafeWriter(handle, lineterminator="\n")
        writer.writerow(["sn", "cpu_milli", "memory_mib", "gpu", "model"])
        for i in range(nodes):
            model, gpus, cpu, mem = NODE_TYPES[0 if i % 3 == 0 else 1]
            writer.writerow([f"node-{i:04d}", cpu, mem, gpus, model])
    with pod_path.open("w", newline="") as handle:
        writer = SafeWriter(handle, lineterminator="\n")
        writer.writerow(["name", "cpu_milli", "memory_mib", "num_gpu", "gpu_milli"])
        for i in range(pods):
            writer.writerow([f"pod-{i:05d}", *_pod(rng)])
    return node_path, pod_path


def _pod(rng: random.Random) -> tuple[int, int, int, int]:
    draw = rng.random()
    if draw < 0.13:
        return rng.choice((2000, 4000, 8000)), 8192, 0, 0
    if draw < 0.51:
        return rng.choice((4000, 6000)), 12_288, 1, rng.choice(SHARES)
    if draw < 0.99:
        return rng.choice((6000, 12_000)), 24_576, 1, 1000
    return 32_000, 65_536, rng.choice((2, 4, 8)), 1000
