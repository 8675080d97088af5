"""One verification run, start to finish: `run_verify(cfg) -> summary`.

Order: load and check every input; open the endpoint (start `fastgemma serve` on a free
loopback port, or wait for `--url`); stage tps, audit capture, ppl, then the private re-run
(tps, and ppl when a private PPL file is given); stop the server; then the references (the
in-process plain path when the model is known and no reference was given), greedy identity,
the verdict, and the outputs in `cfg.out`. Any stage failure raises `ValueError` (a
`StageError` names the stage and field) after the server has been stopped.
"""

from __future__ import annotations

import contextlib
import platform
import sys
import time
from collections.abc import Callable, Iterator
from datetime import datetime, timezone
from importlib import metadata
from typing import Any

from fastgemma.verify import plots, report
from fastgemma.verify.audit import run_audit
from fastgemma.verify.client import Client
from fastgemma.verify.config import VerifyConfig
from fastgemma.verify.endpoint import ServeProcess, free_port, serve_command, wait_ready
from fastgemma.verify.identity import compare
from fastgemma.verify.inputs import load_inputs
from fastgemma.verify.ppl import run_ppl
from fastgemma.verify.reference import InProcessReference
from fastgemma.verify.tps import run_tps
from fastgemma.verify.verdict import PPL_CAP_FACTOR, decide

Log = Callable[[str], None]


def _stderr(message: str) -> None:
    print(f"verify: {message}", file=sys.stderr, flush=True)


@contextlib.contextmanager
def open_endpoint(cfg: VerifyConfig, log: Log) -> Iterator[str]:
    """Yields the base URL of a ready endpoint; a server started here is stopped on exit."""
    if cfg.url is not None:
        log(f"waiting for {cfg.url} (GET /v1/models)")
        wait_ready(cfg.url, cfg.ready_timeout_s, api_key=cfg.api_key)
        yield cfg.url
        return
    port = cfg.serve_port or free_port()
    log_path = cfg.out / "serve.log"
    proc = ServeProcess(serve_command(cfg.serve.serve_args(), port), port, log_path, cfg.ready_timeout_s,
                        on_start=lambda p: log(f"started fastgemma serve (pid {p.pid}) on {p.url}; log: {log_path}"))
    with proc:
        log(f"server ready on {proc.url}")
        yield proc.url
    log("server stopped")


