"""Statement: checkpoint/rollback restores the node table and task sets exactly (Hypothesis)."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gpupool.core import ClusterSnapshot, RunningTask, nodes
from gpupool.core.fit import fitting_gpus, fraction_share, lowest_whole_gpus
from gpupool.core.statement import Statement, StatementState, Workspace
from gpupool.core.testing.builders import make_job, make_node, make_shape, table_of

SHAPES = [make_shape(300, cpu_milli=1000), make_shape(1000, cpu_milli=2000), make_shape(1000, gpu_count=2),
          make_shape(0, cpu_milli=4000)]


def _world():
    table = table_of(make_node("a", gpus=2), make_node("b", gpus=4), make_node("c", gpus=1))
    running = {
        "r1": RunningTask("r1", "j-r1", "b", SHAPES[1], lowest_whole_gpus(table.states[1], SHAPES[1])),
    }
    i = table.index["b"]
    table.set_state(i, table.states[i].take(SHAPES[1], running["r1"].shares))
    return ClusterSnapshot(table, running=running)


def _view(ws: Workspace):
    _check_keys(ws.table)
    return list(ws.table.states), dict(ws.overlay)


def _check_keys(table) -> None:
    """Every node's key is the one its table's numbering gives its (kind, state)."""
    assert table.keys == [table._key_ids[(table._kind_of[i], state)] for i, state in enumerate(table.states)]
    assert table.key_array().tolist() == table.keys


def _running(ws: Workspace) -> list[RunningTask]:
    """Every task running now, from first principles: the overlay's latest word, else the snapshot's."""
    ids = sorted(set(ws.snapshot.running) | set(ws.overlay))
    return [t for t in (ws.overlay.get(i, ws.snapshot.running.get(i)) for i in ids) if t is not None]


def _check_views(ws: Workspace) -> None:
    """`still_running` and `job_tasks` agree with `_running`, whatever was placed, moved, evicted or undone."""
    now = _running(ws)
    assert sorted(ws.still_running(), key=lambda t: t.task_id) == [t for t in now if t.task_id in ws.snapshot.running]
    for job_id in {t.job_id for t in now} | {"j-r1"}:
        assert ws.job_tasks(job_id) == [t for t in now if t.job_id == job_id]


ops = st.lists(st.tuples(st.sampled_from(["alloc", "evict", "move", "checkpoint", "rollback"]),
                         st.integers(0, 3), st.integers(0, 2)), max_size=25)


@pytest.mark.parametrize("key_limit", [nodes._KEY_LIMIT, 4], ids=["as shipped", "numbered again often"])
@settings(max_examples=200, deadline=None)
@given(ops)
def test_rollback_restores_exactly_what_checkpoint_saw(key_limit, sequence):
    """Also the nodes' keys, when the table numbers its pairs again between a change and its undoing; device picks
    are reused per (key, shape) as the placement engine does, so placements are also replayed from memory."""
    shipped, nodes._KEY_LIMIT = nodes._KEY_LIMIT, key_limit
    try:
        _apply(sequence)
    finally:
        nodes._KEY_LIMIT = shipped


def _apply(sequence):
    ws = Workspace(_world())
    stmt = Statement(ws, now=0.0)
    saved = []
    picks: dict = {}
    for n, (op, shape_i, node_i) in enumerate(sequence):
        shape = SHAPES[shape_i]
        state = ws.table.states[node_i]
        if op == "alloc" and len(fitting_gpus(state, shape)) >= shape.gpu_count and state.cpu_free >= shape.cpu_milli:
            gpus = fitting_gpus(state, shape)
            shares = picks.setdefault((ws.table.numbering, ws.table.keys[node_i], shape_i), fraction_share(
                shape, gpus[0]) if shape.is_shared else lowest_whole_gpus(state, shape))
            job = make_job(f"j{n}", shape)
            stmt.allocate(job, job.tasks[0], node_i, shares)
        elif op == "evict":
            victims = _running(ws)
            if victims:
                stmt.evict(victims[shape_i % len(victims)], "test")
        elif op == "move":
            movable = _running(ws)
            if movable:
                task = movable[shape_i % len(movable)]
                target = ws.table.states[node_i]
                if task.node != ws.table.names[node_i] and task.shape.gpu_count <= len(
                        fitting_gpus(target, task.shape)) and target.cpu_free >= task.shape.cpu_milli:
                    gpus = fitting_gpus(target, task.shape)
                    shares = (fraction_share(task.shape, gpus[0]) if task.shape.is_shared
                              else lowest_whole_gpus(target, task.shape))
                    stmt.move(task, node_i, shares)
        elif op == "checkpoint":
            saved.append((stmt.checkpoint(), _view(ws)))
        elif op == "rollback" and saved:
            cp, view = saved.pop()
            stmt.rollback(cp)
            assert _view(ws) == view
        _check_views(ws)
    before = _world()
    stmt.discard()
    assert ws.table.states == before.nodes.states
    assert ws.overlay == {}
    _check_keys(ws.table)


def test_commit_keeps_changes_until_workspace_restore():
    ws = Workspace(_world())
    original = list(ws.table.states)
    with Statement(ws, 0.0) as stmt:
        job = make_job("j", SHAPES[1])
        stmt.allocate(job, job.tasks[0], 0, lowest_whole_gpus(ws.table.states[0], SHAPES[1]))
        decisions = stmt.commit()
    assert len(decisions) == 1 and decisions[0].node == "a"
    assert ws.table.states != original
    ws.restore()
    assert ws.table.states == original


def test_statement_discards_on_exception():
    ws = Workspace(_world())
    original = list(ws.table.states)
    with pytest.raises(RuntimeError), Statement(ws, 0.0) as stmt:
        job = make_job("j", SHAPES[1])
        stmt.allocate(job, job.tasks[0], 0, lowest_whole_gpus(ws.table.states[0], SHAPES[1]))
        raise RuntimeError("boom")
    assert ws.table.states == original and stmt.state is StatementState.DISCARDED


def test_closed_statement_refuses_changes():
    ws = Workspace(_world())
    stmt = Statement(ws, 0.0)
    stmt.commit()
    with pytest.raises(RuntimeError, match="committed"):
        stmt.discard()


def test_overcommit_is_a_bug_not_an_outcome():
    ws = Workspace(_world())
    job = make_job("j", make_shape(1000, gpu_count=2))
    with pytest.raises(ValueError, match="overcommits"), Statement(ws, 0.0) as stmt:
        stmt.allocate(job, job.tasks[0], 2, lowest_whole_gpus(ws.table.states[0], job.tasks[0].shape))


@settings(max_examples=60, deadline=None)
@given(st.lists(st.tuples(st.sampled_from([250, 1000, 2000]), st.booleans()), max_size=12))
def test_node_state_tags_count_placed_tasks_by_kind(moves):
    """A state's tags are the sorted multiset of its tasks' tags, whatever order tasks come and go in; taking more
    than is free is a bug that raises."""
    from collections import Counter

    from gpupool.core.model import DeviceShare
    from gpupool.core.nodes import NodeKind, NodeState, shape_tag
    node = make_node("n", gpus=8)
    state, placed = NodeState.empty(NodeKind.of(node)), []
    for milli, remove in moves:
        shape = make_shape(milli) if milli <= 1000 else make_shape(1000, gpu_count=2)
        if remove and placed:
            gone_shape, shares = placed.pop(0)
            state = state.give(gone_shape, shares)
        else:
            gpus = fitting_gpus(state, shape)
            if len(gpus) < shape.gpu_count:
                with pytest.raises(ValueError, match="overcommits"):
                    state.take(shape, tuple(DeviceShare(g, 1000, 0) for g in range(shape.gpu_count)))
                continue
            shares = fraction_share(shape, gpus[0]) if shape.is_shared else lowest_whole_gpus(state, shape)
            state = state.take(shape, shares)
            placed.append((shape, shares))
        assert state.tags == tuple(sorted(Counter(shape_tag(s) for s, _ in placed).items()))


def test_removing_a_task_that_was_never_placed_is_a_bug():
    from gpupool.core.nodes import NodeKind, NodeState
    state = NodeState.empty(NodeKind.of(make_node("n", gpus=2)))
    placed = state.take(make_shape(250), fraction_share(make_shape(250), 0))
    with pytest.raises(ValueError, match="more often"):
        placed.give(make_shape(1000), ())
