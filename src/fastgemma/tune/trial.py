"""One configuration measured as the verifier measures it: `evaluate(options, ...) -> Outcome`.

A fresh `fastgemma serve` with the configuration's flags (the verifier's `open_endpoint`,
its log in the trial's folder), then the verifier's stages on the tuning sample: TPS
(non-streaming chat, concurrency 1, `output_len` tokens with ignore_eos, after `warmup`
requests), speculative acceptance from `/metrics`, the greedy audit through
`/v1/completions`, and PPL through `prompt_logprobs`; after the server has stopped, the
references (references.py, cached). The hard constraints, in the verifier's words: PPL at
most `PPL_CAP_FACTOR` x the unquantised plain path's, and greedy ids identical to the served
checkpoint's plain path.

Pruning: when the TPS is no higher than `prune_at_or_below` (the best feasible TPS so far),
the configuration cannot win, so it is not judged (no audit, PPL or reference): its outcome
is `pruned`, never feasible. The TPS run itself stops as soon as its TPS is certain to end
below that (tps.py `TooSlow`); the outcome's TPS is then the rate up to that point. A
server that fails to start or a stage that fails gives an `Outcome` with `error` set: never
feasible.
"""

from __future__ import annotations

import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from fastgemma.config import EngineConfig
from fastgemma.tune.references import References
from fastgemma.verify.audit import AuditPrompt, run_audit
from fastgemma.verify.client import Client
from fastgemma.verify.config import VerifyConfig
from fastgemma.verify.data import PplRecord, Prompt
from fastgemma.verify.identity import compare
from fastgemma.verify.ppl import run_ppl
from fastgemma.verify.run import acceptance_summary, open_endpoint
from fastgemma.verify.tps import TooSlow, run_tps
from fastgemma.verify.verdict import PPL_CAP_FACTOR


@dataclass(frozen=True)
class Sample:
    """What every trial is measured on."""

    prompts: list[Prompt]  # TPS
    audit: list[AuditPrompt]  # greedy identity
    records: list[PplRecord]  # PPL
    output_len: int
    warmup: int


@dataclass(frozen=True)
class Outcome:
    tps: float | None = None  # output tokens / wall clock of the timed run
    ppl: float | None = None
    cap: float | None = None  # PPL_CAP_FACTOR x the reference PPL
    identical: bool | None = None  # greedy ids equal the plain path's on every audit prompt
    first_divergence: dict[str, int] = field(default_factory=dict)  # audit prompt -> first differing token
    acceptance: dict[str, Any] | None = None  # speculative drafting over the TPS run (warm-up included)
    ttft_ms: float | None = None  # median time to first token
    served_model_name: str | None = None  # what GET /v1/models answered
    error: str | None = None  # the server or a stage failed
    pruned: bool = False  # TPS no better than the best so far: not judged
    seconds: float = 0.0  # the trial's wall time, references included

    @property
    def status(self) -> str:
        if self.error is not None:
            return "failed"
        if self.pruned:
            return "pruned (slower than the best)"
        if not self.identical:
            return "identity broken"
        if self.ppl is None or self.cap is None or self.ppl > self.cap:
            return "ppl over cap"
        return "ok"

    @property
    def feasible(self) -> bool:
        return self.status == "ok"

    def constraints(self) -> list[float]:
        """optuna's convention: feasible when every value is <= 0."""
        if self.error is not None or self.pruned:
            return [1.0, 1.0]
        return [(self.ppl - self.cap) if self.ppl is not None and self.cap is not None else 1.0,
                0.0 if self.identical else 1.0]

    def to_dict(self) -> dict[str, Any]:
        return {**asdict(self), "status": self.status, "feasible": self.feasible}

    @staticmethod
    def from_dict(d: dict[str, Any]) -> Outcome:
        return Outcome(**{k: v for k, v in d.items() if k not in ("status", "feasible")})


def evaluate(options: EngineConfig, sample: Sample, refs: References, folder: Path,
             ready_timeout_s: float = 600.0, prune_at_or_below: float | None = None,
             log: Any = lambda _: None) -> Outcome:
    start = time.perf_counter()
    try:
        cfg = VerifyConfig(serve=options, out=folder, ready_timeout_s=ready_timeout_s, progress=False)
        with open_endpoint(cfg, log) as url, Client(url) as client:
            model = client.model_ids()[0]
            before = client.spec_decode_counters()
            try:
                tps = run_tps(client, model, sample.prompts, sample.output_len, sample.warmup, "tune", progress=False,
                              stop_below_tps=prune_at_or_below)
            except TooSlow as slow:
                return Outcome(tps=slow.rate, pruned=True, served_model_name=model, seconds=time.perf_counter() - start)
            acceptance = acceptance_summary(before, client.spec_decode_counters())
            if tps.off_length:
                raise ValueError(f"{len(tps.off_length)} requests did not return {sample.output_len} tokens")
            measured = dict(tps=tps.output_tps, acceptance=acceptance, ttft_ms=tps.stats()["median_ttft_ms"],
                            served_model_name=model)
            if prune_at_or_below is not None and tps.output_tps <= prune_at_or_below:
                return Outcome(**measured, pruned=True, seconds=time.perf_counter() - start)
            captured = run_audit(client, model, sample.audit, sample.output_len, progress=False)
            ppl = run_ppl(client, model, sample.records, "ppl", progress=False)
        reference_ids = refs.greedy(options)
        cap = refs.ppl(options) * PPL_CAP_FACTOR
    except ValueError as e:  # server start, a stage (StageError) or the engine refusing the options
        return Outcome(error=" ".join(str(e).split()), seconds=time.perf_counter() - start)
    identity = compare(captured, reference_ids, "plain path")
    return Outcome(
        **measured, ppl=ppl.ppl, cap=cap, identical=bool(identity.holds),
        first_divergence={p.key: p.first_divergence for p in identity.diverged}, seconds=time.perf_counter() - start,
    )
