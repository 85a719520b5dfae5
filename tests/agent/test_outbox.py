"""Outbox numbering and acks, log tailing on UTF-8 boundaries, and idle-GPU detection."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from gpupool.agent.clock import ManualClock
from gpupool.agent.idle import IdleDetector
from gpupool.agent.logtail import LogTailer, utf8_cut
from gpupool.agent.outbox import Outbox
from gpupool.protocol.agent import Heartbeat, LogChunk, TaskStatus
from gpupool.protocol.devices import GpuTelemetry

BOOT = "boot-1"


def status(allocation="a", state="started") -> TaskStatus:
    return TaskStatus(boot_id=BOOT, seq=0, allocation_id=allocation, attempt=0, state=state)


def beat() -> Heartbeat:
    return Heartbeat(boot_id=BOOT, seq=0)


def test_seqs_grow_in_send_order_and_hello_takes_its_own():
    box = Outbox(BOOT)
    assert box.next_seq() == 0  # Hello
    box.put(status("a"))
    box.put(beat(), reliable=False)
    box.put(status("b"))
    assert [f.seq for f in box.take()] == [1, 2, 3]
    assert box.in_flight == 2 and box.pending == 0


def test_acks_are_cumulative_and_return_what_they_acknowledge():
    box = Outbox(BOOT)
    for name in "abc":
        box.put(status(name))
    box.take()
    assert [f.allocation_id for f in box.ack(1)] == ["a", "b"]
    assert box.in_flight == 1
    assert box.ack(1) == []
    assert [f.allocation_id for f in box.ack(99)] == ["c"]


def test_requeue_resends_unacked_frames_first_with_new_seqs_and_drops_heartbeats():
    box = Outbox(BOOT)
    box.put(status("a"))
    box.put(status("b"))
    box.take()  # seqs 0, 1
    box.ack(0)
    box.put(beat(), reliable=False)
    box.put(status("c"))
    box.requeue()
    again = box.take()
    assert [(f.allocation_id, f.seq) for f in again] == [("b", 2), ("c", 3)]


def test_on_put_wakes_the_writer():
    calls = []
    box = Outbox(BOOT, on_put=lambda: calls.append(1))
    box.put(beat(), reliable=False)
    assert calls == [1]


def test_unacked_log_characters_are_counted():
    box = Outbox(BOOT)
    box.put(LogChunk(boot_id=BOOT, seq=0, allocation_id="a", attempt=0, offset=0, data="x" * 10))
    assert box.unacked_log_chars == 10
    [frame] = box.take()
    assert box.unacked_log_chars == 10
    box.ack(frame.seq)
    assert box.unacked_log_chars == 0


@pytest.mark.parametrize(
    ("data", "want"),
    [
        (b"abc", 3),
        (b"", 0),
        ("é".encode(), 2),
        ("é".encode()[:1], 0),
        (b"ab" + "€".encode()[:2], 2),
        (b"ab" + "€".encode(), 5),
        (b"a" + "😀".encode()[:3], 1),
        (b"\x80\x80\x80\x80", 4),  # garbage is passed on (and decoded as U+FFFD)
    ],
)
def test_utf8_cut(data, want):
    assert utf8_cut(data) == want


@given(st.text(max_size=200), st.integers(4, 40))
def test_tailing_in_small_chunks_reassembles_the_text(tmp_path_factory, text, chunk):
    path = tmp_path_factory.mktemp("tail") / "log"
    path.write_bytes(text.encode())
    tailer = LogTailer(path, max_chunk_bytes=chunk)
    chunks = tailer.read(10_000)
    assert "".join(c.text for c in chunks) == text
    assert all(c.end - c.offset <= chunk for c in chunks)
    assert [c.offset for c in chunks[1:]] == [c.end for c in chunks[:-1]]
    assert tailer.at_eof()


def test_tailer_holds_back_a_split_character_until_final(tmp_path):
    path = tmp_path / "log"
    path.write_bytes(b"ok " + "€".encode()[:2])
    tailer = LogTailer(path)
    assert [c.text for c in tailer.read(100)] == ["ok "]
    assert tailer.read(100) == []
    assert [c.text for c in tailer.read(100, final=True)] == ["\ufffd"]
    assert tailer.at_eof()


def test_tailer_respects_budget_and_resumes(tmp_path):
    path = tmp_path / "log"
    path.write_bytes(b"x" * 100)
    tailer = LogTailer(path, max_chunk_bytes=32)
    first = tailer.read(70)
    assert [c.end - c.offset for c in first] == [32, 32, 6]
    assert LogTailer(path, offset=tailer.offset).read(1000)[0].offset == 70


def test_tailer_of_a_missing_file_reads_nothing(tmp_path):
    tailer = LogTailer(tmp_path / "nope")
    assert tailer.read(100) == [] and tailer.at_eof()


def sample(uuid: str, util: int) -> GpuTelemetry:
    return GpuTelemetry(uuid=uuid, utilization_pct=util, memory_used_mib=0)


def test_a_gpu_below_the_threshold_for_the_whole_window_is_idle():
    clock = ManualClock()
    idle = IdleDetector(clock, threshold_pct=5, window_s=1800)
    for _ in range(360):
        assert idle.observe([sample("A", 4), sample("B", 50)]) == []
        clock.advance(5)
    assert idle.observe([sample("A", 4), sample("B", 50)]) == ["A"]


def test_one_busy_sample_restarts_the_window():
    clock = ManualClock()
    idle = IdleDetector(clock, window_s=100)
    idle.observe([sample("A", 0)])
    clock.advance(90)
    idle.observe([sample("A", 5)])  # at the threshold counts as busy
    clock.advance(90)
    assert idle.observe([sample("A", 0)]) == []
    clock.advance(100)
    assert idle.observe([sample("A", 0)]) == ["A"]
    assert idle.observe([sample("A", 0)], in_use={"B"}) == []


def test_vanished_gpus_are_forgotten():
    clock = ManualClock()
    idle = IdleDetector(clock, window_s=10)
    idle.observe([sample("A", 0)])
    clock.advance(5)
    idle.observe([])
    clock.advance(10)
    assert idle.observe([sample("A", 0)]) == []


def test_idle_detector_rejects_bad_settings():
    with pytest.raises(ValueError):
        IdleDetector(ManualClock(), threshold_pct=0)
    with pytest.raises(ValueError):
        IdleDetector(ManualClock(), window_s=0)
