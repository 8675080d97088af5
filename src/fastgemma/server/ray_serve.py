"""fastgemma on Ray Serve: replicas of `fastgemma serve`'s app behind Ray's one HTTP endpoint.

    from ray import serve
    from fastgemma.config import EngineConfig
    from fastgemma.server.ray_serve import build_deployment

    app = build_deployment(EngineConfig(model=...), num_replicas=2, num_cpus=1)
    serve.run(app, route_prefix="/")        # OpenAI API at http://127.0.0.1:8000/v1

or from a Serve config file / `serve run`: `fastgemma.server.ray_serve:app_builder` with the
same arguments (`model`, `num_replicas`, `autoscaling_config`, ...), or `fastgemma serve
--ray --replicas N` (`run_ray`).

Each replica loads one engine from the one `EngineConfig` and builds `fastgemma serve`'s
FastAPI app around it (`build_app`) in Ray's late-bound ingress (`__serve_build_asgi_app__`),
so routes, request and response models, streaming and errors are those of `fastgemma serve`
byte for byte. Why not `ray.serve.llm`'s `build_openai_app` with our engine as its server
class: its OpenAI router is a second implementation of the API (its own request models, its
own error mapping), which is what this project refuses; Ray's own ingress of our app is one.

Routing: Ray's proxy sends each request to a replica chosen by Ray's default router (the
less loaded of two, by ongoing requests). `max_ongoing_requests` defaults to the engine's
`max_num_seqs`: a replica gets no more than it decodes at once and the rest wait in Ray's
queue (at most `max_queue` a proxy, then Ray answers 503) for the first replica with a free
slot. Ray's prefix-aware router (`PrefixCacheAffinityRouter`) reads the prompt from the
arguments of a deployment-handle call; an HTTP ingress replica receives its body only after
it is chosen, so it cannot apply here (README "Ray Serve").

Autoscaling: `autoscaling_config` takes Ray's keys (`min_replicas`, `max_replicas`,
`target_ongoing_requests`, ...); `target_ongoing_requests` defaults to `max_num_seqs`.

Metrics: each replica serves its own `/metrics` (fastgemma's vLLM-named gauges) and also
sets them as Ray metrics (`fastgemma_num_requests_running`, `fastgemma_num_requests_waiting`,
`fastgemma_kv_cache_usage_perc`, tagged by replica), which Ray's metrics agent exports for
Prometheus as `ray_fastgemma_...`.

Drain: Ray stops routing to a replica it stops, waits up to `graceful_shutdown_timeout_s`
(= `shutdown_timeout`) for the requests in flight, then ends it. On SIGTERM `run_ray` first
has every replica drain as `fastgemma serve` does (503 + Retry-After, `DrainCoordinator`),
then shuts Serve down. A replica that dies (killed, out of memory) is restarted by Ray; the
requests it held fail, not retried (Ray's proxy answers a plain-text 500, or a stream that
was answered 200 ends without `[DONE]`).
Ray is an optional dependency: `pip install 'fastgemma[ray]'`.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import os
import signal
import threading
import time
from typing import Any

from fastgemma.config import EngineConfig, base_type
from fastgemma.server.serve import (
    DEFAULT_HOST,
    DEFAULT_MAX_QUEUE,
    DEFAULT_PORT,
    DEFAULT_SHUTDOWN_TIMEOUT,
    bind_socket,
    kv_cache_line,
    load_app,
)

log = logging.getLogger("fastgemma.server")

APP_NAME = "fastgemma"
REPLICA_HEADER = "x-fastgemma-replica"  # which replica answered (the load-spread tests read it)
REPORT_PERIOD_S = 0.5  # Ray gauges and the drain coordinator
DRAIN_ACTOR, DRAIN_NAMESPACE = "fastgemma-drain", "fastgemma"


def _ray() -> Any:
    try:
        import ray
        from ray import serve  # noqa: F401
    except ImportError:
        raise ValueError("Ray Serve is not installed: pip install 'fastgemma[ray]'") from None
    return ray


def deployment_options(
    config: EngineConfig,
    *,
    num_replicas: int | None = None,
    autoscaling_config: dict[str, Any] | None = None,
    num_cpus: float = 1.0,
    num_gpus: float = 0.0,
    max_ongoing_requests: int | None = None,
    max_queue: int = DEFAULT_MAX_QUEUE,
    shutdown_timeout: float = DEFAULT_SHUTDOWN_TIMEOUT,
) -> dict[str, Any]:
    """Ray Serve deployment options for replicas of `config`'s engine (module docstring).

    `num_replicas` (default 1) or `autoscaling_config` (Ray's keys; `target_ongoing_requests`
    defaults to `max_num_seqs`), never both. Raises ValueError for values Ray would refuse later."""
    if autoscaling_config is not None and num_replicas is not None:
        raise ValueError("give num_replicas or autoscaling_config (min_replicas / max_replicas), not both")
    if num_replicas is not None and num_replicas < 1:
        raise ValueError(f"num_replicas must be >= 1 (got {num_replicas})")
    if num_cpus <= 0 or num_gpus < 0:
        raise ValueError(f"num_cpus must be > 0 and num_gpus >= 0 (got {num_cpus}, {num_gpus})")
    if max_queue < 1 or not shutdown_timeout >= 0:
        raise ValueError(f"max_queue must be >= 1 and shutdown_timeout >= 0 (got {max_queue}, {shutdown_timeout})")
    options: dict[str, Any] = {
        "ray_actor_options": {"num_cpus": num_cpus, "num_gpus": num_gpus},
        "max_ongoing_requests": max_ongoing_requests or config.max_num_seqs,
        "max_queued_requests": max_queue,
        "graceful_shutdown_timeout_s": shutdown_timeout,
        "graceful_shutdown_wait_loop_s": 0.5,
    }
    if autoscaling_config is not None:
        options["autoscaling_config"] = {"target_ongoing_requests": config.max_num_seqs, **autoscaling_config}
    else:
        options["num_replicas"] = num_replicas or 1
    return options


class _ReplicaHeader:
    """ASGI middleware: every HTTP response names the replica that made it."""

    def __init__(self, app: Any, replica: str):
        self.app, self.header = app, (REPLICA_HEADER.encode(), replica.encode())

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            return await self.app(scope, receive, send)

        async def send_named(message: Any) -> None:
            if message["type"] == "http.response.start":
                message = {**message, "headers": [*message.get("headers", []), self.header]}
            await send(message)

        await self.app(scope, receive, send_named)


class FastgemmaReplica:
    """One replica: an engine and `fastgemma serve`'s app around it (Ray builds the class's
    deployment in `build_deployment`; this is plain Python, importable without Ray)."""

    def __init__(self, config: EngineConfig, server: dict[str, Any]):
        self.fastapi_app = load_app(config, **server)  # not `app`: Ray's wrapper has that name
        self.state = self.fastapi_app.state.fastgemma
        self.replica_id = _replica_id()
        log.warning("fastgemma replica %s: %s", self.replica_id, kv_cache_line(self.state.llm))
        self._stop = threading.Event()
        threading.Thread(target=self._report, name="fastgemma-ray-report", daemon=True).start()

    def __serve_build_asgi_app__(self) -> Any:  # Ray's late-bound ingress: the app this replica serves
        return _ReplicaHeader(self.fastapi_app, self.replica_id)

    def check_health(self) -> None:
        """Ray's health check: a replica whose engine loop has died is replaced."""
        if not self.state.worker.alive:
            raise RuntimeError("the engine loop has stopped")

    def __del__(self) -> None:  # Ray, stopping the replica after its graceful wait
        if hasattr(self, "state"):  # not when __init__ failed
            self.state.draining = True
            self._stop.set()

    def _report(self) -> None:
        """Every `REPORT_PERIOD_S`: set the Ray gauges; tell `run_ray`'s drain coordinator
        (when there is one) what is in flight, and start draining when it says so."""
        import ray
        from ray.util.metrics import Gauge

        tags = {"model_name": self.state.served_model_name, "replica": self.replica_id}
        gauges = {name: Gauge(f"fastgemma_{name}", description=doc, tag_keys=tuple(tags)) for name, doc in [
            ("num_requests_running", "Sequences the engine decodes together."),
            ("num_requests_waiting", "Requests waiting for the engine."),
            ("kv_cache_usage_perc", "Fraction of KV-cache slots held (0-1)."),
        ]}
        try:
            coordinator = ray.get_actor(DRAIN_ACTOR, namespace=DRAIN_NAMESPACE)
        except ValueError:  # a user's own Serve config: Ray's graceful shutdown alone
            coordinator = None
        while not self._stop.wait(REPORT_PERIOD_S):
            for name, value in self.state.worker.gauges().items():
                gauges[name].set(value, tags=tags)
            if coordinator is not None:
                try:
                    if ray.get(coordinator.report.remote(self.replica_id, self.state.in_flight, self.state.draining)):
                        self.state.draining = True
                except ray.exceptions.RayError:
                    coordinator = None  # its driver has gone


