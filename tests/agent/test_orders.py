"""Launch-order checks: duplicates, stale epochs, expiry and foreign GPUs; the persisted epoch record."""

from __future__ import annotations

import pytest

from gpupool.agent.orders import EpochRecord, OrderCheck, check_order
from gpupool.protocol.agent import GpuGrant, Launch

NOW = 1_000_000.0


def order(allocation="a1", attempt=0, epoch=5, expires_at=NOW + 120, gpus=("GPU-1",)) -> Launch:
    grants = [GpuGrant(uuid=u, index=i, milli=1000, memory_mib=0) for i, u in enumerate(gpus)]
    return Launch(
        allocation_id=allocation,
        attempt=attempt,
        job_id="j",
        task_index=0,
        command=["true"],
        gpus=grants,
        epoch=epoch,
        expires_at=expires_at,
    )


def check(launch: Launch, highest_epoch=5, known=(), gpu_uuids=None) -> OrderCheck:
    return check_order(launch, now=NOW, highest_epoch=highest_epoch, known=known, gpu_uuids=gpu_uuids)


def test_a_fresh_order_is_launched():
    assert check(order()) == OrderCheck("launch")


def test_an_order_expiring_exactly_now_is_still_valid():
    assert check(order(expires_at=NOW)).action == "launch"


def test_an_expired_order_is_refused():
    verdict = check(order(expires_at=NOW - 0.001))
    assert verdict.action == "refuse" and "expired" in verdict.reason


def test_an_order_from_an_older_epoch_is_refused():
    verdict = check(order(epoch=4), highest_epoch=5)
    assert verdict.action == "refuse" and "epoch 4 < highest seen 5" in verdict.reason


def test_a_newer_epoch_is_accepted():
    assert check(order(epoch=6), highest_epoch=5).action == "launch"


def test_a_known_workload_is_a_duplicate_even_when_expired_or_stale():
    known = {("a1", 0)}
    assert check(order(), known=known).action == "duplicate"
    assert check(order(expires_at=NOW - 1, epoch=1), known=known).action == "duplicate"


def test_another_attempt_of_a_known_allocation_is_not_a_duplicate():
    assert check(order(attempt=1), known={("a1", 0)}).action == "launch"


def test_gpus_of_another_node_are_refused():
    verdict = check(order(gpus=("GPU-1", "GPU-9")), gpu_uuids={"GPU-1", "MIG-2"})
    assert verdict.action == "refuse" and "GPU-9" in verdict.reason
    assert check(order(gpus=("MIG-2",)), gpu_uuids={"GPU-1", "MIG-2"}).action == "launch"


def test_epoch_record_only_grows_and_persists(tmp_path):
    path = tmp_path / "epoch"
    record = EpochRecord(path)
    assert record.highest == 0
    record.observe(7)
    record.observe(3)
    assert record.highest == 7
    assert EpochRecord(path).highest == 7


@pytest.mark.parametrize("content", ["garbage", "-3", ""])
def test_unreadable_epoch_record_starts_at_zero(tmp_path, content):
    (tmp_path / "epoch").write_text(content)
    assert EpochRecord(tmp_path / "epoch").highest == 0


def test_in_memory_epoch_record():
    record = EpochRecord()
    record.observe(2)
    assert record.highest == 2
