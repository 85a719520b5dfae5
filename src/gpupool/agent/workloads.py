"""The node's workloads as the channel sees them: orders in, task statuses and log chunks out.

`Workloads` is the synchronous core of the channel. It never touches the network: it turns server orders into
runtime calls and puts the resulting `TaskStatus` and `LogChunk` frames into the `Outbox`; the channel moves
frames and runs the blocking `runtime.stop` calls in worker threads. Every method runs on the event-loop thread.

Task status rules (what the control plane is told):
* "started" once a launch succeeded; a duplicate launch repeats the latest status instead of starting again;
* "refused" for an order `check_order` refuses, and for a Stop of a workload this node does not have; a refusal is
  final: the same (allocation, attempt) ordered again is answered "refused" again, never started (the control plane
  released it on the first answer). A stop order that is not signed for this node is ignored and only logged:
  answering it would report on a workload that may be running;
* "failed" when the runtime cannot start it (whatever it raises: a LaunchError, the OSError or ValueError of exec,
  the failpoint `agent.launch`), for a signed order that breaks the protocol's rules (`on_invalid_launch`), and when
  it ended without a recorded exit code; the reason goes into the message. Like a refusal it is final: the same
  (allocation, attempt) ordered again (an order re-sent after a reconnect) is answered "failed" again at once,
  never launched again, and the channel stays up;
* "fenced" when it was stopped by self-fencing (the mark survives an agent restart);
* "exited" with the exit code otherwise (a stop order's reason goes into the message).
A workload's record is dropped (and `runtime.forget` called) once its final status is acked and its whole log has
been sent and acked; the final status of the last `FINISHED_MEMORY` dropped workloads is kept to answer duplicates.
"""

from __future__ import annotations

import logging
from collections import OrderedDict
from collections.abc import Collection, Iterable, Mapping
from dataclasses import dataclass, field, replace
from typing import Any, Literal

from gpupool.agent.clock import Clock
from gpupool.agent.failpoints import Failpoints
from gpupool.agent.logtail import LogTailer
from gpupool.agent.orders import (
    EpochRecord,
    authenticate,
    check_order,
    launch_problem,
    order_key,
    unchecked_launch,
)
from gpupool.agent.outbox import Outbox, OutFrame
from gpupool.agent.rendezvous import hold_free_port
from gpupool.agent.runtime.base import LaunchError, LaunchSpec, RunHandle, WorkloadKey, WorkloadRuntime
from gpupool.protocol.agent import Launch, LogChunk, RunningReport, Stop, TaskStatus
from gpupool.protocol.signing import OrderVerifier

log = logging.getLogger(__name__)

FENCED_NOTE = "fenced"
FINISHED_MEMORY = 1024
LOG_WINDOW_CHARS = 256 * 1024
LOG_TICK_BYTES = 128 * 1024
LOG_ACKED_FILE = "log.acked"
MAX_MESSAGE = 2000  # TaskStatus.message
StatusState = Literal["started", "exited", "failed", "fenced", "refused"]


@dataclass
class Workload:
    """One workload this agent knows about, with its log tail and reporting progress."""

    handle: RunHandle
    tail: LogTailer
    stop_reason: str = ""
    stopping: bool = False
    final: TaskStatus | None = None
    final_acked: bool = False
    chunk_ends: dict[int, int] = field(default_factory=dict)
    #: the MASTER_PORT this node chose for the gang whose task 0 this is (repeated with "started")
    rendezvous_port: int | None = None

    @property
    def fenced(self) -> bool:
        return self.handle.note == FENCED_NOTE


