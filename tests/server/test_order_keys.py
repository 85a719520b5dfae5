"""The control plane's order-signing key on disk (gpupool.server.order_keys): made once, private, reused, never
silently replaced."""

from __future__ import annotations

import stat
import threading

import pytest

from gpupool.protocol.agent import Stop
from gpupool.protocol.signing import OrderVerifier, key_hash
from gpupool.server import order_keys


def test_the_key_is_made_once_private_and_reused(tmp_path):
    path = tmp_path / "data" / "order-signing.key"
    first = order_keys.load_or_create(path)
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    public, pinned = path.with_suffix(".pub").read_text().split()
    assert (public, pinned) == (first.public_key, key_hash(first.public_key))
    again = order_keys.load_or_create(path)
    assert again.public_key == first.public_key
    stop = again.seal(Stop(allocation_id="a", attempt=0, grace_s=1), "n1")
    assert OrderVerifier(first.public_key).verify(stop)


def test_control_planes_starting_together_agree_on_one_key(tmp_path):
    path = tmp_path / "order-signing.key"
    keys: list[str] = []
    threads = [threading.Thread(target=lambda: keys.append(order_keys.load_or_create(path).public_key))
               for _ in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert len(keys) == 8 and len(set(keys)) == 1 and list(tmp_path.glob(".*.tmp")) == []


BAD_PEM = b"-----BEGIN PRIVATE KEY-----\nAAAA\n-----END PRIVATE KEY-----\n"


@pytest.mark.parametrize("content", [b"", b"garbage", BAD_PEM], ids=["empty", "garbage", "bad PEM"])
def test_an_unreadable_key_stops_the_start_instead_of_being_replaced(tmp_path, content):
    path = tmp_path / "order-signing.key"
    path.write_bytes(content)
    with pytest.raises(RuntimeError, match="order-signing key"):
        order_keys.load_or_create(path)
    assert path.read_bytes() == content
