"""Informer: one kind's objects kept up to date by list + watch, on its own thread (client-go's reflector).

It lists, then watches from the list's resourceVersion; a watch that ends is resumed from the last version seen;
410 Gone (the version is too old) lists again; any other error waits a bounded, doubling backoff (BACKOFF_S up to
BACKOFF_MAX_S) and lists again. `objects` maps a name to the parsed object; `version` counts changes; `on_change`
is called (on the informer's thread) after each batch of changes.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from typing import Any, Generic, TypeVar

log = logging.getLogger(__name__)

T = TypeVar("T")
BACKOFF_S = 0.5
BACKOFF_MAX_S = 30.0
#: how long one watch request lasts before it is resumed
WATCH_S = 60


class Gone(Exception):
    """The watch's resourceVersion expired (410): list again."""


class Informer(Generic[T]):
    def __init__(self, kind: str, source: Any, parse: Callable[[dict[str, Any]], T],
                 key: Callable[[dict[str, Any]], str], on_change: Callable[[], None]) -> None:
        self.kind, self.source, self.parse, self.key, self.on_change = kind, source, parse, key, on_change
        self.lock = threading.Lock()
        self.objects: dict[str, T] = {}
        self.version = 0
        self.synced = threading.Event()
        self.lists = 0  # how many times it listed (tests: a 410 lists again)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name=f"kube-{kind}", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()

    def snapshot(self) -> tuple[int, dict[str, T]]:
        with self.lock:
            return self.version, dict(self.objects)

    def _run(self) -> None:
        backoff = BACKOFF_S
        while not self._stop.is_set():
            try:
                since = self._list()
                backoff = BACKOFF_S
                while not self._stop.is_set():
                    since = self._watch(since)
            except Gone:
                log.info("kube %s: watch expired (410), listing again", self.kind)
            except Exception as exc:  # the apiserver down, a network error: wait, then list again
                log.warning("kube %s: %s; retrying in %.1f s", self.kind, str(exc).splitlines()[0][:200], backoff)
                self._stop.wait(backoff)
                backoff = min(backoff * 2, BACKOFF_MAX_S)

    def _list(self) -> str:
        items, since = self.source.list(self.kind)
        parsed = {self.key(o): self.parse(o) for o in items}
        with self.lock:
            self.objects = parsed
            self.version += 1
            self.lists += 1
        self.synced.set()
        self.on_change()
        return since

    def _watch(self, since: str) -> str:
        try:
            return self._follow(since)
        except Exception as exc:
            if getattr(exc, "status", None) == 410:  # refused up front rather than as an ERROR event
                raise Gone() from None
            raise

    def _follow(self, since: str) -> str:
        for kind, obj in self.source.watch(self.kind, since, WATCH_S):
            if self._stop.is_set():
                break
            if kind == "ERROR":
                if obj.get("code") == 410:
                    raise Gone()
                raise RuntimeError(f"watch error {obj.get('code')}: {obj.get('message', '')}")
            since = obj["metadata"]["resourceVersion"]
            if kind == "BOOKMARK":
                continue
            key = self.key(obj)
            with self.lock:
                if kind == "DELETED":
                    self.objects.pop(key, None)
                else:
                    self.objects[key] = self.parse(obj)
                self.version += 1
            self.on_change()
        return since