class DrainCoordinator:
    """`run_ray`'s drain on SIGTERM, as `fastgemma serve`'s: every replica refuses new
    requests (503 + Retry-After) and reports what it still has in flight; Serve is shut
    down once all are idle. (Ray's own `serve.shutdown` drains replicas but ends the proxy
    at once, which cuts the streams that pass through it.) A Ray actor, named `DRAIN_ACTOR`."""

    def __init__(self) -> None:
        self.draining = False
        self.replicas: dict[str, tuple[bool, int, float]] = {}  # id -> (draining, in flight, when)

    def report(self, replica: str, in_flight: int, draining: bool) -> bool:
        self.replicas[replica] = (draining, in_flight, time.monotonic())
        return self.draining

    def begin(self) -> None:
        self.draining = True

    def drained(self) -> bool:
        """Every replica heard from in the last few seconds drains and has nothing in flight."""
        recent = [r for r in self.replicas.values() if time.monotonic() - r[2] < 10 * REPORT_PERIOD_S]
        return all(draining and in_flight == 0 for draining, in_flight, _ in recent)


def _replica_id() -> str:
    try:
        from ray import serve

        return serve.get_replica_context().replica_id.unique_id
    except Exception:  # outside a replica (a unit test of the class)
        return f"pid-{os.getpid()}"


