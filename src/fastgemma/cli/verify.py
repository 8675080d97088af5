"""`fastgemma verify`: the challenge's measurements against an endpoint, and a verdict.

Flags map one to one onto `fastgemma.verify.VerifyConfig`; the serve options are the
engine's own (cli/options.py) and make its `serve` config; `--quick` fills the sizes it
implies (`QUICK`) where they are not given. Bad input prints one `error: ...` line and exits
with code 2 (the CLI's convention); a run prints the verdict table, or with `--json` the
summary object as the last stdout line, and exits with the verdict: 0 VERIFIED, 1 INVALID,
3 PENDING (a check could not be judged), the reasons on stderr.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Optional

import typer

from fastgemma.cli.errors import fail
from fastgemma.cli.options import engine_options

# The exit status tells scripts the verdict (2 stays the CLI's usage-error code).
VERDICT_EXIT_CODES = {"VERIFIED": 0, "INVALID": 1, "PENDING": 3}


@engine_options()
def verify(
    url: Optional[str] = typer.Option(None, "--url", help="A running OpenAI-compatible endpoint (ours, vLLM, SGLang)."),
    model: Optional[str] = typer.Option(None, "--model", "-m", help="Start `fastgemma serve MODEL` (default: the embedded model)."),
    preset: Optional[Path] = typer.Option(
        None, "--preset", help="Serve options from a preset (`fastgemma tune`); the serve flags here override it."
    ),
    prompts: Optional[Path] = typer.Option(None, "--prompts", help="sharegpt JSON (default: the challenge prompts)."),
    ppl_data: Optional[Path] = typer.Option(None, "--ppl-data", help="PPL records JSONL (default: the challenge records)."),
    private_prompts: Optional[Path] = typer.Option(None, "--private-prompts", help="Private sharegpt JSON (default: a held-out split)."),
    private_ppl_data: Optional[Path] = typer.Option(None, "--private-ppl-data", help="Private PPL records for the re-run."),
    num_prompts: Optional[int] = typer.Option(None, "--num-prompts", help="Public prompts (default: all, or half without --private-prompts)."),
    num_private_prompts: Optional[int] = typer.Option(None, "--num-private-prompts", help="Private prompts (default: as many)."),
    num_ppl_records: Optional[int] = typer.Option(None, "--num-ppl-records", help="PPL records, first N (default: all)."),
    output_len: Optional[int] = typer.Option(None, "--output-len", help="max_tokens with ignore_eos (default 512)."),
    warmup: Optional[int] = typer.Option(None, "--warmup", help="Untimed warm-up requests per run (default 4)."),
    seed: int = typer.Option(1, "--seed", help="Prompt order (bench_serving --seed)."),
    reference_ppl: Optional[float] = typer.Option(None, "--reference-ppl", help="Reference PPL; cap = this x 1.05."),
    reference_outputs: Optional[Path] = typer.Option(None, "--reference-outputs", help="JSONL {id, token_ids}: plain greedy outputs."),
    out: Path = typer.Option(Path("verify-out"), "--out", "-o", help="Folder for summary.json, requests.jsonl, record.md, plots."),
    api_key: Optional[str] = typer.Option(None, "--api-key", help="Bearer token for --url."),
    serve_port: int = typer.Option(0, "--serve-port", help="Port for the started server (default: a free one)."),
    ready_timeout: float = typer.Option(900.0, "--ready-timeout", help="Seconds to wait for GET /v1/models."),
    quick: bool = typer.Option(False, "--quick", help="4 + 4 prompts, 64 tokens, 2 PPL records, 1 warm-up."),
    as_json: bool = typer.Option(False, "--json", help="Print the summary object as the last stdout line, no table."),
    options: dict[str, Any] | None = None,
) -> None:
    """Measure TPS, PPL and greedy identity as the challenge does, re-run on private prompts, give a verdict.

    Stages: tps (sglang bench_serving v0.5.2 methodology, non-streaming chat, concurrency 1), audit capture (greedy ids via /v1/completions), ppl (prompt_logprobs, token-weighted), the private re-run (tps, and ppl with --private-ppl-data), then references in-process when the model is known, greedy identity and the verdict: VERIFIED, INVALID or PENDING with reasons.
    """
    from fastgemma.config import EngineConfig
    from fastgemma.preset import load_preset
    from fastgemma.verify import QUICK, VerifyConfig, run_verify
    from fastgemma.verify.report import render_table

    sizes = QUICK if quick else {"output_len": 512, "warmup": 4}
    given = {"num_prompts": num_prompts, "num_private_prompts": num_private_prompts,
             "num_ppl_records": num_ppl_records, "output_len": output_len, "warmup": warmup}
    chosen = {k: (v if v is not None else sizes.get(k)) for k, v in given.items()}
    try:
        engine = dict(options or {})
        if url is not None and (preset is not None or model is not None or engine):
            raise ValueError(
                "--url uses a running endpoint; --model, --preset and the serve options "
                f"({', '.join('--' + k.replace('_', '-') for k in engine) or 'e.g. --dtype'}) start one: give one or the other"
            )
        loaded = load_preset(preset) if preset is not None else None
        if loaded is not None:  # a flag given here wins over the preset
            model, engine = (model if model is not None else loaded.model), {**loaded.options, **engine}
        serve = EngineConfig(model=model, **engine)
        cfg = VerifyConfig(
            url=url, serve=serve, api_key=api_key, prompts=prompts, ppl_data=ppl_data,
            private_prompts=private_prompts, private_ppl_data=private_ppl_data, seed=seed,
            reference_ppl=reference_ppl, reference_outputs=reference_outputs, out=out, serve_port=serve_port,
            ready_timeout_s=ready_timeout, quick=quick, **chosen,
        )
        summary = run_verify(cfg)
    except ValueError as e:
        fail(str(e))
    except KeyboardInterrupt:
        typer.echo("error: interrupted; the started server was stopped", err=True)
        raise typer.Exit(code=130) from None
    if as_json:
        typer.echo(json.dumps(summary))
    else:
        render_table(summary)
    code = VERDICT_EXIT_CODES[summary["verdict"]]
    if code:
        typer.echo(f"verdict {summary['verdict']}: " + "; ".join(summary["reasons"]), err=True)
        raise typer.Exit(code=code)
