"""The server's threads: request jobs on a bounded pool, and the engine's one loop.

`Worker(max_queue, metrics, llm, max_running)`:
- jobs: a `Job` wraps a function `fn(job)` (one request's work: generate, score, format),
  run on one of `max_running` job threads (the engine's `max_num_seqs`); at most `max_queue`
  more wait, in arrival order, and a job past that is refused (`QueueFull`, HTTP 429). A job
  may `emit` `TokenEvent`s (streamed tokens) to the event loop and returns a result; the
  asyncio side awaits `job.next()`.
- the engine (`EngineLoop`, when given an `LLM`): the engine is not thread-safe, so one
  thread makes every call into it. It loops: run what jobs asked for (add a request, abort
  one, score a prompt), `engine.step()` while any of its requests is unfinished (every running
  sequence advances together: continuous batching), then hand each request's new text deltas
  to its job's queue (`LLM.RequestStream.pull`). A job reads them with `engine.stream(job, ...)`:
  its prompts' choices (each prompt's `params.n` sequences share its computation), run
  together and interleaved.
  With no request of its own in flight it does not touch the engine.

Cancellation (a client went away): `job.cancel()` removes a waiting job from the queue at
once (its slot is free for the next request) or sets `job.cancelled`, which a running job's
stream notices within `POLL_S`; its sequence is aborted and its cache slot is free at the
next engine step.
"""

from __future__ import annotations

import asyncio
import logging
import queue
import threading
import time
from collections import deque
from collections.abc import Callable, Iterator
from concurrent.futures import Future
from dataclasses import dataclass
from typing import Any

from fastgemma.server.metrics import Metrics

log = logging.getLogger("fastgemma.server")

_ITEM, _DONE, _ERROR = 0, 1, 2
POLL_S = 0.05  # how often a job waiting for tokens looks at its cancellation
_END = object()  # a stream's end, after its last delta


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


class EngineLoop:
    """The engine's one thread (module docstring). Thread-safe: `stream`, `call`, `stop`."""

    def __init__(self, llm: Any, metrics: Metrics | None = None, name: str = "fastgemma-engine"):
        self.llm, self.metrics = llm, metrics
        self._tasks: deque[Callable[[], None]] = deque()  # run on the loop between steps
        self._streams: dict[Any, tuple[queue.Queue, int]] = {}  # RequestStream -> its job's queue, its choice (loop thread only)
        self._cond = threading.Condition()
        self._stopping = False
        self._thread = threading.Thread(target=self._loop, name=name, daemon=True)
        self._thread.start()

    # ---- job side ------------------------------------------------------------------------

    def stream(self, job: Job | None, requests: list[tuple[list[int], Any, Any]]) -> Iterator[tuple[int, Any, Any]]:
        """Queue prompts (ids, params, multimodal inputs), each with its `params.n` choices,
        to run together; yield (choice index, StreamDelta, live Sequence) per token as the
        engine makes them, interleaved (the index counts the choices of every prompt in
        order). Closing the iterator or cancelling the job aborts them all."""
        out: queue.Queue = queue.Queue()
        started: Future = Future()

        def add() -> None:
            streams: list[Any] = []
            try:
                for ids, params, multimodal in requests:
                    streams += self.llm.add_choices(ids, params, multimodal)
            except Exception as e:  # bad input the engine refuses: the job's error
                for rs in streams:
                    self.llm.engine.finish(rs.seq, "abort")
                started.set_exception(e)
                return
            for i, rs in enumerate(streams):
                self._streams[rs] = (out, i)
            started.set_result(streams)

        def abort() -> None:  # on the loop, after `add` (tasks run in order)
            if started.exception() is None:
                for rs in started.result():
                    self.llm.engine.finish(rs.seq, "abort")  # no-op when finished

        self._post(add)
        while True:
            try:
                streams = started.result(timeout=POLL_S)
                break
            except TimeoutError:
                if job is not None and job.cancelled.is_set():
                    self._post(abort)  # the request was queued meanwhile: drop it
                    job.check()
        try:
            open_choices = len(streams)
            while open_choices:
                try:
                    item = out.get(timeout=POLL_S)
                except queue.Empty:
                    if job is not None:
                        job.check()
                    continue
                if isinstance(item, BaseException):
                    raise item
                i, delta = item
                if delta is _END:
                    open_choices -= 1
                    continue
                yield i, delta, streams[i].seq
        finally:
            self._post(abort)

    def call(self, fn: Callable[[], Any]) -> Any:
        """fn() on the engine thread between steps (e.g. scoring a prompt); its result."""
        done: Future = Future()

        def run() -> None:
            try:
                done.set_result(fn())
            except BaseException as e:
                done.set_exception(e)

        self._post(run)
        return done.result()

    @property
    def alive(self) -> bool:
        return self._thread.is_alive()

    def stop(self, timeout: float | None = 5.0) -> None:
        with self._cond:
            self._stopping = True
            self._cond.notify_all()
        self._thread.join(timeout)

    def _post(self, task: Callable[[], None]) -> None:
        with self._cond:
            self._tasks.append(task)
            self._cond.notify()

    # ---- the loop ------------------------------------------------------------------------

    def _loop(self) -> None:
        engine = self.llm.engine
        while True:
            with self._cond:
                # `_streams` is only touched on this thread; it steps while its own requests
                # run, so between requests it leaves the engine alone
                while not self._tasks and not self._streams and not self._stopping:
                    self._cond.wait()
                if self._stopping:
                    break
                tasks, self._tasks = list(self._tasks), deque()
            for task in tasks:
                task()
            if self._streams:
                self._step(engine)
        for rs, (out, _) in self._streams.items():  # shutting down: every stream ends
            engine.finish(rs.seq, "abort")
            out.put(Cancelled())

    def _step(self, engine: Any) -> None:
        before = engine.spec_stats.snapshot()
        cache = engine.prefix_cache
        looked, hit = (cache.queries, cache.hits) if cache is not None else (0, 0)
        try:
            engine.step()
        except Exception as e:  # a fault of the engine: every request in it fails, the loop goes on
            log.exception("engine step failed")
            for rs, (out, _) in list(self._streams.items()):
                engine.finish(rs.seq, "abort")
                out.put(RuntimeError(f"engine error: {type(e).__name__}: {e}"))
            self._streams.clear()
            return
        if self.metrics is not None:
            self.metrics.count_speculation(engine.spec_stats.since(before))
            if cache is not None:
                self.metrics.count_prefix_cache(cache.queries - looked, cache.hits - hit)
        for rs, (out, i) in list(self._streams.items()):
            for delta in rs.pull():
                out.put((i, delta))
            if rs.closed:
                out.put((i, _END))
                del self._streams[rs]


