"""A gang's rendezvous as the control plane gives it to each task (gpupool.server.scheduler.gang.rendezvous)."""

from __future__ import annotations

from gpupool.server.scheduler.gang import rendezvous

ADDRESSES = {"na": "10.0.0.1", "nb": "10.0.0.2"}


def test_ranks_local_ranks_and_the_hostfile_follow_task_order_per_node():
    members = [(2, "na"), (0, "nb"), (1, "na"), (3, "nb")]
    got = {i: rendezvous(members, ADDRESSES, i, 29500) for i in range(4)}
    assert {i: (r.rank, r.local_rank, r.local_world_size) for i, r in got.items() if r} == {
        0: (0, 0, 2), 1: (1, 0, 2), 2: (2, 1, 2), 3: (3, 1, 2)}
    first = got[0]
    assert first is not None and first.world_size == 4 and first.master_addr == "10.0.0.2"  # task 0's node
    assert [(h.address, h.slots) for h in first.hosts] == [("10.0.0.2", 2), ("10.0.0.1", 2)]


def test_task_0_leaves_the_port_to_its_agent_and_a_single_task_has_no_rendezvous():
    r = rendezvous([(0, "na"), (1, "nb")], ADDRESSES, 0, 0)
    assert r is not None and r.master_port == 0
    assert rendezvous([(0, "na")], ADDRESSES, 0, 0) is None


def test_a_node_without_a_known_address_is_named_by_its_id():
    r = rendezvous([(0, "nc"), (1, "na")], ADDRESSES, 1, 1234)
    assert r is not None and r.master_addr == "nc" and r.hosts[1].address == "10.0.0.1"
