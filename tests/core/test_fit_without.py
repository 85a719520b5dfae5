"""`fit.without`: the scratch state of a node once some tasks are gone (reservations, making room)."""

from __future__ import annotations

from gpupool.core.fit import fraction_share, lowest_whole_gpus, without
from gpupool.core.model import TaskShape
from gpupool.core.nodes import NodeState


def _empty() -> NodeState:
    return NodeState(64_000, 262_144, (1000,) * 4, (0,) * 4)


def test_without_equals_giving_back_each_task_except_for_tags():
    whole = TaskShape(cpu_milli=4000, memory_mib=1024, gpu_count=2, gpu_milli=1000)
    half = TaskShape(cpu_milli=1000, memory_mib=512, gpu_count=1, gpu_milli=500)
    state = _empty()
    placed = []
    for shape, shares in ((whole, lowest_whole_gpus(state, whole)), (half, fraction_share(half, 3))):
        state = state.take(shape, shares)
        placed.append((shape, shares))
    assert state.tags  # placement tags were recorded
    freed = without(state, placed)
    assert freed == _empty()  # every amount back, tags dropped
    one = without(state, placed[:1])
    assert one.gpu_free == (1000, 1000, 1000, 500) and one.cpu_free == 64_000 - 1000


def test_a_gpu_free_again_leaves_its_sharing_group():
    acme = TaskShape(gpu_count=1, gpu_milli=300, share_group="acme")
    state = _empty().take(acme, fraction_share(acme, 0)).take(acme, fraction_share(acme, 1))
    state = state.take(acme, fraction_share(acme, 1))
    assert state.gpu_groups == ("acme", "acme", "", "")
    after = without(state, [(acme, fraction_share(acme, 1))])
    assert after.gpu_groups == ("acme", "acme", "", "")  # GPU 1 still holds one acme fraction
    after = without(after, [(acme, fraction_share(acme, 0))])
    assert after.gpu_groups == ("", "acme", "", "")
    assert without(after, [(acme, fraction_share(acme, 1))]).gpu_groups == ()
