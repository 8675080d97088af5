"""Run the server: `run_server(...)` (what `fastgemma serve` calls) and `ServerThread` (tests).

    run_server(config=EngineConfig(model=..., dtype=..., ...), host="127.0.0.1", port=8000,
               served_model_name=None, api_key=None, max_queue=64, shutdown_timeout=30)

`run_server` is where a `fastgemma serve` process starts: it binds its port first (a port
in use fails at once, before minutes of loading), sets the CPU thread count once, loads the
engine, prints the KV cache's size, and prints "serving ..." once uvicorn accepts requests.
`settings_from_env` fills unset settings from the environment (`MODEL_ID`,
`SERVED_MODEL_NAME`, `HOST`, `PORT`), for the CLI to call before `run_server`.

Graceful drain (`DrainingServer`, vLLM's `--shutdown-timeout`): the first SIGTERM sets the
app draining, so new requests get 503 + `Retry-After` and `/health` answers 503 while the
socket stays open (a load balancer sees the refusal instead of a reset); the requests in
flight finish, for at most `shutdown_timeout` seconds; then uvicorn shuts down (connections
close, what still runs is cancelled) and the process exits. A second SIGTERM, or Ctrl-C,
stops at once as uvicorn does. `shutdown_timeout=0`: no drain.
"""

from __future__ import annotations

import logging
import os
import signal
import socket
import threading
import time
from collections.abc import Callable
from typing import Any

import uvicorn

from fastgemma.config import EngineConfig
from fastgemma.kernels.cpu import set_cpu_threads

DEFAULT_HOST = "127.0.0.1"
DEFAULT_PORT = 8000
DEFAULT_MAX_QUEUE = 64
DEFAULT_SHUTDOWN_TIMEOUT = 30.0  # seconds; llm-d's guides pair 30 s with a 60 s pod grace period

log = logging.getLogger("fastgemma.server")


def settings_from_env(
    model: str | None = None,
    served_model_name: str | None = None,
    host: str | None = None,
    port: int | None = None,
    environ: dict[str, str] | None = None,
) -> dict[str, Any]:
    """Explicit values win; else $MODEL_ID, $SERVED_MODEL_NAME, $HOST, $PORT; else defaults.

    Returns the model and keyword arguments for `run_server` (served_model_name, host, port).
    Raises ValueError for a PORT that is not an integer in [0, 65535].
    """
    env = os.environ if environ is None else environ
    port_value: Any = port if port is not None else env.get("PORT") or DEFAULT_PORT
    try:
        port_int = int(port_value)
    except (TypeError, ValueError):
        raise ValueError(f"invalid port {port_value!r}: give an integer in [0, 65535]") from None
    if not 0 <= port_int <= 65535:
        raise ValueError(f"invalid port {port_int}: give an integer in [0, 65535]")
    return {
        "model": model if model is not None else (env.get("MODEL_ID") or None),
        "served_model_name": served_model_name if served_model_name is not None else (env.get("SERVED_MODEL_NAME") or None),
        "host": host if host is not None else (env.get("HOST") or DEFAULT_HOST),
        "port": port_int,
    }


