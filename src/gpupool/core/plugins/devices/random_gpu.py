"""Devices: a fraction goes to a GPU drawn uniformly (seeded) among those that fit; whole GPUs are
the lowest-index fully free ones."""

from __future__ import annotations

import random

from gpupool.core.fit import fitting_gpus, fraction_share, lowest_whole_gpus
from gpupool.core.framework import DevicePlugin
from gpupool.core.model import DeviceShare, TaskShape
from gpupool.core.nodes import NodeKind, NodeState


class RandomDevices(DevicePlugin):
    name = "random_gpu"
    uses_rng = True

    def pick_devices(
        self, kind: NodeKind, state: NodeState, shape: TaskShape, rng: random.Random
    ) -> tuple[DeviceShare, ...]:
        if not shape.is_shared:
            return lowest_whole_gpus(state, shape)
        gpus = fitting_gpus(state, shape)
        return fraction_share(shape, gpus[rng.randrange(len(gpus))])
