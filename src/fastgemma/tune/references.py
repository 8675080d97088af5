"""The plain-path references a trial is judged against, computed once per checkpoint numerics.

Greedy ids from the served configuration's plain path (`EngineConfig.plain()`) and the PPL
reference from its unquantised model's (`unquantized().plain()`, what the cap is taken from),
as `fastgemma verify` takes them (verify/config.py), computed in-process by the verifier's
`InProcessReference` before a trial's server starts (the two never share the cores). Cached
as JSON under `<out>/references/`, keyed by a hash of the plain configuration and the
sample, so trials with the same numerics and a resumed study reuse them.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import asdict
from pathlib import Path
from typing import Any

from fastgemma.config import EngineConfig
from fastgemma.verify.audit import AuditPrompt
from fastgemma.verify.data import PplRecord
from fastgemma.verify.reference import InProcessReference


class References:
    def __init__(self, folder: Path, audit: list[AuditPrompt], records: list[PplRecord], output_len: int,
                 progress: bool = True):
        self.folder, self.audit, self.records = Path(folder), audit, records
        self.output_len, self.progress = output_len, progress

    def _cached(self, kind: str, config: EngineConfig, compute: Any) -> Any:
        kwargs = asdict(config.plain())
        sample = [p.key for p in self.audit] if kind == "greedy" else [r.key for r in self.records]
        blob = json.dumps({"kind": kind, "llm": kwargs, "sample": sample, "output_len": self.output_len},
                          sort_keys=True, default=str)
        path = self.folder / f"{kind}-{hashlib.sha256(blob.encode()).hexdigest()[:12]}.json"
        if path.exists():
            return json.loads(path.read_text())["value"]
        value = compute(InProcessReference(config, progress=self.progress))
        self.folder.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps({"llm": kwargs, "value": value}, default=str))
        return value

    def greedy(self, options: EngineConfig) -> dict[str, list[int]]:
        """Plain greedy ids of the served checkpoint on the audit prompts."""
        return self._cached("greedy", options, lambda ref: ref.greedy(self.audit, self.output_len))

    def ppl(self, options: EngineConfig) -> float:
        """PPL of the unquantised checkpoint's plain path on the records: the cap's reference."""
        return self._cached("ppl", options.unquantized(), lambda ref: ref.ppl(self.records).ppl)
