"""KubeClient: the few apiserver calls the backend makes, through the official `kubernetes` client.

Lists and watches return the apiserver's JSON as dicts (`_preload_content=False`): the client's model classes
cost a deserialisation per object per event, and the backend reads a handful of fields. The Binding subresource is
called with `_preload_content=False` too: client 37 fails to deserialise 1.20's answer (ECOSYSTEM.md §6).
Every call raises `kubernetes.client.ApiException` on an error status (`.status`: 404 gone, 409 conflict, 410
watch expired).
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from datetime import UTC, datetime
from typing import Any

from kubernetes import client, config
from kubernetes.watch.watch import iter_resp_lines

#: what gpupool's Events name as their source
COMPONENT = "gpupool"


def load(kubeconfig: str, pool: int = 32) -> client.ApiClient:
    """An API client from a kubeconfig file, or from the pod's service account for "in-cluster"."""
    configuration = client.Configuration()
    if kubeconfig == "in-cluster":
        config.load_incluster_config(client_configuration=configuration)
    else:
        config.load_kube_config(config_file=kubeconfig, client_configuration=configuration)
    configuration.connection_pool_maxsize = pool
    if not configuration.verify_ssl:  # the kubeconfig asks insecure-skip-tls-verify: its choice, not warned per call
        import urllib3

        urllib3.disable_warnings(urllib3.exceptions.InsecureRequestWarning)
    return client.ApiClient(configuration)


def _done(resp: Any) -> bytes:
    """Read an unparsed answer whole and give its connection back to the pool (else every call opens a new TLS
    connection: 40 ms of handshake each)."""
    try:
        return bytes(resp.data)
    finally:
        resp.release_conn()


def now_text() -> str:
    return datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


class KubeClient:
    def __init__(self, api: client.ApiClient) -> None:
        self.api = api
        self.core = client.CoreV1Api(api)

    def _lister(self, kind: str) -> Any:
        return self.core.list_node if kind == "nodes" else self.core.list_pod_for_all_namespaces

    def list(self, kind: str) -> tuple[list[dict[str, Any]], str]:
        """Every object of `kind` ("nodes" or "pods") and the list's resourceVersion."""
        body = json.loads(_done(self._lister(kind)(_preload_content=False)))
        return body.get("items") or [], body["metadata"]["resourceVersion"]

    def watch(self, kind: str, since: str, timeout_s: int) -> Iterator[tuple[str, dict[str, Any]]]:
        """(type, object) events of `kind` after resourceVersion `since`, for at most `timeout_s`; an expired
        version comes as ("ERROR", status object) with code 410."""
        resp = self._lister(kind)(watch=True, resource_version=since, timeout_seconds=timeout_s,
                                  allow_watch_bookmarks=True, _preload_content=False,
                                  _request_timeout=(10, timeout_s + 15))
        try:
            for line in iter_resp_lines(resp):
                if line.strip():
                    event = json.loads(line)
                    yield event["type"], event["object"]
        finally:
            resp.close()
            resp.release_conn()

    def annotate(self, namespace: str, name: str, annotations: dict[str, str]) -> None:
        _done(self.core.patch_namespaced_pod(name, namespace, {"metadata": {"annotations": annotations}},
                                             _preload_content=False))

    def bind(self, namespace: str, name: str, uid: str, node: str, annotations: dict[str, str]) -> None:
        """POST pods/binding, on the pod of that uid only (a pod deleted and created again under its name is left
        alone: 409). The apiserver copies the binding's `annotations` onto the pod as it sets its node: both or
        neither."""
        body = client.V1Binding(metadata=client.V1ObjectMeta(name=name, namespace=namespace, uid=uid,
                                                             annotations=annotations),
                                target=client.V1ObjectReference(api_version="v1", kind="Node", name=node))
        _done(self.core.create_namespaced_pod_binding(name, namespace, body, _preload_content=False))

    def unschedulable(self, namespace: str, name: str, message: str) -> None:
        """Set PodScheduled=False, reason Unschedulable, with `message` (as kube-scheduler does)."""
        condition = {"type": "PodScheduled", "status": "False", "reason": "Unschedulable", "message": message,
                     "lastTransitionTime": now_text()}
        _done(self.core.patch_namespaced_pod_status(name, namespace, {"status": {"conditions": [condition]}},
                                                    _preload_content=False))

    def event(self, namespace: str, name: str, uid: str, reason: str, message: str, kind: str = "Warning") -> None:
        stamp = now_text()
        body = {"metadata": {"generateName": f"{name}.", "namespace": namespace},
                "involvedObject": {"kind": "Pod", "namespace": namespace, "name": name, "uid": uid,
                                   "apiVersion": "v1"},
                "reason": reason, "message": message[:1024], "type": kind, "count": 1,
                "firstTimestamp": stamp, "lastTimestamp": stamp, "source": {"component": COMPONENT}}
        _done(self.core.create_namespaced_event(namespace, body, _preload_content=False))

    def evict(self, namespace: str, name: str, grace_s: int) -> None:
        """The Eviction API (policy/v1beta1 on 1.20), with the victim's grace period."""
        body = {"apiVersion": "policy/v1beta1", "kind": "Eviction",
                "metadata": {"name": name, "namespace": namespace},
                "deleteOptions": {"gracePeriodSeconds": grace_s}}
        _done(self.core.create_namespaced_pod_eviction(name, namespace, body, _preload_content=False))

    def delete(self, namespace: str, name: str, uid: str) -> None:
        """Delete the pod at once (grace 0, as the pod garbage collector does: no kubelet is left to confirm)."""
        _done(self.core.delete_namespaced_pod(name, namespace, body={"preconditions": {"uid": uid},
                                                                     "gracePeriodSeconds": 0}, _preload_content=False))

    def close(self) -> None:
        self.api.close()
