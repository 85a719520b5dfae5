"""Instructions per warm scheduling cycle: the cycle suite's situations, counted under valgrind, which a busy or
drifting machine does not change (wall time here drifts by up to 2x within a run).

    python benchmarks/cycle_instructions.py dump burst burst.pkl      # fill the cluster once (about 15 s)
    valgrind --tool=cachegrind --cache-sim=no --cachegrind-out-file=/dev/null \\
        python benchmarks/cycle_instructions.py run burst.pkl default 0  # load, one cold cycle
    ... the same with 2 at the end: two warm cycles more

Instructions per warm cycle = (I refs with 2 - I refs with 0) / 2. Run with PYTHONHASHSEED=0 (string hashing
otherwise varies the count by a few per cent). A pickle is read only by the code that wrote it.
"""

from __future__ import annotations

import os
import pickle
import random
import sys
from fractions import Fraction
from pathlib import Path

from cycle_latency import NOW, _filled
from gpupool.core import FixedClock, Framework, default_registry, run_cycle, scheduling_profile

FILLS = {"burst": Fraction(9, 10), "saturated": Fraction(13, 10)}


def dump(situation: str, out: Path) -> None:
    openb = Path(os.environ.get("GPUPOOL_SHARED", Path(__file__).resolve().parents[2] / "shared")) / "traces" / \
        "alibaba-gpu-v2023"
    queues = Path(__file__).resolve().parents[1] / "examples" / "openb-4-queues.yaml"
    cluster, pending, workload = _filled(openb, queues, FILLS[situation])
    cluster.snapshot(pending, 0.0).nodes.derived.clear()  # caches are keyed by this process's placer
    out.write_bytes(pickle.dumps((cluster, pending, workload)))


def run(pickled: Path, profile: str, warm: int) -> None:
    cluster, pending, workload = pickle.loads(pickled.read_bytes())
    framework = Framework.build(scheduling_profile(profile).with_workload(workload), default_registry())
    for c in range(1 + warm):
        run_cycle(cluster.snapshot(pending, NOW), framework, clock=FixedClock(NOW), rng=random.Random(c))


if __name__ == "__main__":
    if len(sys.argv) == 4 and sys.argv[1] == "dump" and sys.argv[2] in FILLS:
        dump(sys.argv[2], Path(sys.argv[3]))
    elif len(sys.argv) == 5 and sys.argv[1] == "run" and sys.argv[4].isdigit():
        run(Path(sys.argv[2]), sys.argv[3], int(sys.argv[4]))
    else:
        sys.exit(__doc__)
