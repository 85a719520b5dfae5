"""The scheduling framework: the contract that actions and plugins are written against, and the runtime that runs
them. It imports the model below it and no action or plugin (import-linter contracts in pyproject.toml).

- `interfaces`: the plugin extension points (filter, score, devices, queue order, victims) and `QueueView`;
- `action`: the action extension point;
- `status`: expected outcomes of plugins as values;
- `session`: the `Cycle` an action is handed, the `Plugins` it calls and the `Reservation`s it leaves;
- `placement`: the placement engine that runs filter, score and device plugins at cache speed;
- `registry`: the `Registry` value (name -> factory);
- `runtime`: `Profile` (validated data) and `Framework` (a profile made concrete);
- `cycle_state`: a typed per-cycle scratchpad for plugins.

The names re-exported here are what an out-of-tree action or plugin needs.
"""

from gpupool.core.framework.action import Action
from gpupool.core.framework.interfaces import (
    DevicePlugin,
    FilterPlugin,
    Plugin,
    QueueOrderPlugin,
    QueueView,
    ScorePlugin,
    VictimPlugin,
)
from gpupool.core.framework.session import Cycle, Plugins, Reservation
from gpupool.core.framework.status import OK, Code, Status

__all__ = [
    "OK",
    "Action",
    "Code",
    "Cycle",
    "DevicePlugin",
    "FilterPlugin",
    "Plugin",
    "Plugins",
    "QueueOrderPlugin",
    "QueueView",
    "Reservation",
    "ScorePlugin",
    "Status",
    "VictimPlugin",
]
