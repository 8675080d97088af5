"""One tuning run, start to finish: `run_tune(cfg) -> summary`.

Order: load and check the inputs (the same files and seeded samples as `fastgemma verify`);
build the search space for this device; open (or resume) the study; search under the budget,
each trial measured in its own server (trial.py) with its log and `trial.json` in
`<out>/trials/NNN-HASH/`; write the leaderboard; re-verify the winner with the full verifier
(`run_verify`: fresh server, tuning prompts as the public run, held-out prompts as the private
re-run, greedy identity on all of them and the PPL cap) in `<out>/verify-trial-NNN/`; a winner
that fails identity or PPL there is rejected and the next best is re-verified (at most
`MAX_FALLBACKS` times; a TPS re-run outside ±5% is reported, not rejected: it measures the
prompts as much as the configuration); export the preset and the submission folder; write
`<out>/tune.json`. The budget bounds the search only.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

from fastgemma.config import EngineConfig
from fastgemma.tune import leaderboard
from fastgemma.tune.config import TuneConfig
from fastgemma.tune.export import export_preset, export_winner_submission
from fastgemma.tune.references import References
from fastgemma.tune.space import SearchSpace, config_hash
from fastgemma.tune.study import measured_trials, open_study, outcome_of, ranked, search
from fastgemma.tune.trial import Outcome, Sample, evaluate
from fastgemma.verify import VerifyConfig, run_verify
from fastgemma.verify.audit import audit_prompts
from fastgemma.verify.data import load_ppl_records, load_prompts, public_and_held_out, take

MAX_FALLBACKS = 2  # next-best configurations re-verified when the winner fails identity or PPL
FAITHFULNESS_CHECKS = ("greedy identity", "ppl cap", "private ppl cap")  # verify's checks that disqualify


def _stderr(message: str) -> None:
    print(f"tune: {message}", file=sys.stderr, flush=True)


def load_sample(cfg: TuneConfig) -> Sample:
    """The tuning sample, drawn as `fastgemma verify` draws its public sample (same seed)."""
    prompts = load_prompts(cfg.prompts_path())
    records = load_ppl_records(cfg.ppl_path())
    n_holdout = cfg.num_holdout_prompts or cfg.num_prompts
    if cfg.holdout_prompts is not None:
        public = take(prompts, cfg.num_prompts, cfg.seed, f"the prompts file {cfg.prompts_path()}")
        take(load_prompts(cfg.holdout_prompts), n_holdout, cfg.seed, f"the held-out prompts file {cfg.holdout_prompts}")
    else:
        public, _ = public_and_held_out(prompts, cfg.num_prompts, n_holdout, cfg.seed)
    return Sample(public, audit_prompts(public, records, cfg.num_audit_prompts), records[:cfg.num_ppl_records],
                  cfg.output_len, cfg.warmup)


def run_tune(cfg: TuneConfig, space: SearchSpace | None = None, log: Any = _stderr) -> dict[str, Any]:
    sample = load_sample(cfg)
    if space is None:
        space = SearchSpace.build(EngineConfig(model=cfg.model).torch_device().type, cfg.model, cfg.draft_model)
    study = open_study(cfg.out, cfg.setup(), cfg.resume, cfg.seed)
    log("search space: " + "; ".join(space.describe()))
    refs = References(cfg.out / "references", sample.audit, sample.records, cfg.output_len, cfg.progress)

    def measure(options: EngineConfig, number: int, best_tps: float | None) -> Outcome:
        folder = cfg.out / "trials" / f"{number:03d}-{config_hash(options)}"
        outcome = evaluate(options, sample, refs, folder, cfg.ready_timeout_s, prune_at_or_below=best_tps if cfg.prune else None)
        (folder / "trial.json").parent.mkdir(parents=True, exist_ok=True)
        (folder / "trial.json").write_text(json.dumps(
            {"trial": number, "serve_args": options.serve_args(), "options": options.changed(), **outcome.to_dict()},
            indent=1, default=str) + "\n")
        return outcome

    search(study, space, measure, cfg.budget_trials, cfg.budget_minutes, cfg.progress)
    measured = measured_trials(study)
    baseline = next((outcome_of(t) for t in measured if t.number == 0), None)
    summary: dict[str, Any] = {
        "winner": None, "trials": len(study.trials), "measured": len(measured),
        "feasible": sum(outcome_of(t).feasible for t in measured),
        "baseline_tps": baseline.tps if baseline else None, "search_space": space.describe(),
        "rejected": {}, "configuration": cfg.to_dict(),
    }
    chosen, verified = None, None
    for trial in ranked(study)[: 1 + (MAX_FALLBACKS if cfg.verify_winner else 0)]:
        options = space.options(dict(trial.params))
        if not cfg.verify_winner:
            chosen = trial
            break
        log(f"re-verifying trial {trial.number} on held-out prompts (fastgemma verify): {' '.join(options.serve_args())}")
        verified = _reverify(cfg, options, refs.ppl(options), cfg.out / f"verify-trial-{trial.number:03d}", log)
        unfaithful = [c["detail"] for c in verified["checks"] if c["name"] in FAITHFULNESS_CHECKS and c["status"] == "fail"]
        if not unfaithful:
            chosen = trial
            break
        summary["rejected"][trial.user_attrs["hash"]] = verified["reasons"]
        log(f"trial {trial.number} failed re-verification ({'; '.join(unfaithful)}): taking the next best")
    header = [f"# fastgemma tune: {len(measured)} configurations measured ({len(study.trials)} trials)", "",
              f"Tuning sample: {cfg.num_prompts} prompts x {cfg.output_len} tokens (TPS), {cfg.num_audit_prompts} "
              f"audit prompts (greedy identity), {cfg.num_ppl_records} PPL records; constraints: PPL <= cap, identical."]
    summary["leaderboard"] = leaderboard.write(study, cfg.out, header, summary["rejected"])
    if chosen is None:
        log("no feasible configuration was found (or none survived re-verification); see the leaderboard")
        _write_summary(cfg.out, summary)
        return summary

    options, outcome = space.options(dict(chosen.params)), outcome_of(chosen)
    summary["winner"] = {"trial": chosen.number, "hash": chosen.user_attrs["hash"], "options": options.changed(),
                         "serve_args": options.serve_args(), **outcome.to_dict()}
    log(f"winner: trial {chosen.number}, {outcome.tps:.2f} tok/s, PPL {outcome.ppl:.4f}: {' '.join(options.serve_args())}")
    measured_info: dict[str, Any] = {"tps": outcome.tps, "ppl": outcome.ppl, "trial": chosen.number,
                                     "hash": chosen.user_attrs["hash"], "tuning": cfg.setup()}
    if verified is not None:
        summary["verification"] = {
            "verdict": verified["verdict"], "reasons": verified["reasons"], "tps": verified["tps"],
            "holdout_tps": verified["private_tps"], "holdout_vs_tuning": verified["private_tps"] / outcome.tps - 1.0,
            "tps_change": verified["tps_change"], "ppl": verified["ppl"], "cap": verified["cap"],
            "record": verified["outputs"]["record"],
        }
        measured_info["verification"] = summary["verification"]
        log(f"winner {verified['verdict']}: held-out {verified['private_tps']:.2f} tok/s vs tuning {outcome.tps:.2f}"
            + "".join(f"; {r}" for r in verified["reasons"]))
    preset = export_preset(cfg.out / "preset.json", options, measured_info)
    served_name = outcome.served_model_name or options.model or "model"
    summary["preset"] = str(preset)
    summary["submission"] = str(export_winner_submission(cfg.out / "submission", options, served_name, measured_info))
    _write_summary(cfg.out, summary)
    return summary


def _reverify(cfg: TuneConfig, options: EngineConfig, reference_ppl: float, out: Path, log: Any) -> dict[str, Any]:
    """`fastgemma verify` of one configuration: the tuning prompts as its public run, the
    held-out prompts as its private re-run, the same PPL records and reference."""
    return run_verify(VerifyConfig(
        serve=options, prompts=cfg.prompts, private_prompts=cfg.holdout_prompts, ppl_data=cfg.ppl_data,
        num_prompts=cfg.num_prompts, num_private_prompts=cfg.num_holdout_prompts or cfg.num_prompts,
        num_ppl_records=cfg.num_ppl_records, output_len=cfg.output_len, warmup=cfg.warmup, seed=cfg.seed,
        reference_ppl=reference_ppl, out=out, ready_timeout_s=cfg.ready_timeout_s, progress=cfg.progress,
    ), log=lambda m: log(f"verify: {m}"))


def _write_summary(out: Path, summary: dict[str, Any]) -> None:
    (out / "tune.json").write_text(json.dumps(summary, indent=1, default=str) + "\n")
