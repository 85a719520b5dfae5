"""How `gpupool nodes` words a node's state: its liveness, or where it stands in a drain (services.draining)."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any


def state_text(node: dict[str, Any], now: datetime | None = None) -> str:
    """A node's state as `gpupool nodes` says it: its liveness, or "draining (deadline <ISO>, in 1h 5m)", "drained"
    (draining, no task open there), "removing"."""
    if node.get("removing"):
        return "removing"
    if not node.get("drain_since"):
        return str(node["state"])
    if not node.get("tasks"):
        return "drained" if node["state"] == "ready" else f"drained, {node['state']}"
    if not node.get("drain_deadline"):
        return "draining (no deadline)"
    at = datetime.fromisoformat(node["drain_deadline"].replace("Z", "+00:00"))
    left = int((at - (now or datetime.now(UTC))).total_seconds())
    return f"draining (deadline {at.strftime('%Y-%m-%d %H:%M:%S')}Z, {_relative(left)})"


def _relative(seconds: int) -> str:
    if seconds <= 0:
        return "passed: evicting"
    hours, rest = divmod(seconds, 3600)
    return "in " + (f"{hours}h {rest // 60}m" if hours else f"{rest // 60}m {rest % 60}s")
