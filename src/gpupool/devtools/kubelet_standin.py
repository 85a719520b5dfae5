"""A KUBELET STAND-IN (test tooling, never part of the product): there is no kubelet or container runtime on the
fake nodes, so this moves pods bound to nodes labelled `gpupool.io/fake-node` through their phases as a kubelet
would report them: Running once bound, then, after the seconds in the annotation `gpupool.test/run-seconds`,
Succeeded (or Failed when `gpupool.test/exit` is "failed"); a pod being deleted (evicted) is stopped at once and its
deletion confirmed. Departures are thus real API events. Pods without the annotation run until deleted."""

from __future__ import annotations

import json
import logging
import threading
import time
from datetime import UTC, datetime
from typing import Any

RUN_SECONDS = "gpupool.test/run-seconds"
EXIT = "gpupool.test/exit"

log = logging.getLogger(__name__)


def _now() -> str:
    return datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


class KubeletStandIn:
    """Polls bound pods every `poll_s` (a stand-in: simplicity over a watch) and patches their status."""

    def __init__(self, core: Any, poll_s: float = 0.2) -> None:
        self.core, self.poll_s = core, poll_s
        self.started: dict[str, float] = {}  # pod uid -> when it was marked Running
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="kubelet-standin", daemon=True)

    def __enter__(self) -> KubeletStandIn:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(timeout=10)

    def _run(self) -> None:
        while not self._stop.wait(self.poll_s):
            try:
                self.tick()
            except Exception as exc:  # the apiserver restarting: try again
                log.info("kubelet stand-in: %s", exc)

    def tick(self) -> None:
        fake = {n["metadata"]["name"] for n in json.loads(self.core.list_node(
            label_selector="gpupool.io/fake-node=true", _preload_content=False).data)["items"]}
        pods = json.loads(self.core.list_pod_for_all_namespaces(
            field_selector="spec.nodeName!=", _preload_content=False).data)["items"]
        now = time.monotonic()
        for pod in pods:
            meta, phase = pod["metadata"], (pod.get("status") or {}).get("phase", "Pending")
            if pod["spec"].get("nodeName") not in fake:
                continue
            if meta.get("deletionTimestamp"):  # evicted or deleted: the kubelet stops it and confirms at once
                self.core.delete_namespaced_pod(meta["name"], meta["namespace"], body={"gracePeriodSeconds": 0},
                                                _preload_content=False)
                continue
            if phase in ("Succeeded", "Failed"):
                continue
            if phase == "Pending":
                self._phase(pod, "Running")
                self.started[meta["uid"]] = now
                continue
            seconds = (meta.get("annotations") or {}).get(RUN_SECONDS)
            began = self.started.setdefault(meta["uid"], now)
            if seconds is not None and now - began >= float(seconds):
                failed = (meta.get("annotations") or {}).get(EXIT) == "failed"
                self._phase(pod, "Failed" if failed else "Succeeded")

    def _phase(self, pod: dict[str, Any], phase: str) -> None:
        meta = pod["metadata"]
        status: dict[str, Any] = {"phase": phase, "conditions": [
            {"type": "Ready", "status": "True" if phase == "Running" else "False", "lastTransitionTime": _now()}]}
        if phase == "Running":
            status["startTime"] = _now()
        self.core.patch_namespaced_pod_status(meta["name"], meta["namespace"], {"status": status},
                                              _preload_content=False)