class Worker:
    """Request jobs on `max_running` threads, at most `max_queue` waiting, and the engine's
    loop when given an `llm` (module docstring)."""

    def __init__(
        self,
        max_queue: int,
        metrics: Metrics | None = None,
        llm: Any = None,
        max_running: int = 1,
        name: str = "fastgemma-job",
    ):
        if max_queue < 1:
            raise ValueError(f"max_queue must be >= 1 (got {max_queue})")
        self.max_queue, self.metrics = max_queue, metrics
        self.engine = EngineLoop(llm, metrics) if llm is not None else None
        self._waiting: deque[Job] = deque()
        self._cond = threading.Condition()
        self._stopping = False
        self.running: set[Job] = set()
        self._scheduler = None if self.engine is None else llm.engine.scheduler
        if metrics is not None:  # read when /metrics is scraped
            metrics.queue_depth.set_function(lambda: self.gauges()["num_requests_waiting"])
            metrics.running.set_function(lambda: self.gauges()["num_requests_running"])
            metrics.kv_cache_usage.set_function(lambda: self.gauges()["kv_cache_usage_perc"])
        self._threads = [
            threading.Thread(target=self._loop, name=f"{name}-{i}", daemon=True) for i in range(max_running)
        ]
        for t in self._threads:
            t.start()

    @property
    def num_waiting(self) -> int:
        return len(self._waiting)

    @property
    def num_running(self) -> int:
        return len(self.running)

    def gauges(self) -> dict[str, float]:
        """The router gauges, by vLLM's names: requests running (sequences in the batch; job
        threads without an engine), waiting (for a job thread or a cache slot), and the
        fraction of cache slots held."""
        scheduler = self._scheduler
        if scheduler is None:
            return {"num_requests_running": len(self.running), "num_requests_waiting": len(self._waiting),
                    "kv_cache_usage_perc": 0.0}
        return {"num_requests_running": scheduler.num_running,
                "num_requests_waiting": len(self._waiting) + scheduler.num_waiting,
                "kv_cache_usage_perc": scheduler.num_running / scheduler.max_num_seqs}

    @property
    def alive(self) -> bool:
        """Every job thread and the engine loop still run (false after `stop` or a crash)."""
        return all(t.is_alive() for t in self._threads) and (self.engine is None or self.engine.alive)

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
            self._cond.notify()
        return job

    def stop(self, timeout: float | None = 5.0) -> None:
        """Cancel everything waiting and running, and end the threads."""
        with self._cond:
            self._stopping = True
            waiting, self._waiting = list(self._waiting), deque()
            self._cond.notify_all()
        for job in waiting:
            job.cancelled.set()
            job._post(_ERROR, Cancelled())
        for job in list(self.running):
            job.cancelled.set()
        for t in self._threads:
            t.join(timeout)
        if self.engine is not None:
            self.engine.stop(timeout)

    def _remove_waiting(self, job: Job) -> bool:
        with self._cond:
            try:
                self._waiting.remove(job)
            except ValueError:
                return False
            return True

    def _loop(self) -> None:
        while True:
            with self._cond:
                while not self._waiting and not self._stopping:
                    self._cond.wait()
                if self._stopping:
                    return
                job = self._waiting.popleft()
                self.running.add(job)
            try:
                if job.cancelled.is_set():
                    raise Cancelled()
                result = job.fn(job)
            except Cancelled as e:
                job._post(_ERROR, e)
            except BaseException as e:  # reported to the request, never kills the worker
                if not isinstance(e, Exception):
                    log.exception("worker: %s", type(e).__name__)
                job._post(_ERROR, e if isinstance(e, Exception) else RuntimeError(repr(e)))
            else:
                job._post(_DONE, result)
            finally:
                if self.metrics is not None:
                    self.metrics.e2e.observe(time.perf_counter() - job.arrival)
                with self._cond:
                    self.running.discard(job)
