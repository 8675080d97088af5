"""What one tuning run does: `TuneConfig` (validated once, never mutated).

Samples, as `fastgemma verify` draws them (verify/inputs.py, same seed): the tuning prompts
are the first `num_prompts` of the seeded order of `prompts`; the held-out prompts are the
first `num_holdout_prompts` of `holdout_prompts`, or without that file the last ones of the
same order (disjoint from the tuning prompts). PPL: the first `num_ppl_records` records.
Greedy identity: `num_audit_prompts` of them decoded through `/v1/completions`.

Budget: `budget_trials` counts configurations measured in the study (a resumed study counts
those already measured; invalid or repeated configurations cost nothing and do not count);
`budget_minutes` bounds this invocation's wall time. The search stops at whichever comes first.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from fastgemma.data import PPL_FILE, PROMPTS_FILE, challenge_file


@dataclass(frozen=True)
class TuneConfig:
    model: str | None = None  # None: the embedded default model
    draft_model: str | None = None  # a Gemma 4 assistant: puts speculative=mtp in the space
    prompts: Path | None = None  # sharegpt JSON; None: the challenge prompts
    holdout_prompts: Path | None = None  # None: a held-out split of `prompts`
    ppl_data: Path | None = None  # PPL JSONL; None: the challenge records
    num_prompts: int = 8  # tuning prompts per trial (TPS)
    num_holdout_prompts: int | None = None  # None: as many as num_prompts
    num_audit_prompts: int = 4  # greedy identity per trial
    num_ppl_records: int = 8  # PPL per trial
    output_len: int = 256  # max_tokens with ignore_eos, as the challenge's 512 but shorter
    warmup: int = 1  # untimed requests per trial
    seed: int = 1  # prompt order and the sampler's seed
    budget_trials: int | None = 20  # configurations measured in the study at most
    budget_minutes: float | None = None  # wall time of this invocation at most
    out: Path = Path("tune-out")  # study.db, trials/, leaderboard, preset.json, submission/
    resume: bool = False  # continue the study in `out`
    verify_winner: bool = True  # re-verify the winner on the held-out prompts
    prune: bool = True  # skip judging (audit, PPL, references) a trial no faster than the best so far
    ready_timeout_s: float = 600.0  # per trial server start
    progress: bool = True  # progress bar on stderr

    def __post_init__(self) -> None:
        for name in ("num_prompts", "num_audit_prompts", "num_ppl_records", "output_len"):
            if getattr(self, name) < 1:
                raise ValueError(f"--{name.replace('_', '-')} must be >= 1 (got {getattr(self, name)})")
        if self.num_holdout_prompts is not None and self.num_holdout_prompts < 1:
            raise ValueError(f"--num-holdout-prompts must be >= 1 (got {self.num_holdout_prompts})")
        if self.num_audit_prompts > self.num_prompts:
            raise ValueError("--num-audit-prompts cannot exceed --num-prompts (audit prompts are tuning prompts)")
        if self.warmup < 0:
            raise ValueError(f"--warmup must be >= 0 (got {self.warmup})")
        if self.budget_trials is None and self.budget_minutes is None:
            raise ValueError("give a budget: --budget-trials N or --budget-minutes M")
        if self.budget_trials is not None and self.budget_trials < 1:
            raise ValueError(f"--budget-trials must be >= 1 (got {self.budget_trials})")
        if self.budget_minutes is not None and not (math.isfinite(self.budget_minutes) and self.budget_minutes > 0):
            raise ValueError(f"--budget-minutes must be > 0 (got {self.budget_minutes})")
        if self.ready_timeout_s <= 0:
            raise ValueError("--ready-timeout must be > 0 seconds")

    def prompts_path(self) -> Path:
        return self.prompts or challenge_file(PROMPTS_FILE)

    def ppl_path(self) -> Path:
        return self.ppl_data or challenge_file(PPL_FILE)

    def setup(self) -> dict[str, Any]:
        """What a trial's figures depend on besides its configuration: a resumed study must
        match it, or its old and new trials would not be comparable."""
        keys = ("model", "draft_model", "num_prompts", "num_audit_prompts", "num_ppl_records", "output_len",
                "warmup", "seed")
        d = {k: asdict(self)[k] for k in keys}
        d.update(prompts=str(self.prompts_path()), ppl_data=str(self.ppl_path()))
        return d

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d.update(prompts=str(self.prompts_path()), ppl_data=str(self.ppl_path()))
        return {k: (str(v) if isinstance(v, Path) else v) for k, v in d.items()}
