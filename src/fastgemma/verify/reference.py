"""The in-process reference: the model's plain path, loaded with `fastgemma.LLM`.

Used when the verifier knows the checkpoint (the embedded model or `--model`) and no
`--reference-ppl` / `--reference-outputs` replaces it. It loads after the server under test
has stopped, so the two never hold the device's memory at once.

- PPL: `LLM.score(context + target)` (log p of every token given its prefix), through the same
  formula as the served stage (`ppl.score_records`).
- Greedy: `LLM.generate` on the audit prompts' token ids, temperature 0, `ignore_eos`,
  `max_tokens` = output len: plain step-by-step greedy decoding of the same checkpoint.
"""

from __future__ import annotations

import time
from typing import Any

from tqdm import tqdm

from fastgemma.verify.audit import AuditPrompt
from fastgemma.verify.data import PplRecord
from fastgemma.verify.ppl import PplResult, score_records


class InProcessReference:
    def __init__(self, llm_kwargs: dict[str, Any], progress: bool = True):
        from fastgemma import LLM

        self.llm = LLM(**llm_kwargs)
        self.progress = progress

    def ppl(self, records: list[PplRecord], stage: str = "reference ppl") -> PplResult:
        def scorer(ids: list[int]) -> tuple[list[float | None], float]:
            start = time.perf_counter()
            return self.llm.score(ids), time.perf_counter() - start

        return score_records(records, scorer, stage, self.progress)

    def greedy(self, prompts: list[AuditPrompt], output_len: int) -> dict[str, list[int]]:
        from fastgemma import SamplingParams

        params = SamplingParams(max_tokens=output_len, temperature=0.0, ignore_eos=True)
        out = {}
        for p in tqdm(prompts, desc="reference: plain greedy", unit="req", disable=not self.progress, leave=False):
            out[p.key] = list(self.llm.generate([p.prompt_token_ids], params)[0].token_ids)
        return out
