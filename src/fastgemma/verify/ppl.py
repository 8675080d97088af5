"""Stage ppl: teacher-forced perplexity over `{context_token_ids, target_token_ids}` records.

The protocol (the challenge harness's, computed here): each record is one `/v1/completions`
request whose prompt is context + target ids with `prompt_logprobs: 1`; the logprob of each
target token given everything before it is read from `choices[0].prompt_logprobs`.

    nll_r = -Σ_{t in targets of r} log p(t | prefix)
    PPL   = exp(Σ_r nll_r / Σ_r |targets_r|)          (token-weighted, not a mean of PPLs)

`score_records` applies the same formula to any scorer, so the served path and the
in-process reference are measured identically.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field

from tqdm import tqdm

from fastgemma.verify.client import Client
from fastgemma.verify.data import PplRecord


@dataclass(frozen=True)
class RecordScore:
    key: str
    num_tokens: int
    nll: float  # summed over the record's targets
    latency_s: float = 0.0

    @property
    def ppl(self) -> float:
        return math.exp(self.nll / self.num_tokens)


@dataclass(frozen=True)
class PplResult:
    stage: str
    records: list[RecordScore] = field(default_factory=list)

    @property
    def num_tokens(self) -> int:
        return sum(r.num_tokens for r in self.records)

    @property
    def ppl(self) -> float:
        return math.exp(sum(r.nll for r in self.records) / self.num_tokens)

    def to_dict(self) -> dict[str, object]:
        return {"ppl": self.ppl, "ppl_num_tokens": self.num_tokens, "num_records": len(self.records)}


Scorer = Callable[[list[int]], tuple[list[float | None], float]]  # ids -> (logprob per position, seconds)


def score_records(records: list[PplRecord], scorer: Scorer, stage: str, progress: bool = True) -> PplResult:
    scores = []
    for r in tqdm(records, desc=f"{stage}: score records", unit="rec", disable=not progress, leave=False):
        ids = r.context_token_ids + r.target_token_ids
        logprobs, seconds = scorer(ids)
        targets = logprobs[len(r.context_token_ids):]
        if len(targets) != len(r.target_token_ids) or any(lp is None for lp in targets):
            raise ValueError(f"stage {stage}: record {r.key}: the scorer returned no logprob for some target tokens")
        scores.append(RecordScore(r.key, len(targets), -sum(targets), seconds))  # type: ignore[arg-type]
    return PplResult(stage, scores)


def run_ppl(client: Client, model: str, records: list[PplRecord], stage: str = "ppl", progress: bool = True) -> PplResult:
    return score_records(records, lambda ids: client.prompt_token_logprobs(stage, model, ids), stage, progress)
