"""Devices: a fraction goes to the GPU with the least free milli that still fits (lowest index on
ties); whole GPUs are the lowest-index fully free ones."""

from __future__ import annotations

import random

from gpupool.core.fit import fitting_gpus, fraction_share, lowest_whole_gpus
from gpupool.core.framework import DevicePlugin
from gpupool.core.model import DeviceShare, TaskShape
from gpupool.core.nodes import NodeKind, NodeState


class BestFitDevices(DevicePlugin):
    name = "best_fit"

    def pick_devices(
        self, kind: NodeKind, state: NodeState, shape: TaskShape, rng: random.Random
    ) -> tuple[DeviceShare, ...]:
        if not shape.is_shared:
            return lowest_whole_gpus(state, shape)
        gpu = min(fitting_gpus(state, shape), key=lambda g: (state.gpu_free[g], g))
        return fraction_share(shape, gpu)
