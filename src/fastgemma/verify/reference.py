"""The in-process reference: the model's plain path, loaded with `fastgemma.LLM`.

Used when the verifier knows the checkpoint (the embedded model or `--model`) and no
`--reference-ppl` / `--reference-outputs` replaces it. It loads after the server under test
has stopped, so the two never hold the device's memory at once.

- PPL: `LLM.score(context + target)` (log p of every token given its prefix), through the same
  formula as the served stage (`ppl.score_records`), of the unquantised model: the cap bounds
  what `--quantization` costs.
- Greedy: `LLM.generate` on the audit prompts' token ids, temperature 0, `ignore_eos`,
  `max_tokens` = output len: plain step-by-step greedy decoding of the checkpoint as served (quantised
  if the server quantises), one op at a time with the full-precision lm_head.
"""

from __future__ import annotations

import time
from typing import Any

from tqdm import tqdm

from fastgemma.config import EngineConfig
from fastgemma.verify.audit import AuditPrompt
from fastgemma.verify.data import PplRecord
from fastgemma.verify.ppl import PplResult, score_records


class InProcessReference:
    """`ppl()` scores with `ppl_config`'s plain path, `greedy()` decodes with `greedy_config`'s
    (the same unless the server quantises at load); one engine is held at a time."""

    def __init__(self, ppl_config: EngineConfig, greedy_config: EngineConfig | None = None, progress: bool = True):
        # the plain path: one op at a time, full-precision lm_head, no drafting (config.py)
        self.ppl_config = ppl_config.plain()
        self.greedy_config = (greedy_config or ppl_config).plain()
        self.progress = progress
        self._held: tuple[EngineConfig, Any] | None = None

    def _llm(self, config: EngineConfig) -> Any:
        from fastgemma import LLM

        if self._held is None or self._held[0] != config:
            self._held = None  # free the other model before loading this one
            self._held = (config, LLM.from_config(config))
        return self._held[1]

    def ppl(self, records: list[PplRecord], stage: str = "reference ppl") -> PplResult:
        llm = self._llm(self.ppl_config)

        def scorer(ids: list[int]) -> tuple[list[float | None], float]:
            start = time.perf_counter()
            return llm.score(ids), time.perf_counter() - start

        return score_records(records, scorer, stage, self.progress)

    def greedy(self, prompts: list[AuditPrompt], output_len: int) -> dict[str, list[int]]:
        from fastgemma import SamplingParams

        params = SamplingParams(max_tokens=output_len, temperature=0.0, ignore_eos=True)
        llm = self._llm(self.greedy_config)
        out = {}
        for p in tqdm(prompts, desc="reference: plain greedy", unit="req", disable=not self.progress, leave=False):
            out[p.key] = list(llm.generate([p.prompt_token_ids], params)[0].token_ids)
        return out
