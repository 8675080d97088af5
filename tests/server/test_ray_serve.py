"""fastgemma on Ray Serve (server/ray_serve.py): `fastgemma serve --ray --replicas 2` on the
embedded model, a local Ray cluster on the loopback address. Load spreads over both replicas,
greedy outputs equal `fastgemma serve`'s, a replica killed under load fails its requests
cleanly and is restarted, SIGTERM drains. Every wait is bounded."""

from __future__ import annotations

import concurrent.futures as cf
import json
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest
from tests.server.serve_process import serve_process

from fastgemma.config import EngineConfig
from fastgemma.server.ray_serve import REPLICA_HEADER, app_builder, deployment_options

pytest.importorskip("ray.serve", reason="the [ray] extra is not installed")

PROMPTS = ["The capital of France is", "def fibonacci(n):", "Once upon a time, in a land far away,",
           "The three primary colours are", "Water boils at"]


# ---- options (no cluster) -------------------------------------------------------------------


def test_deployment_options_follow_the_engine():
    config = EngineConfig(max_num_seqs=4)
    opts = deployment_options(config, num_replicas=2, num_cpus=1, max_queue=16, shutdown_timeout=12)
    assert opts["num_replicas"] == 2 and opts["ray_actor_options"] == {"num_cpus": 1, "num_gpus": 0.0}
    assert opts["max_ongoing_requests"] == 4  # a replica gets what it decodes at once; Ray queues the rest
    assert opts["max_queued_requests"] == 16 and opts["graceful_shutdown_timeout_s"] == 12
    auto = deployment_options(config, num_replicas=None, autoscaling_config={"min_replicas": 1, "max_replicas": 3})
    assert auto["autoscaling_config"] == {"target_ongoing_requests": 4, "min_replicas": 1, "max_replicas": 3}
    assert "num_replicas" not in auto


@pytest.mark.parametrize("kwargs, message", [
    ({"num_replicas": 2, "autoscaling_config": {"max_replicas": 2}}, "not both"),
    ({"num_replicas": 0}, "num_replicas must be >= 1"),
    ({"num_cpus": 0}, "num_cpus must be > 0"),
    ({"max_queue": 0}, "max_queue must be >= 1"),
])
def test_bad_deployment_options_say_what_to_change(kwargs, message):
    with pytest.raises(ValueError, match=message):
        deployment_options(EngineConfig(), **kwargs)


def test_app_builder_takes_serve_run_strings(monkeypatch):
    seen = {}
    monkeypatch.setattr("fastgemma.server.ray_serve.build_deployment", lambda config, **kw: seen.update(config=config, **kw))
    app_builder({"max_num_seqs": "3", "dtype": "float32", "num_replicas": "2", "num_cpus": "0.5",
                 "allow_remote_media": "false", "autoscaling_config": '{"max_replicas": 4}'})
    assert seen["config"].max_num_seqs == 3 and seen["config"].dtype == "float32"
    assert seen["num_replicas"] == 2 and seen["num_cpus"] == 0.5 and seen["allow_remote_media"] is False
    assert seen["autoscaling_config"] == {"max_replicas": 4}
    with pytest.raises(ValueError, match="unknown argument.*replicas"):
        app_builder({"replicas": "2"})


