"""Everything a run reads, loaded and checked before any server starts: `load_inputs(cfg)`.

Sample sizes when not given: with `--private-prompts`, every public prompt and as many
private ones (at most the private file's count); without it, half of the public file and a
held-out private split of the other half (seeded, disjoint: the challenge's private set is
not public, so this stands in for it and the summary says so). PPL records: the first
`num_ppl_records` in file order (all by default). Audit prompts: one per public prompt
(see `audit.audit_prompts`).
"""

from __future__ import annotations

from dataclasses import dataclass

from fastgemma.verify.audit import AuditPrompt, audit_prompts
from fastgemma.verify.config import VerifyConfig
from fastgemma.verify.data import (
    PplRecord,
    Prompt,
    load_ppl_records,
    load_prompts,
    load_reference_outputs,
    public_and_held_out,
    take,
)


@dataclass(frozen=True)
class Inputs:
    public: list[Prompt]
    private: list[Prompt]
    private_source: str  # how the private prompts were chosen, for the summary
    records: list[PplRecord]
    private_records: list[PplRecord] | None
    audit: list[AuditPrompt]
    reference_outputs: dict[str, list[int]] | None


def load_inputs(cfg: VerifyConfig) -> Inputs:
    prompts = load_prompts(cfg.prompts_path())
    all_records = load_ppl_records(cfg.ppl_path())
    if cfg.private_prompts is not None:
        private_all = load_prompts(cfg.private_prompts)
        n_public = cfg.num_prompts or len(prompts)
        n_private = cfg.num_private_prompts or min(n_public, len(private_all))
        public = take(prompts, n_public, cfg.seed, f"the prompts file {cfg.prompts_path()}")
        private = take(private_all, n_private, cfg.seed, f"the private prompts file {cfg.private_prompts}")
        source = f"file {cfg.private_prompts}"
    else:
        n_public = cfg.num_prompts or max(1, len(prompts) // 2)
        n_private = cfg.num_private_prompts or min(n_public, len(prompts) - n_public)
        if n_private < 1:
            raise ValueError(
                f"the prompts file has {len(prompts)} usable prompts, none left for a held-out private split; "
                "lower --num-prompts or give --private-prompts FILE"
            )
        public, private = public_and_held_out(prompts, n_public, n_private, cfg.seed)
        source = (f"held-out split of {cfg.prompts_path().name} (seed {cfg.seed}, disjoint from the public sample; "
                  "the challenge's private set is not public)")
    n_records = cfg.num_ppl_records or len(all_records)
    private_records = None
    if cfg.private_ppl_data is not None:
        private_records = load_ppl_records(cfg.private_ppl_data)[:n_records]
    refs = load_reference_outputs(cfg.reference_outputs) if cfg.reference_outputs is not None else None
    return Inputs(public, private, source, all_records[:n_records], private_records,
                  audit_prompts(public, all_records, len(public)), refs)