def run_server(
    config: EngineConfig | None = None,
    host: str = DEFAULT_HOST,
    port: int = DEFAULT_PORT,
    served_model_name: str | None = None,
    api_key: str | None = None,
    max_queue: int = DEFAULT_MAX_QUEUE,
    log_level: str = "info",
    allow_remote_media: bool = False,
    shutdown_timeout: float = DEFAULT_SHUTDOWN_TIMEOUT,
) -> None:
    """Load the engine `config` describes (None: the defaults) and serve it until interrupted
    (blocking). `allow_remote_media`: fetch http(s) image URLs in chat content parts (off by
    default). `shutdown_timeout`: seconds a SIGTERM waits for requests in flight (module
    docstring). Raises ValueError for a bad model, max_queue, shutdown_timeout or a port it
    cannot bind (the port before anything loads)."""
    if max_queue < 1:
        raise ValueError(f"max_queue must be >= 1 (got {max_queue})")
    if not shutdown_timeout >= 0:
        raise ValueError(f"shutdown_timeout must be >= 0 seconds (got {shutdown_timeout})")
    config = config or EngineConfig()
    sock = bind_socket(host, port)
    try:
        app = load_app(config, served_model_name=served_model_name, api_key=api_key, max_queue=max_queue,
                       allow_remote_media=allow_remote_media)
        llm = app.state.fastgemma.llm
        print(f"fastgemma: {kv_cache_line(llm)}", flush=True)
        name = app.state.fastgemma.served_model_name
        c = llm.config
        spec = c.speculative if c.speculative == "none" else f"{c.speculative} k={c.num_speculative_tokens}"
        ready = (f"fastgemma: serving {name!r} (max_model_len {llm.max_model_len}, dtype {llm.model.dtype}, "
                 f"quantization {llm.quantization}, speculative {spec}) on http://{host}:{port}/v1")
        server = DrainingServer(uvicorn.Config(app, log_level=log_level, timeout_graceful_shutdown=5),
                                app.state.fastgemma, shutdown_timeout)
        threading.Thread(target=_say_when_started, args=(server, ready), daemon=True).start()
        server.run(sockets=[sock])
    finally:
        sock.close()


def load_app(config: EngineConfig, **server: Any) -> Any:
    """Where a serving process starts: set the CPU thread count once, load the engine on a
    passing thread, and build the app around it (`build_app`'s keywords: `server`).
    `run_server` and each Ray Serve replica call it."""
    from fastgemma import LLM
    from fastgemma.server.app import build_app

    if config.torch_device().type == "cpu":
        set_cpu_threads(config.cpu_threads())  # once, before any kernel runs
    llm = load_on_passing_thread(lambda: LLM.from_config(config))
    return build_app(llm, **server)


class DrainingServer(uvicorn.Server):
    """uvicorn's server, but the first SIGTERM drains before it exits (module docstring)."""

    def __init__(self, config: uvicorn.Config, state: Any, shutdown_timeout: float):
        super().__init__(config)
        self.state, self.shutdown_timeout = state, shutdown_timeout

    def handle_exit(self, sig: int, frame: Any) -> None:
        if sig == signal.SIGTERM and self.shutdown_timeout > 0 and not self.state.draining:
            self._captured_signals.append(sig)  # uvicorn re-raises it once it has shut down
            self.drain()
            return
        super().handle_exit(sig, frame)

    def drain(self) -> threading.Thread:
        """Refuse new requests now; exit when none is in flight or the timeout has passed."""
        self.state.draining = True
        log.warning("draining: new requests get 503; waiting up to %.0f s for %d in flight",
                    self.shutdown_timeout, self.state.in_flight)
        thread = threading.Thread(target=self._exit_when_drained, name="fastgemma-drain", daemon=True)
        thread.start()
        return thread

    def _exit_when_drained(self) -> None:
        deadline = time.monotonic() + self.shutdown_timeout
        while self.state.in_flight and time.monotonic() < deadline and not self.should_exit:
            time.sleep(0.05)
        if self.state.in_flight:
            log.warning("drain timeout: %d requests still in flight are cut", self.state.in_flight)
        self.should_exit = True


def bind_socket(host: str, port: int) -> socket.socket:
    """A listening socket on host:port, or a ValueError saying why not (a port in use)."""
    try:
        family = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)[0][0]
    except socket.gaierror as e:
        raise ValueError(f"cannot resolve host {host!r}: {e}; pass --host an address or name of this machine") from None
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as uvicorn: restart over TIME_WAIT
    try:
        sock.bind((host, port))
        sock.listen(2048)
    except OSError as e:
        sock.close()
        raise ValueError(f"cannot listen on {host}:{port}: {e.strerror or e}; pass another --port or stop what "
                         "holds it") from None
    return sock


