"""Whether a job could ever start on a cluster: the admission check made once, at submission.

A job none of whose placements exists even with every node empty is not demand the cluster can serve:
left pending it would wait forever, and its GPUs would count in its queue's request (and so in its fair
share) for as long as it waits. Slurm refuses such a job at submission ("Requested node configuration is
not available"); `never_fits` is that check.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable

from gpupool.core.fit import copies_fit, node_fits
from gpupool.core.model import JobSpec
from gpupool.core.nodes import NodeKind, NodeState


def never_fits(job: JobSpec, kinds: Iterable[NodeKind]) -> str:
    """Why `job`'s mandatory tasks (its first `min_tasks`) surely cannot all be placed at once on nodes of
    `kinds` (one entry per node), every node empty and schedulable; "" when they may be.

    For each task shape, the copies every empty node could take are summed; the job is refused when some
    shape has more mandatory tasks than that sum. This is exact for a gang of one shape (every trace gang);
    for mixed shapes only this necessary condition is checked, so a job it accepts may still never fit.
    The reason counts the nodes by why they cannot take the shape, e.g. "7 of its 8 tasks fit even with
    every node empty (62 insufficient CPU, 53 too few GPUs on node)".
    """
    nodes = Counter(kinds)
    wanted = Counter(task.shape for task in job.tasks[: job.min_tasks])
    for shape, count in wanted.items():
        room = sum(copies_fit(kind, NodeState.empty(kind), shape) * n for kind, n in nodes.items())
        if room < count:
            why: Counter[str] = Counter()
            for kind, n in nodes.items():
                why[node_fits(kind, NodeState.empty(kind), shape)] += n
            details = ", ".join(f"{n} {phrase}" for phrase, n in why.most_common() if phrase)
            return f"{room} of its {count} tasks fit even with every node empty" + (f" ({details})" if details else "")
    return ""
