"""The engine's one worker thread: a bounded FIFO of jobs, run one at a time.

The engine is not thread-safe, so every call into it happens here. A `Job` wraps a
function `fn(job)` run on the worker; it may `emit` `TokenEvent`s (streamed tokens) to the
event loop and returns a result. The asyncio side awaits `job.next()`.

Cancellation (a client went away): `job.cancel()` removes a waiting job from the queue at
once (its slot is free for the next request) or sets `job.cancelled`, which a running job
checks between tokens; `Cancelled` then ends it and the engine frees the sequence.
"""

from __future__ import annotations

import asyncio
import logging
import threading
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from fastgemma.server.metrics import Metrics

log = logging.getLogger("fastgemma.server")

_ITEM, _DONE, _ERROR = 0, 1, 2


@dataclass(frozen=True)
class TokenEvent:
    """One streamed piece of a choice, from the worker to the event loop."""

    index: int  # the choice (the prompt of a batch) it belongs to
    text: str  # the new text; empty while held back (an incomplete character, a possible stop string)
    token_id: int | None = None  # the token it came from (None: echoed prompt text, or a closing event)
    finish_reason: str | None = None  # set on the choice's last event
    logprobs: Any = None  # this token's logprobs in the route's API shape, when asked for


class QueueFull(Exception):
    """The bounded queue has no free slot (HTTP 429)."""


class Cancelled(Exception):
    """The job was cancelled (its client disconnected) before it finished."""


class Job:
    def __init__(self, fn: Callable[[Job], Any], loop: asyncio.AbstractEventLoop):
        self.fn, self.loop = fn, loop
        self.events: asyncio.Queue[tuple[int, Any]] = asyncio.Queue()
        self.cancelled = threading.Event()
        self.arrival = time.perf_counter()
        self.worker: Worker | None = None
        self.finished = False  # set on the loop once the done/error event was consumed

    # ---- worker side ---------------------------------------------------------------------

    def emit(self, event: TokenEvent) -> None:
        self._post(_ITEM, event)

    def check(self) -> None:
        """Raise `Cancelled` if the client is gone (call between tokens)."""
        if self.cancelled.is_set():
            raise Cancelled()

    def _post(self, kind: int, value: Any) -> None:
        try:
            self.loop.call_soon_threadsafe(self.events.put_nowait, (kind, value))
        except RuntimeError:  # the event loop is closed (server shutting down)
            pass

    # ---- loop side -----------------------------------------------------------------------

    async def next(self) -> tuple[bool, Any]:
        """(True, event) for an emitted `TokenEvent`, (False, result) at the end; raises the job's error."""
        kind, value = await self.events.get()
        if kind == _ITEM:
            return True, value
        self.finished = True
        if kind == _ERROR:
            raise value
        return False, value

    async def result(self) -> Any:
        """Wait for the end, dropping emitted items."""
        while True:
            is_item, value = await self.next()
            if not is_item:
                return value

    def cancel(self) -> None:
        """Thread-safe and idempotent: drop the job if waiting, stop it between tokens if running."""
        if self.cancelled.is_set():
            return
        self.cancelled.set()
        if self.worker is not None and self.worker._remove_waiting(self):
            self._post(_ERROR, Cancelled())


class Worker:
    """One daemon thread running jobs in submission order; at most `max_queue` waiting."""

    def __init__(self, max_queue: int, metrics: Metrics | None = None, name: str = "fastgemma-engine"):
        if max_queue < 1:
            raise ValueError(f"max_queue must be >= 1 (got {max_queue})")
        self.max_queue, self.metrics = max_queue, metrics
        self._waiting: deque[Job] = deque()
        self._cond = threading.Condition()
        self._stopping = False
        self.running: Job | None = None
        self._thread = threading.Thread(target=self._loop, name=name, daemon=True)
        self._thread.start()

    @property
    def num_waiting(self) -> int:
        return len(self._waiting)

    def submit(self, fn: Callable[[Job], Any], loop: asyncio.AbstractEventLoop | None = None) -> Job:
        job = Job(fn, loop or asyncio.get_running_loop())
        job.worker = self
        with self._cond:
            if self._stopping:
                raise QueueFull("the server is shutting down")
            if len(self._waiting) >= self.max_queue:
                raise QueueFull(
                    f"the request queue is full ({self.max_queue} waiting); retry later or raise --max-queue"
                )
            self._waiting.append(job)
            self._gauge()
            self._cond.notify()
        return job

    def stop(self, timeout: float | None = 5.0) -> None:
        """Cancel everything waiting and running, and end the thread."""
        with self._cond:
            self._stopping = True
            waiting, self._waiting = list(self._waiting), deque()
            self._cond.notify_all()
        for job in waiting:
            job.cancelled.set()
            job._post(_ERROR, Cancelled())
        if self.running is not None:
            self.running.cancelled.set()
        self._thread.join(timeout)

    def _remove_waiting(self, job: Job) -> bool:
        with self._cond:
            try:
                self._waiting.remove(job)
            except ValueError:
                return False
            self._gauge()
            return True

    def _gauge(self) -> None:
        if self.metrics is not None:
            self.metrics.queue_depth.set(len(self._waiting))
            self.metrics.running.set(0 if self.running is None else 1)

    def _loop(self) -> None:
        while True:
            with self._cond:
                while not self._waiting and not self._stopping:
                    self._cond.wait()
                if self._stopping:
                    return
                job = self._waiting.popleft()
                self.running = job
                self._gauge()
            try:
                if job.cancelled.is_set():
                    raise Cancelled()
                result = job.fn(job)
            except Cancelled as e:
                job._post(_ERROR, e)
            except BaseException as e:  # reported to the request, never kills the worker
                if not isinstance(e, Exception):
                    log.exception("engine worker: %s", type(e).__name__)
                job._post(_ERROR, e if isinstance(e, Exception) else RuntimeError(repr(e)))
            else:
                job._post(_DONE, result)
            finally:
                if self.metrics is not None:
                    self.metrics.e2e.observe(time.perf_counter() - job.arrival)
                with self._cond:
                    self.running = None
                    self._gauge()