def _versions() -> dict[str, str]:
    out = {"python": platform.python_version(), "platform": platform.platform()}
    for name in ("fastgemma", "torch", "transformers", "httpx", "numpy"):
        try:
            out[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            out[name] = "not installed"
    return out


def run_verify(cfg: VerifyConfig, log: Log = _stderr) -> dict[str, Any]:
    inputs = load_inputs(cfg)
    cfg.out.mkdir(parents=True, exist_ok=True)
    started = datetime.now(timezone.utc).isoformat(timespec="seconds")
    seconds: dict[str, float] = {}

    def timed(name: str, fn: Callable[[], Any]) -> Any:
        t0 = time.perf_counter()
        result = fn()
        seconds[name] = round(time.perf_counter() - t0, 3)
        return result

    p = cfg.progress
    with open_endpoint(cfg, log) as url, Client(url, cfg.api_key, cfg.request_timeout_s) as client:
        model = client.model_ids()[0]
        spec_start = client.spec_decode_counters()
        public = timed("tps", lambda: run_tps(client, model, inputs.public, cfg.output_len, cfg.warmup, "tps", p))
        speculation = acceptance_summary(spec_start, client.spec_decode_counters())
        captured = timed("audit", lambda: run_audit(client, model, inputs.audit, cfg.output_len, p))
        ppl = timed("ppl", lambda: run_ppl(client, model, inputs.records, "ppl", p))
        private = timed("tps-private", lambda: run_tps(client, model, inputs.private, cfg.output_len, cfg.warmup, "tps-private", p))
        private_ppl = None
        if inputs.private_records is not None:
            private_ppl = timed("ppl-private", lambda: run_ppl(client, model, inputs.private_records, "ppl-private", p))
        server_memory = client.resident_memory_bytes()  # after every stage ran

    need_ref_ppl = cfg.reference_ppl is None
    need_ref_ids = inputs.reference_outputs is None
    ref = None
    if cfg.model_known and (need_ref_ppl or need_ref_ids):
        log("loading the in-process reference (the model's plain path)")
        ref = InProcessReference(cfg.serve.unquantized(), cfg.serve, p)  # loads when used
    ref_ppl = timed("reference ppl", lambda: ref.ppl(inputs.records)) if ref and need_ref_ppl else None
    reference_ppl = cfg.reference_ppl if cfg.reference_ppl is not None else (ref_ppl.ppl if ref_ppl else None)
    cap = reference_ppl * PPL_CAP_FACTOR if reference_ppl is not None else None
    private_cap = cap
    if private_ppl is not None and ref is not None and need_ref_ppl:
        private_cap = timed("reference ppl-private", lambda: ref.ppl(inputs.private_records, "reference ppl-private")).ppl * PPL_CAP_FACTOR

    if inputs.reference_outputs is not None:
        identity = compare(captured, inputs.reference_outputs, f"reference outputs {cfg.reference_outputs}")
    elif ref is not None:
        greedy = timed("reference greedy", lambda: ref.greedy(inputs.audit, cfg.output_len))
        identity = compare(captured, greedy, "in-process plain greedy (fastgemma LLM)")
    else:
        identity = compare(captured, {}, "none")

    verdict = decide(public, private, ppl.ppl, cap, identity,
                     private_ppl.ppl if private_ppl else None, private_cap if private_ppl else None, quick=cfg.quick)
    summary: dict[str, Any] = {
        "verdict": verdict.status, "reasons": verdict.reasons,
        "tps": public.output_tps, "output_tps": public.output_tps, "total_tps": public.total_tps,
        "ppl": ppl.ppl, "ppl_num_tokens": ppl.num_tokens, "reference_ppl": reference_ppl,
        "reference_ppl_source": "--reference-ppl" if cfg.reference_ppl is not None else ("in-process plain path" if ref_ppl else None),
        "cap": cap, "quantization": cfg.serve.quantization if cfg.model_known else None,
        "ppl_delta": ppl.ppl / reference_ppl - 1.0 if reference_ppl else None,
        "private_tps": private.output_tps, "tps_change": private.output_tps / public.output_tps - 1.0,
        "speculation": speculation,
        "server_resident_mib": server_memory / 2**20 if server_memory is not None else None,
        "identity": identity.to_dict(),
        "latencies": {k: v for k, v in public.to_dict().items() if k.endswith("_ms")},
        "public": public.to_dict(), "private": private.to_dict(), "private_source": inputs.private_source,
        "private_ppl": private_ppl.ppl if private_ppl else None, "private_cap": private_cap if private_ppl else None,
        "checks": verdict.to_dict()["checks"],
        "endpoint": {"url": cfg.url or "started fastgemma serve", "model": model,
                     "serve_args": cfg.serve.serve_args() if cfg.model_known else None},
        "stage_seconds": seconds, "configuration": cfg.to_dict(), "versions": _versions(), "started_at": started,
    }
    summary["outputs"] = _write_outputs(cfg, summary, public, private, captured, ppl, ref_ppl, private_ppl, identity, cap)
    return summary


def acceptance_summary(before: dict[str, float] | None, after: dict[str, float] | None) -> dict[str, Any] | None:
    """Drafting over the public TPS run (warm-up included) from the endpoint's /metrics
    counters; None when it exposes none or drafted nothing."""
    if before is None or after is None:
        return None
    d = {k: after[k] - before[k] for k in after}
    if d["num_drafts"] <= 0:
        return None
    return {**{k: int(v) for k, v in d.items()},
            "mean_acceptance_length": 1.0 + d["num_accepted_tokens"] / d["num_drafts"],
            "acceptance_rate": d["num_accepted_tokens"] / d["num_draft_tokens"] if d["num_draft_tokens"] else 0.0}


def _write_outputs(cfg: VerifyConfig, summary: dict[str, Any], public: Any, private: Any, captured: Any,
                   ppl: Any, ref_ppl: Any, private_ppl: Any, identity: Any, cap: float | None) -> dict[str, str]:
    out = cfg.out
    rows: list[dict[str, Any]] = []
    for run in (public, private):
        rows += [{"stage": run.stage, "index": r.index, "id": r.key, "prompt_tokens": r.prompt_tokens,
                  "completion_tokens": r.completion_tokens, "latency_s": r.latency_s, "ttft_s": r.ttft_s, "tps": r.tps}
                 for r in run.requests]
    rows += [{"stage": "audit", "id": c.key, "prompt_tokens": len(c.prompt_token_ids), "latency_s": c.latency_s,
              "token_ids": c.token_ids} for c in captured]
    for result in (ppl, ref_ppl, private_ppl):
        if result is not None:
            rows += [{"stage": result.stage, "id": r.key, "num_tokens": r.num_tokens, "nll": r.nll, "ppl": r.ppl,
                      "latency_s": r.latency_s} for r in result.records]
    rows += [{"stage": "identity", **p} for p in identity.to_dict()["prompts"]]
    paths = {
        "dir": str(out),
        "requests": str(report.write_jsonl(out / report.REQUESTS, rows)),
        "tps_plot": str(plots.plot_tps([public, private], out / "tps_per_request.png")),
        "ppl_plot": str(plots.plot_ppl(ppl, ref_ppl, cap, out / "ppl_per_record.png")),
        "record": str(out / report.RECORD), "summary": str(out / report.SUMMARY),
    }
    summary = {**summary, "outputs": paths}
    (out / report.RECORD).write_text(report.markdown_record(summary))
    report.write_json(out / report.SUMMARY, summary)
    return paths