class Workloads:
    """See the module docstring. `gpu_uuids` (GPU and MIG UUIDs of this node) makes orders for other GPUs refused;
    `node_id` and `verifier` (the pinned control-plane key) make orders for other nodes and unsigned, forged or
    tampered orders refused (see `orders.check_order`). `failpoints` may make launches fail (tests)."""

    def __init__(
        self,
        runtime: WorkloadRuntime,
        outbox: Outbox,
        *,
        wall_clock: Clock,
        epochs: EpochRecord | None = None,
        gpu_uuids: Collection[str] | None = None,
        node_id: str | None = None,
        verifier: OrderVerifier | None = None,
        log_window_chars: int = LOG_WINDOW_CHARS,
        failpoints: Failpoints | None = None,
    ) -> None:
        self._runtime = runtime
        self._outbox = outbox
        self._wall = wall_clock
        self._epochs = epochs if epochs is not None else EpochRecord()
        self._gpus = None if gpu_uuids is None else frozenset(gpu_uuids)
        self._node_id = node_id
        self._verifier = verifier
        self._log_window = log_window_chars
        self._failpoints = failpoints if failpoints is not None else Failpoints()
        self._items: dict[WorkloadKey, Workload] = {}
        self._finished: OrderedDict[WorkloadKey, TaskStatus] = OrderedDict()
        self._refused: OrderedDict[WorkloadKey, TaskStatus] = OrderedDict()  # apart: forged orders cannot evict

    def __contains__(self, key: object) -> bool:
        return key in self._items

    def get(self, key: WorkloadKey) -> Workload | None:
        return self._items.get(key)

    def keys(self) -> list[WorkloadKey]:
        return list(self._items)

    def adopt(self, handles: Iterable[RunHandle]) -> None:
        """Take over workloads found on disk by `runtime.adopt()`; their logs resume at the last acked offset."""
        for handle in handles:
            tail = LogTailer(handle.log_path, offset=_read_acked_offset(handle))
            self._items[handle.key] = Workload(handle=handle, tail=tail)

    def running_reports(self) -> list[RunningReport]:
        """What Hello says: every workload not yet forgotten, except fenced ones (they are reported "fenced") and those
        of a previous boot of the machine (they ended with it: the control plane requeues what Hello leaves out)."""
        reports = []
        for w in self._items.values():
            if w.fenced or not self._runtime.of_this_boot(w.handle):
                continue
            if w.final is None:
                reports.append(
                    RunningReport(
                        allocation_id=w.handle.allocation_id,
                        attempt=w.handle.attempt,
                        pid=w.handle.pid,
                        state="running",
                    )
                )
            else:
                reports.append(
                    RunningReport(
                        allocation_id=w.handle.allocation_id,
                        attempt=w.handle.attempt,
                        pid=w.handle.pid,
                        state="exited",
                        exit_code=w.final.exit_code,
                    )
                )
        return reports

    def on_launch(self, order: Launch) -> None:
        """Check the order, then launch, refuse, or repeat the status of a duplicate."""
        key = (order.allocation_id, order.attempt)
        known = self._items.keys() | self._finished.keys() | self._refused.keys()
        verdict = check_order(
            order,
            now=self._wall.now(),
            highest_epoch=self._epochs.highest,
            known=known,
            gpu_uuids=self._gpus,
            node_id=self._node_id,
            verifier=self._verifier,
        )
        if verdict.action == "refuse":
            self._refuse(key, verdict.reason)
        elif verdict.action == "duplicate":
            self._repeat(key)
        else:
            self._launch(order)

    def on_invalid_launch(self, frame: Mapping[str, Any]) -> None:
        """A launch frame that breaks the protocol's rules (`Launch`: a NUL in its command, say). It is never launched.
        A known (allocation, attempt) repeats its status; an authentic order (signed by the pinned key, for this node)
        is answered "failed" naming the fields (`orders.launch_problem`), since it would fail on any node; any other
        is refused as `check_order` refuses a forged one. An order whose key cannot be read is only logged."""
        key = order_key(frame)
        problem = launch_problem(frame)
        if key is None:
            log.warning("ignoring a launch order whose allocation and attempt cannot be read: %s", problem)
            return
        if key in self._items or key in self._finished or key in self._refused:
            self._repeat(key)
            return
        order = unchecked_launch(frame)
        forged = "not a launch order's fields" if order is None else authenticate(
            order, node_id=self._node_id, verifier=self._verifier)
        if forged is not None:
            self._refuse(key, forged)
        else:
            self._fail(key, f"invalid launch order: {problem}")

    def on_stop(self, order: Stop) -> RunHandle | None:
        """Mark the workload as stopping and return its handle for `runtime.stop`; None when nothing is to stop."""
        key = (order.allocation_id, order.attempt)
        problem = authenticate(order, node_id=self._node_id, verifier=self._verifier)
        if problem is not None:
            log.warning("ignoring stop order for %s: %s", key, problem)
            return None
        workload = self._items.get(key)
        if workload is None:
            self._repeat(key, unknown="refused")
            return None
        if workload.final is not None:
            self._put(workload.final)
            return None
        if workload.stopping:
            return None  # a stop (or fencing) is already under way: keep its reason
        workload.stop_reason = order.reason or "stop order"
        workload.stopping = True
        return workload.handle

    def fence(self, silence_s: float = float("inf"), default_s: float = 0.0) -> list[RunHandle]:
        """Mark fenced (persistently) every live workload whose max_disconnect (`default_s` for one without its own)
        the control plane's silence of `silence_s` has reached, and return their handles, to be stopped at once."""
        handles = []
        for workload in self._items.values():
            if workload.final is None and not workload.fenced and silence_s >= _limit(workload, default_s):
                workload.handle = self._runtime.set_note(workload.handle, FENCED_NOTE)
                workload.stopping = True
                handles.append(workload.handle)
        return handles

    def time_left(self, silence_s: float, default_s: float) -> float | None:
        """Seconds until the next live workload is fenced after a silence of `silence_s` (None: none is left)."""
        left = [_limit(w, default_s) - silence_s for w in self._items.values() if w.final is None and not w.fenced]
        return max(0.0, min(left)) if left else None

    def tick(self, *, connected: bool) -> None:
        """Tail logs (when connected), report exits, and drop fully reported workloads."""
        for workload in list(self._items.values()):
            if connected:
                self._tail(workload)
            if workload.final is None:
                self._check_exit(workload, connected)
            if self._done(workload):
                self._drop(workload)

    def on_acked(self, frames: Iterable[OutFrame]) -> None:
        """The control plane has these frames: note final statuses and log progress."""
        for frame in frames:
            if not isinstance(frame, TaskStatus | LogChunk):
                continue
            workload = self._items.get((frame.allocation_id, frame.attempt))
            if workload is None:
                continue
            if isinstance(frame, TaskStatus) and workload.final is not None and frame.state == workload.final.state:
                workload.final_acked = True
            elif isinstance(frame, LogChunk):
                end = workload.chunk_ends.pop(frame.offset, None)
                if end is not None:
                    _write_acked_offset(workload.handle, end)

    def _launch(self, order: Launch) -> None:
        """Start a checked order; if anything stops it, answer "failed" with why (see the module docstring). Task 0
        of a gang whose order leaves MASTER_PORT to this node gets a free port, held until the task starts and
        reported with "started"."""
        spec = LaunchSpec.from_launch(order)
        log.info("launching %s", spec.key)
        held = None
        try:
            self._epochs.observe(order.epoch)
            self._failpoints.hit("agent.launch")
            if spec.rendezvous is not None and spec.rendezvous.master_port == 0:
                held = hold_free_port()
                port = held.getsockname()[1]
                spec = replace(spec, rendezvous=spec.rendezvous.model_copy(update={"master_port": port}))
            handle = self._runtime.launch(spec)
        except Exception as exc:  # whatever the runtime raises is this order's failure, never the channel's
            reason = str(exc) if isinstance(exc, LaunchError) else f"{type(exc).__name__}: {exc}"
            self._fail(spec.key, f"cannot launch: {reason}")
            return
        finally:
            if held is not None:
                held.close()  # held until the task has started
        port = spec.rendezvous.master_port if spec.rendezvous is not None and spec.rendezvous.rank == 0 else None
        self._items[spec.key] = Workload(handle=handle, tail=LogTailer(handle.log_path), rendezvous_port=port)
        self._put(self._status(spec.key, "started", rendezvous_port=port))

    def _refuse(self, key: WorkloadKey, reason: str) -> None:
        log.warning("refusing launch of %s: %s", key, reason)
        status = self._status(key, "refused", message=reason[:MAX_MESSAGE])
        _remember(self._refused, key, status)
        self._put(status)

    def _fail(self, key: WorkloadKey, reason: str) -> None:
        log.warning("launch of %s failed: %s", key, reason)
        status = self._status(key, "failed", message=reason[:MAX_MESSAGE])
        self._remember(key, status)
        self._put(status)

    def _repeat(self, key: WorkloadKey, unknown: StatusState | None = None) -> None:
        """Re-send the latest status of `key`; for an unknown key, `unknown` (if given) with an explanation."""
        workload = self._items.get(key)
        if workload is not None:
            self._put(workload.final if workload.final is not None
                      else self._status(key, "started", rendezvous_port=workload.rendezvous_port))
        elif key in self._finished:
            self._put(self._finished[key])
        elif key in self._refused:
            self._put(self._refused[key])
        elif unknown is not None:
            self._put(self._status(key, unknown, message="no such workload on this node"))

    def _tail(self, workload: Workload, *, final: bool = False) -> None:
        budget = min(LOG_TICK_BYTES, self._log_window - self._outbox.unacked_log_chars)
        if budget <= 0:
            return
        handle = workload.handle
        for chunk in workload.tail.read(budget, final=final or workload.final is not None):
            workload.chunk_ends[chunk.offset] = chunk.end
            self._put(
                LogChunk(
                    boot_id=self._outbox.boot_id,
                    seq=0,
                    allocation_id=handle.allocation_id,
                    attempt=handle.attempt,
                    offset=chunk.offset,
                    data=chunk.text,
                )
            )

    def _check_exit(self, workload: Workload, connected: bool) -> None:
        state = self._runtime.poll(workload.handle)
        if state.running:
            return
        if connected:
            self._tail(workload, final=True)
        workload.final = self._final_status(workload, state.exit_code)
        self._put(workload.final)

    def _final_status(self, workload: Workload, exit_code: int | None) -> TaskStatus:
        key = workload.handle.key
        if workload.fenced or self._runtime.self_fenced(workload.handle):
            if not workload.fenced:  # its watchdog was quicker than the agent's own check: say so here too
                log.error("self-fencing: workload %s was stopped by its watchdog (no word from any control plane "
                          "for its max_disconnect)", key)
            return self._status(key, "fenced", exit_code, "self-fenced: no word from the control plane")
        if exit_code is None:
            return self._status(key, "failed", None, "the workload ended without a recorded exit code")
        message = f"stopped: {workload.stop_reason}" if workload.stop_reason else ""
        return self._status(key, "exited", exit_code, message)

    def _done(self, workload: Workload) -> bool:
        return workload.final_acked and not workload.chunk_ends and workload.tail.at_eof()

    def _drop(self, workload: Workload) -> None:
        assert workload.final is not None
        self._remember(workload.handle.key, workload.final)
        del self._items[workload.handle.key]
        try:
            self._runtime.forget(workload.handle)
        except (OSError, RuntimeError) as exc:
            log.warning("could not forget workload %s: %s", workload.handle.key, exc)

    def _remember(self, key: WorkloadKey, status: TaskStatus) -> None:
        _remember(self._finished, key, status)

    def _status(
        self, key: WorkloadKey, state: StatusState, exit_code: int | None = None, message: str = "",
        rendezvous_port: int | None = None,
    ) -> TaskStatus:
        return TaskStatus(
            boot_id=self._outbox.boot_id,
            seq=0,
            allocation_id=key[0],
            attempt=key[1],
            state=state,
            exit_code=exit_code,
            message=message,
            rendezvous_port=rendezvous_port,
        )

    def _put(self, frame: TaskStatus | LogChunk) -> None:
        self._outbox.put(frame, reliable=True)


def _limit(workload: Workload, default_s: float) -> float:
    """The silence after which `workload` is fenced: its own max_disconnect, else the node's default."""
    own = workload.handle.max_disconnect_s
    return default_s if own is None else own


def _remember(memory: OrderedDict[WorkloadKey, TaskStatus], key: WorkloadKey, status: TaskStatus) -> None:
    """Keep `status` as the answer for `key`, forgetting the oldest past FINISHED_MEMORY entries."""
    memory[key] = status
    memory.move_to_end(key)
    while len(memory) > FINISHED_MEMORY:
        memory.popitem(last=False)


def _read_acked_offset(handle: RunHandle) -> int:
    if handle.state_dir is None:
        return 0
    try:
        return max(0, int((handle.state_dir / LOG_ACKED_FILE).read_text().strip()))
    except (OSError, ValueError):
        return 0


def _write_acked_offset(handle: RunHandle, offset: int) -> None:
    if handle.state_dir is not None and handle.state_dir.is_dir():
        (handle.state_dir / LOG_ACKED_FILE).write_text(f"{offset}\n")