def build_deployment(
    config: EngineConfig | None = None,
    *,
    served_model_name: str | None = None,
    api_key: str | None = None,
    max_queue: int = DEFAULT_MAX_QUEUE,
    allow_remote_media: bool = False,
    shutdown_timeout: float = DEFAULT_SHUTDOWN_TIMEOUT,
    num_replicas: int | None = None,
    autoscaling_config: dict[str, Any] | None = None,
    num_cpus: float = 1.0,
    num_gpus: float = 0.0,
    max_ongoing_requests: int | None = None,
    name: str = "FastgemmaReplica",
) -> Any:
    """A Ray Serve application (`serve.run(app, route_prefix="/")`) of replicas of `config`'s
    engine; server settings as `fastgemma serve`, Ray settings by `deployment_options`.

    A CPU replica runs `config.threads` kernel threads, else as many as its `num_cpus`
    (at least 1), so replicas side by side do not oversubscribe the cores."""
    _ray()
    from ray import serve

    config = config or EngineConfig()
    options = deployment_options(
        config, num_replicas=num_replicas, autoscaling_config=autoscaling_config, num_cpus=num_cpus,
        num_gpus=num_gpus, max_ongoing_requests=max_ongoing_requests, max_queue=max_queue,
        shutdown_timeout=shutdown_timeout,
    )
    if config.threads is None and config.torch_device().type == "cpu":
        config = dataclasses.replace(config, threads=max(1, int(num_cpus)))
    server = {"served_model_name": served_model_name, "api_key": api_key, "max_queue": max_queue,
              "allow_remote_media": allow_remote_media}
    ingress = serve.ingress()(type(name, (FastgemmaReplica,), {"__module__": __name__}))
    return serve.deployment(ingress, name=name, **options).bind(config, server)


_BUILDER_TYPES = {"served_model_name": str, "api_key": str, "max_queue": int, "allow_remote_media": bool,
                  "shutdown_timeout": float, "num_replicas": int, "autoscaling_config": dict, "num_cpus": float,
                  "num_gpus": float, "max_ongoing_requests": int}


