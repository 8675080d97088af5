"""`fastgemma tune`: search engine options for the fastest faithful configuration.

Flags map one to one onto `fastgemma.tune.TuneConfig`. Bad input prints one `error: ...`
line and exits with code 2 (the CLI's convention); a run prints the winner and where the
leaderboard, preset and submission folder are, or with `--json` the summary as the last line.
"""

from __future__ import annotations

import json
from dataclasses import fields
from pathlib import Path
from typing import Optional

import typer

from fastgemma.cli.errors import fail
from fastgemma.config import EngineConfig, spec_of


def tune_help() -> str:
    """`fastgemma tune --help`: the searched options come from their declarations (config.py)."""
    searched = [f.name for f in fields(EngineConfig) if spec_of(f).tune is not None]
    fixed = [f.name for f in fields(EngineConfig) if spec_of(f).tune is None and spec_of(f).flag is not None]
    return (
        f"Search {', '.join(searched)} for the highest TPS under the constraints PPL <= cap and greedy identity "
        f"(not searched: {', '.join(fixed)}).\n\n"
        "Each trial starts a fresh `fastgemma serve` with one configuration and measures it with the verifier's stages "
        "on the tuning sample: TPS (non-streaming chat, concurrency 1, output tokens / wall clock), greedy ids via "
        "/v1/completions against the configuration's plain path, PPL via prompt_logprobs against 1.05 x the unquantised "
        "plain path. Optuna's TPE sampler, study in OUT/study.db (--resume continues it). Outputs: leaderboard.md/.json, "
        "tps_over_trials.png, the winner re-verified on held-out prompts (verify-trial-NNN/; one that fails identity or "
        "PPL there gives way to the next best), preset.json for `fastgemma serve --preset`, and submission/ "
        "(manifest.json + serve.py)."
    )


def tune(
    model: Optional[str] = typer.Option(None, "--model", "-m", help=spec_of(EngineConfig.__dataclass_fields__["model"]).help),
    draft_model: Optional[str] = typer.Option(
        None, "--draft-model", help=spec_of(EngineConfig.__dataclass_fields__["draft_model"]).help + " Adds speculative=mtp to the space."
    ),
    budget_trials: Optional[int] = typer.Option(None, "--budget-trials", help="Configurations measured in the study at most (default 20 without --budget-minutes)."),
    budget_minutes: Optional[float] = typer.Option(None, "--budget-minutes", help="Wall time of the search at most (the winner's re-verification comes after)."),
    prompts: Optional[Path] = typer.Option(None, "--prompts", help="sharegpt JSON (default: the challenge prompts)."),
    ppl_data: Optional[Path] = typer.Option(None, "--ppl-data", help="PPL records JSONL (default: the challenge records)."),
    holdout_prompts: Optional[Path] = typer.Option(None, "--holdout-prompts", help="sharegpt JSON for the winner's re-run (default: a held-out split of --prompts)."),
    num_prompts: int = typer.Option(8, "--num-prompts", help="Tuning prompts per trial (TPS)."),
    num_holdout_prompts: Optional[int] = typer.Option(None, "--num-holdout-prompts", help="Held-out prompts (default: as many)."),
    num_audit_prompts: int = typer.Option(4, "--num-audit-prompts", help="Prompts decoded per trial for greedy identity."),
    num_ppl_records: int = typer.Option(8, "--num-ppl-records", help="PPL records per trial (the first N)."),
    output_len: int = typer.Option(256, "--output-len", help="max_tokens with ignore_eos per request."),
    warmup: int = typer.Option(1, "--warmup", help="Untimed requests per trial."),
    seed: int = typer.Option(1, "--seed", help="Prompt order and the sampler's seed."),
    out: Path = typer.Option(Path("tune-out"), "--out", "-o", help="Folder for the study, trials, leaderboard, preset, submission."),
    resume: bool = typer.Option(False, "--resume", help="Continue the study in --out."),
    no_verify: bool = typer.Option(False, "--no-verify", help="Skip re-verifying the winner on held-out prompts."),
    no_prune: bool = typer.Option(False, "--no-prune", help="Judge every trial (by default one no faster than the best so far is not)."),
    ready_timeout: float = typer.Option(600.0, "--ready-timeout", help="Seconds to wait for each trial's server."),
    as_json: bool = typer.Option(False, "--json", help="Print the summary object as the last stdout line."),
) -> None:
    from fastgemma.tune import TuneConfig, run_tune

    try:
        cfg = TuneConfig(
            model=model, draft_model=draft_model, prompts=prompts, holdout_prompts=holdout_prompts, ppl_data=ppl_data,
            num_prompts=num_prompts, num_holdout_prompts=num_holdout_prompts, num_audit_prompts=num_audit_prompts,
            num_ppl_records=num_ppl_records, output_len=output_len, warmup=warmup, seed=seed,
            budget_trials=budget_trials if budget_trials is not None or budget_minutes is not None else 20,
            budget_minutes=budget_minutes, out=out, resume=resume, verify_winner=not no_verify, prune=not no_prune,
            ready_timeout_s=ready_timeout, progress=not as_json,
        )
        summary = run_tune(cfg)
    except ValueError as e:
        fail(str(e))
    except KeyboardInterrupt:
        typer.echo(f"error: interrupted; the study in {out} keeps every finished trial: --resume continues it", err=True)
        raise typer.Exit(code=130) from None
    if as_json:
        typer.echo(json.dumps(summary, default=str))
        return
    w = summary["winner"]
    if w is None:
        typer.echo(f"no feasible configuration in {summary['measured']} measured; leaderboard: {summary['leaderboard']['markdown']}")
        raise typer.Exit(code=1)
    v = summary.get("verification")
    typer.echo(f"winner (trial {w['trial']}, {w['hash']}): {w['tps']:.2f} tok/s, PPL {w['ppl']:.4f} <= {w['cap']:.4f}, identical")
    typer.echo(f"  fastgemma serve {' '.join(w['serve_args'])}")
    if summary["baseline_tps"]:
        typer.echo(f"  {w['tps'] / summary['baseline_tps']:.2f}x the defaults ({summary['baseline_tps']:.2f} tok/s)")
    if v is not None:
        typer.echo(f"  re-verified: {v['verdict']}, held-out {v['holdout_tps']:.2f} tok/s ({100 * v['holdout_vs_tuning']:+.1f}% vs tuning)"
                   + "".join(f"; {r}" for r in v["reasons"]))
    typer.echo(f"leaderboard: {summary['leaderboard']['markdown']}; preset: {summary['preset']}; submission: {summary['submission']}")
