"""Why a pod waits, written back on a real kube-apiserver: a pod ends with its latest reason whatever order the
writer's threads run its writes in (the gang's reason was once overwritten by an older "gang incomplete")."""

from __future__ import annotations

import json
from collections.abc import Callable
from concurrent.futures import Executor, Future
from typing import Any

from gpupool.core.diagnostics import PendingKind, PendingReason
from gpupool.devtools.kube_cluster import Testbed as Kube
from gpupool.devtools.kube_cluster import pod_body
from gpupool.server.kube.client import KubeClient
from gpupool.server.kube.objects import pod_of
from gpupool.server.kube.status import StatusWriter, message


class LastFirst(Executor):
    """Holds submitted work until `run()`, then runs it newest first: the worst order a thread pool could give."""

    def __init__(self) -> None:
        self.held: list[tuple[Callable[..., Any], tuple[Any, ...]]] = []

    def submit(self, fn: Callable[..., Any], /, *args: Any, **kwargs: Any) -> Future[Any]:
        self.held.append((fn, args))
        return Future()

    def run(self) -> None:
        while self.held:
            fn, args = self.held.pop()
            fn(*args)


def test_a_pod_ends_with_its_latest_reason_whatever_order_the_writes_run_in(kube: Kube) -> None:
    kube.create_pod(pod_body("train-0", gpus=2))
    pod = pod_of(json.loads(kube.core.read_namespaced_pod("train-0", "default", _preload_content=False).data))
    pool = LastFirst()
    writer = StatusWriter(KubeClient(kube.cluster.api()), pool)
    older = PendingReason(PendingKind.GANG_INCOMPLETE, "pod group train: 1 of its 4 members exist")
    newer = PendingReason(PendingKind.NO_NODE_FITS, "no node has 2 free GPUs")
    writer.record([pod], older)
    writer.record([pod], newer)
    pool.run()  # the newer write first, then the older one
    condition = kube.condition("train-0")
    assert condition is not None and condition["message"] == message(newer), condition