def test_replicas_without_ray_is_refused():
    done = subprocess.run([sys.executable, "-m", "fastgemma.cli.main", "serve", "--replicas", "2"],
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 2 and done.stderr.strip() == "error: --replicas and --ray-address need --ray"


def test_ray_mistakes_fail_in_one_line_before_a_cluster_starts():
    with socket.create_server(("127.0.0.1", 0)) as held:
        port = held.getsockname()[1]
        for args, message in [(["--replicas", "0"], "error: --replicas must be >= 1 (got 0)"),
                              (["--port", str(port)], f"error: cannot listen on 127.0.0.1:{port}")]:
            done = subprocess.run([sys.executable, "-m", "fastgemma.cli.main", "serve", "--ray", *args],
                                  capture_output=True, text=True, timeout=120)
            assert done.returncode == 2 and done.stderr.startswith(message), done.stderr
            assert done.stderr.strip().count("\n") == 0


# ---- a local cluster of 2 replicas ----------------------------------------------------------


def _replica_pids(session: int) -> set[int]:
    """The replica processes of the Ray cluster started in process session `session`."""
    pids = set()
    for proc in Path("/proc").iterdir():
        try:
            cmdline = (proc / "cmdline").read_bytes()
            if cmdline.startswith(b"ray::ServeReplica:fastgemma") and os.getsid(int(proc.name)) == session:
                pids.add(int(proc.name))
        except (OSError, ValueError):
            continue
    return pids


@pytest.fixture(scope="module")
def ray_server():
    args = ("--ray", "--replicas", "2", "--shutdown-timeout", "60")
    with serve_process(*args, ready="fastgemma: serving 2 replica(s)", new_session=True) as (proc, url, _):
        try:
            yield proc, url
        finally:
            for pid in _replica_pids(proc.pid):  # a replica outlives a killed driver
                os.kill(pid, signal.SIGKILL)


@pytest.fixture(scope="module")
def reference(ray_server):
    """`fastgemma serve`'s answers to PROMPTS (greedy), from the same app in this process."""
    from fastgemma import LLM
    from fastgemma.server import ServerThread

    with ServerThread(LLM()) as server, httpx.Client(base_url=server.url, timeout=120) as c:
        return {p: _complete(c, p) for p in PROMPTS}, _chat_stream(c)


def _complete(c: httpx.Client, prompt: str, max_tokens: int = 24) -> list[int]:
    r = c.post("/v1/completions", json={"prompt": prompt, "max_tokens": max_tokens, "temperature": 0,
                                        "return_token_ids": True})
    assert r.status_code == 200, r.text
    return r.json()["choices"][0]["token_ids"]


def _chat_stream(c: httpx.Client) -> str:
    body = {"messages": [{"role": "user", "content": "Name a fruit."}], "max_tokens": 16, "temperature": 0, "stream": True}
    with c.stream("POST", "/v1/chat/completions", json=body) as r:
        assert r.status_code == 200
        chunks = [json.loads(line[6:]) for line in r.iter_lines() if line.startswith("data: {")]
    return "".join(ch["choices"][0]["delta"].get("content") or "" for ch in chunks if ch["choices"])


def _stream(url: str, prompt: str, max_tokens: int = 60) -> tuple:
    """One greedy completion stream: (status, replica, token ids, ended with [DONE]) or
    ("failed", exception name) when the connection broke; never longer than the timeout."""
    body = {"prompt": prompt, "max_tokens": max_tokens, "temperature": 0, "ignore_eos": True, "stream": True,
            "return_token_ids": True}
    try:
        with httpx.Client(timeout=60) as c, c.stream("POST", url + "/v1/completions", json=body) as r:
            lines = list(r.iter_lines())
            ids = [t for line in lines if line.startswith("data: {")
                   for t in json.loads(line[6:])["choices"][0].get("token_ids") or []]
            return r.status_code, r.headers.get(REPLICA_HEADER), ids, "data: [DONE]" in lines
    except httpx.TransportError as e:
        return "failed", type(e).__name__


def _whole(url: str, prompt: str, max_tokens: int) -> tuple:
    """One non-streamed greedy completion: (status, tokens), or ("failed", exception name)."""
    body = {"prompt": prompt, "max_tokens": max_tokens, "temperature": 0, "ignore_eos": True, "return_token_ids": True}
    try:
        r = httpx.post(url + "/v1/completions", json=body, timeout=60)
    except httpx.TransportError as e:
        return "failed", type(e).__name__
    return r.status_code, len(r.json()["choices"][0]["token_ids"]) if r.status_code == 200 else 0


def test_greedy_outputs_equal_fastgemma_serve(ray_server, reference):
    _, url = ray_server
    completions, chat = reference
    with httpx.Client(base_url=url, timeout=120) as c:
        with cf.ThreadPoolExecutor(len(PROMPTS)) as pool:  # concurrently: over both replicas
            got = dict(zip(PROMPTS, pool.map(lambda p: _complete(c, p), PROMPTS)))
        assert got == completions
        assert _chat_stream(c) == chat
        assert c.get("/v1/models").json()["data"][0]["id"] == "gemma-3-270m"
        bad = c.post("/v1/completions", json={"prompt": 5})
        assert bad.status_code == 400 and bad.json()["error"]["param"] == "prompt"  # the same errors


def test_load_spreads_over_both_replicas(ray_server):
    _, url = ray_server
    with cf.ThreadPoolExecutor(8) as pool:
        results = list(pool.map(lambda i: _stream(url, f"Story number {i}:", 40), range(8)))
    assert all(r[0] == 200 and r[3] and len(r[2]) == 40 for r in results), results
    assert len({r[1] for r in results}) == 2, [r[1] for r in results]


def test_each_replica_exports_its_gauges_through_ray(ray_server):
    """Ray's metrics agent serves `ray_fastgemma_*` gauges tagged by replica (the driver
    started the cluster; this process joins it only to find the agent's port)."""
    import ray
    from prometheus_client.parser import text_string_to_metric_families

    ray.init(address="auto", logging_level="ERROR", log_to_driver=False)
    try:
        node = ray.nodes()[0]
        metrics_url = f"http://{node['NodeManagerAddress']}:{node['MetricsExportPort']}/metrics"
    finally:
        ray.shutdown()
    deadline = time.monotonic() + 60
    while True:
        text = httpx.get(metrics_url, timeout=10).text
        replicas = {s.labels.get("replica") for f in text_string_to_metric_families(text) for s in f.samples
                    if s.name == "ray_fastgemma_num_requests_running" and s.labels.get("model_name") == "gemma-3-270m"}
        if len(replicas) == 2 and all(f"ray_fastgemma_{g}" in text for g in ("num_requests_waiting", "kv_cache_usage_perc")):
            break
        assert time.monotonic() < deadline, replicas
        time.sleep(1)


def test_a_replica_killed_under_load_fails_cleanly_and_is_restarted(ray_server):
    proc, url = ray_server
    before = _replica_pids(proc.pid)
    assert len(before) == 2
    victim = min(before)
    with cf.ThreadPoolExecutor(10) as pool:
        started = time.monotonic()
        futures = [pool.submit(_stream, url, f"Story number {i}:", 150) for i in range(8)]
        whole = [pool.submit(_whole, url, f"Tale number {i}:", 150) for i in range(2)]  # not streamed
        time.sleep(3)  # the requests are decoding
        os.kill(victim, signal.SIGKILL)
        results = [f.result(timeout=90) for f in futures]
        answers = [f.result(timeout=90) for f in whole]
    assert time.monotonic() - started < 90  # nothing hangs
    # a non-streamed request: all its tokens, or a 5xx (Ray's) from the dead replica
    assert all((status == 200 and n == 150) or (isinstance(status, int) and status >= 500) for status, n in answers), answers
    ok = [r for r in results if r[0] == 200 and r[3]]
    failed = [r for r in results if r not in ok]
    assert all(len(r[2]) == 150 for r in ok)
    # a request on the dead replica: a broken stream (its 200 was sent) or a 5xx, never a hang
    assert all(r[0] == "failed" or (isinstance(r[0], int) and r[0] >= 500) or (r[0] == 200 and not r[3])
               for r in failed), failed
    assert ok and failed, results  # both replicas held some
    # the service answers at once on the survivor
    assert _stream(url, "Still there?", 8)[0] == 200
    # Ray restarts the replica and it takes requests again
    deadline = time.monotonic() + 120
    while len(_replica_pids(proc.pid) - {victim}) < 2:
        assert time.monotonic() < deadline, "the replica was not restarted"
        time.sleep(1)
    seen: set[str] = set()
    while len(seen) < 2:
        assert time.monotonic() < deadline, f"the restarted replica took no request: {seen}"
        with cf.ThreadPoolExecutor(8) as pool:
            seen |= {r[1] for r in pool.map(lambda i: _stream(url, f"Again {i}", 4), range(8)) if r[0] == 200}


def test_sigterm_drains_then_everything_exits(ray_server):  # last: it ends the server
    proc, url = ray_server
    with cf.ThreadPoolExecutor(4) as pool:
        futures = [pool.submit(_stream, url, f"Story number {i}:", 120) for i in range(4)]
        time.sleep(3)
        proc.send_signal(signal.SIGTERM)
        deadline = time.monotonic() + 30
        while (r := httpx.post(url + "/v1/completions", json={"prompt": "Hi", "max_tokens": 1}, timeout=10)).status_code != 503:
            assert time.monotonic() < deadline, r.status_code
            time.sleep(0.2)
        assert r.headers["retry-after"] == "1" and r.json()["error"]["type"] == "ServiceUnavailableError"
        results = [f.result(timeout=90) for f in futures]
    assert all(r[0] == 200 and r[3] and len(r[2]) == 120 for r in results), results  # none lost
    assert proc.wait(60) == 0
    assert not _replica_pids(proc.pid)