def app_builder(args: dict[str, Any]) -> Any:
    """`serve run fastgemma.server.ray_serve:app_builder model=... num_replicas=2` and Serve
    config files (`import_path` + `args`): engine options by their `EngineConfig` names,
    the rest as `build_deployment`'s keywords."""
    known = {f.name for f in dataclasses.fields(EngineConfig)}
    unknown = sorted(set(args) - known - set(_BUILDER_TYPES))
    if unknown:
        raise ValueError(f"unknown argument(s) {', '.join(unknown)}: give EngineConfig options or "
                         f"{', '.join(sorted(_BUILDER_TYPES))}")
    engine = {k: _typed(v, base_type(k)) for k, v in args.items() if k in known}
    server = {k: _typed(v, _BUILDER_TYPES[k]) for k, v in args.items() if k in _BUILDER_TYPES}
    return build_deployment(EngineConfig(**engine), **server)


def _typed(value: Any, kind: type) -> Any:
    """A `key=value` string from `serve run`'s command line as `kind` (config files give types)."""
    if not isinstance(value, str) or kind is str:
        return value
    if kind is bool:
        if value.lower() not in ("true", "false", "1", "0"):
            raise ValueError(f"expected true or false, got {value!r}")
        return value.lower() in ("true", "1")
    if kind is dict:
        return json.loads(value)
    return kind(value)


def run_ray(
    config: EngineConfig | None = None,
    host: str = DEFAULT_HOST,
    port: int = DEFAULT_PORT,
    replicas: int = 1,
    address: str | None = None,
    num_cpus: float | None = None,
    num_gpus: float | None = None,
    shutdown_timeout: float = DEFAULT_SHUTDOWN_TIMEOUT,
    **server: Any,
) -> None:
    """`fastgemma serve --ray`: start (or join, `address`) a Ray cluster, serve `replicas`
    replicas on host:port until SIGTERM / Ctrl-C, then shut Serve down gracefully (each
    replica finishes its requests within `shutdown_timeout`). `num_cpus` a replica: default
    the machine's cores shared among the replicas; `num_gpus`: default 1 for a CUDA engine
    (Ray gives each replica its own GPU), else 0."""
    ray = _ray()
    from ray import serve

    if replicas < 1:
        raise ValueError(f"--replicas must be >= 1 (got {replicas})")
    bind_socket(host, port).close()  # a port in use fails now, not inside Ray's proxy
    config = config or EngineConfig()
    per_replica = num_cpus or max(1.0, float((os.cpu_count() or 1) // replicas))
    if num_gpus is None:
        num_gpus = 1.0 if config.torch_device().type == "cuda" else 0.0
    app = build_deployment(config, num_replicas=replicas, num_cpus=per_replica, num_gpus=num_gpus,
                           shutdown_timeout=shutdown_timeout, **server)
    ray.init(address=address, include_dashboard=False, logging_level=logging.WARNING, log_to_driver=True)
    received: list[int] = []  # signals, in order: SIGTERM first drains, anything else stops at once
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda sig, _: received.append(sig))
    try:
        coordinator = ray.remote(num_cpus=0)(DrainCoordinator).options(
            name=DRAIN_ACTOR, namespace=DRAIN_NAMESPACE).remote()
        serve.start(http_options={"host": host, "port": port})
        serve.run(app, name=APP_NAME, route_prefix="/", blocking=False)
        print(f"fastgemma: serving {replicas} replica(s) on Ray at http://{host}:{port}/v1", flush=True)
        while not received:
            time.sleep(REPORT_PERIOD_S)
        if received[0] == signal.SIGTERM and shutdown_timeout > 0:
            print(f"fastgemma: draining: new requests get 503; waiting up to {shutdown_timeout:.0f} s", flush=True)
            ray.get(coordinator.begin.remote())
            deadline = time.monotonic() + shutdown_timeout
            time.sleep(3 * REPORT_PERIOD_S)  # every replica has heard
            while time.monotonic() < deadline and len(received) == 1 and not ray.get(coordinator.drained.remote()):
                time.sleep(REPORT_PERIOD_S)
        serve.shutdown()
    finally:
        ray.shutdown()
