"""Which nodes a pod may go to: nodeSelector, required node affinity, and NoSchedule/NoExecute taints against the
pod's tolerations (kube-scheduler's NodeAffinity and TaintToleration filters, required parts only).

The core knows none of this: a pod's constraints are compiled to one opaque tag (`signature`), given to every node
that satisfies them (`NodeSpec.labels`) and asked by the pod's shape (`TaskShape.node_labels`).
"""

from __future__ import annotations

import hashlib
import json
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from gpupool.server.kube.objects import KubeNode


def constraints(spec: dict[str, Any]) -> dict[str, Any]:
    """The parts of a pod's spec that restrict its nodes (empty: any untainted node)."""
    required = (((spec.get("affinity") or {}).get("nodeAffinity") or {})
                .get("requiredDuringSchedulingIgnoredDuringExecution") or {})
    out: dict[str, Any] = {}
    if spec.get("nodeSelector"):
        out["selector"] = spec["nodeSelector"]
    if required.get("nodeSelectorTerms"):
        out["terms"] = required["nodeSelectorTerms"]
    if spec.get("tolerations"):
        out["tolerations"] = spec["tolerations"]
    return out


def signature(found: dict[str, Any]) -> str:
    """A short stable tag naming a set of constraints."""
    text = json.dumps(found, sort_keys=True, separators=(",", ":"))
    return "k8s:" + hashlib.sha256(text.encode()).hexdigest()[:12]


def allows(node: KubeNode, found: dict[str, Any]) -> bool:
    """Whether `node` satisfies the constraints `found` (from `constraints`)."""
    selector = found.get("selector") or {}
    if any(node.labels.get(k) != v for k, v in selector.items()):
        return False
    terms = found.get("terms")
    if terms and not any(_term(node, t) for t in terms):
        return False
    return all(_tolerated(taint, found.get("tolerations") or []) for taint in node.taints)


def _term(node: KubeNode, term: dict[str, Any]) -> bool:
    """A node selector term: all of its expressions hold (an empty term matches nothing, as in Kubernetes)."""
    exprs = term.get("matchExpressions") or []
    fields = term.get("matchFields") or []
    if not exprs and not fields:
        return False
    return (all(_expr(node.labels, e) for e in exprs)
            and all(_expr({"metadata.name": node.name}, f) for f in fields))


def _expr(labels: dict[str, str], expr: dict[str, Any]) -> bool:
    key, op, values = expr.get("key", ""), expr.get("operator", ""), expr.get("values") or []
    have = labels.get(key)
    if op == "In":
        return have in values
    if op == "NotIn":
        return have not in values
    if op == "Exists":
        return have is not None
    if op == "DoesNotExist":
        return have is None
    if op in ("Gt", "Lt") and have is not None and have.lstrip("-").isdigit() and values:
        return int(have) > int(values[0]) if op == "Gt" else int(have) < int(values[0])
    return False


def _tolerated(taint: tuple[str, str, str], tolerations: list[dict[str, Any]]) -> bool:
    key, value, effect = taint
    for t in tolerations:
        if t.get("effect") and t["effect"] != effect:
            continue
        if t.get("operator") == "Exists" and (not t.get("key") or t["key"] == key):
            return True
        if t.get("key") == key and t.get("value", "") == value:
            return True
    return False