def kv_cache_line(llm: Any) -> str:
    """What the KV cache holds now and at most, and the prefix cache's bound: "KV cache: N
    sequences x up to L tokens, ...; prefix cache: up to M MiB of C-token prompt chunks"."""
    pool = llm.runner.pool
    now = f"{pool.num_bytes / 2**20:.0f} MiB now ({pool.capacity} tokens a sequence"
    grows = ", grows with use" if pool.capacity < llm.max_model_len else ""
    kept = llm.engine.prefix_cache
    prefixes = "no prefix cache" if kept is None else (
        f"prefix cache: up to {kept.capacity_bytes / 2**20:.0f} MiB of {kept.chunk}-token prompt chunks")
    return (f"KV cache: {pool.num_seqs} sequences x up to {llm.max_model_len} tokens, {now}{grows}), "
            f"{pool.bytes_at(llm.max_model_len) / 2**20:.0f} MiB at most; {prefixes}")


def _say_when_started(server: Any, line: str) -> None:
    while not server.started and not server.should_exit:
        time.sleep(0.02)
    if server.started:
        print(line, flush=True)


def load_on_passing_thread(load: Callable[[], Any]) -> Any:
    """`load()` on a thread that ends when it returns; its result (or its exception).

    The engine runs on the server's engine-loop thread (worker.py), and its kernels use OpenMP. OpenMP keeps a
    team of threads per thread that ever ran a parallel region; loading a model on the main
    thread leaves one there, and with two teams on a machine's cores libgomp stops spinning
    between regions, which made every decode step ~40% slower when served (measured on
    2 cores: 4.9 s against 3.4 s for 256 tokens). A thread's team ends with the thread.
    """
    box: dict[str, Any] = {}

    def run() -> None:
        try:
            box["value"] = load()
        except BaseException as e:  # re-raised on the caller's thread
            box["error"] = e

    thread = threading.Thread(target=run, name="fastgemma-load")
    thread.start()
    thread.join()
    if "error" in box:
        raise box["error"]
    return box["value"]


class ServerThread:
    """The app for an already loaded `LLM`, served by uvicorn on a background thread.

        with ServerThread(llm, max_queue=4) as server:
            requests.get(server.url + "/v1/models")

    Binds `host:port` (port 0: a free one) before starting, so `url` is usable at once.
    `server.server.drain()` does what SIGTERM does to `fastgemma serve` (signals reach only
    the main thread).
    For speed figures, load the `LLM` with `load_on_passing_thread` (see there): an LLM
    loaded on the calling thread decodes ~40% slower here on 2 cores.
    """

    def __init__(
        self,
        llm: Any,
        served_model_name: str | None = None,
        api_key: str | None = None,
        max_queue: int = DEFAULT_MAX_QUEUE,
        host: str = DEFAULT_HOST,
        port: int = 0,
        log_level: str = "warning",
        allow_remote_media: bool = False,
        shutdown_timeout: float = DEFAULT_SHUTDOWN_TIMEOUT,
    ):
        from fastgemma.server.app import build_app

        self.app = build_app(
            llm, served_model_name=served_model_name, api_key=api_key, max_queue=max_queue,
            allow_remote_media=allow_remote_media,
        )
        self.sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self.sock.bind((host, port))
        self.host, self.port = host, self.sock.getsockname()[1]
        config = uvicorn.Config(self.app, log_level=log_level, timeout_graceful_shutdown=2, lifespan="on")
        self.server = DrainingServer(config, self.state, shutdown_timeout)
        self.thread = threading.Thread(target=self.server.run, kwargs={"sockets": [self.sock]}, daemon=True)

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}"

    @property
    def state(self) -> Any:
        return self.app.state.fastgemma

    def start(self, timeout: float = 30.0) -> ServerThread:
        self.thread.start()
        deadline = time.monotonic() + timeout
        while not self.server.started:
            if not self.thread.is_alive() or time.monotonic() > deadline:
                raise RuntimeError("the server did not start")
            time.sleep(0.01)
        return self

    def stop(self) -> None:
        self.server.should_exit = True
        self.thread.join(10)
        self.sock.close()

    def __enter__(self) -> ServerThread:
        return self.start()

    def __exit__(self, *exc: Any) -> None:
        self.stop()
