"""The `fastgemma` command line: generate, convert, serve, quantize, bench, verify, tune, submission.

Every command runs on the embedded default model when no model is given. A user mistake
(bad path, unknown model type, invalid value) prints one line `error: ...` to stderr and
exits with code 2; nothing else is printed for it.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any, Optional

import typer

from fastgemma.cli.errors import fail
from fastgemma.cli.options import engine_options, option_help
from fastgemma.cli.submission import submission
from fastgemma.cli.tune import tune, tune_help
from fastgemma.cli.verify import verify
from fastgemma.config import EngineConfig
from fastgemma.kernels.cpu import set_cpu_threads

# Plain click help (rich's boxed tables truncate long flags at 80 columns).
HELP_SETTINGS = {"max_content_width": 100, "help_option_names": ["--help", "-h"]}
app = typer.Typer(add_completion=False, no_args_is_help=True, rich_markup_mode=None, context_settings=HELP_SETTINGS,
                  help="fastgemma: fast, faithful Gemma inference.")

ModelOpt = typer.Option(None, "--model", "-m", help=option_help("model"))


@app.command()
@engine_options()
def generate(
    prompt: str = typer.Argument(..., help="Prompt text (use --chat to wrap it in the chat template)."),
    model: Optional[str] = ModelOpt,
    max_tokens: int = typer.Option(128, "--max-tokens", help="Tokens to generate at most."),
    temperature: float = typer.Option(0.0, "--temperature", help="0 = greedy."),
    top_p: float = typer.Option(1.0, "--top-p"),
    top_k: int = typer.Option(0, "--top-k"),
    min_p: float = typer.Option(0.0, "--min-p"),
    repetition_penalty: float = typer.Option(1.0, "--repetition-penalty",
                                             help="> 1 discourages repeating the prompt's and output's tokens."),
    presence_penalty: float = typer.Option(0.0, "--presence-penalty"),
    frequency_penalty: float = typer.Option(0.0, "--frequency-penalty"),
    min_tokens: int = typer.Option(0, "--min-tokens", help="Tokens generated before EOS or a stop id may end the text."),
    seed: Optional[int] = typer.Option(None, "--seed"),
    chat: bool = typer.Option(False, "--chat", help="Format the prompt as one user turn."),
    options: dict[str, Any] | None = None,
) -> None:
    """Stream a completion of PROMPT to stdout."""
    from fastgemma.engine.sampling_params import SamplingParams

    try:
        params = SamplingParams(max_tokens=max_tokens, temperature=temperature, top_p=top_p, top_k=top_k, min_p=min_p,
                                repetition_penalty=repetition_penalty, presence_penalty=presence_penalty,
                                frequency_penalty=frequency_penalty, min_tokens=min_tokens, seed=seed)
        config = EngineConfig(model=model, **(options or {}))  # usage errors end here, before torch loads
        from fastgemma import LLM

        if config.torch_device().type == "cpu":
            set_cpu_threads(config.cpu_threads())  # once, as the process starts
        llm = LLM.from_config(config)
        ids = llm.chat_prompt_ids([{"role": "user", "content": prompt}]) if chat else llm.encode_prompt(prompt)
        llm.engine.completion_budget(len(ids), max_tokens)  # as the server: refused, not cut short
        for delta in llm.stream(ids, params):
            sys.stdout.write(delta.text)
            sys.stdout.flush()
    except ValueError as e:
        fail(str(e))
    sys.stdout.write("\n")


@app.command()
def convert(
    model: Optional[str] = typer.Argument(None, help="A .gguf file (default: the embedded model)."),
    out: Path = typer.Option(..., "--out", "-o", help="Folder to write."),
    dtype: str = typer.Option("auto", "--dtype", help="auto (bfloat16) | bfloat16 | float32 (the GGUF's values exactly)."),
) -> None:
    """Write a GGUF checkpoint as a Hugging Face folder (safetensors, config, tokenizer)."""
    from fastgemma.weights.convert import convert_to_hf_folder

    try:
        typer.echo(str(convert_to_hf_folder(model, out, dtype)))
    except ValueError as e:
        fail(str(e))


@app.command()
@engine_options()
def serve(
    model: Optional[str] = typer.Argument(None, help="Model (default: the preset's, else $MODEL_ID, else the embedded model)."),
    host: Optional[str] = typer.Option(None, "--host", help="Bind address (default: $HOST, else 127.0.0.1)."),
    port: Optional[int] = typer.Option(None, "--port", help="Port (default: $PORT, else 8000)."),
    served_model_name: Optional[str] = typer.Option(None, "--served-model-name", help="Default: $SERVED_MODEL_NAME."),
    api_key: Optional[str] = typer.Option(None, "--api-key", help="Require this bearer token."),
    preset: Optional[Path] = typer.Option(
        None, "--preset", help="JSON engine options (from `fastgemma tune`); flags given here override it."
    ),
    max_queue: int = typer.Option(64, "--max-queue", help="Requests waiting at most; more get 429."),
    allow_remote_media: bool = typer.Option(
        False, "--allow-remote-media",
        help="Fetch http(s) image URLs in chat content parts (off: only data URLs).",
    ),
    shutdown_timeout: float = typer.Option(
        30.0, "--shutdown-timeout",  # serve.DEFAULT_SHUTDOWN_TIMEOUT (not imported: it loads torch)
        help="On SIGTERM, refuse new requests (503) and wait up to this many seconds for those in flight; 0: stop at once.",
    ),
    use_ray: bool = typer.Option(False, "--ray", help="Serve on Ray Serve: --replicas engines behind Ray's proxy (pip install 'fastgemma[ray]')."),
    replicas: int = typer.Option(1, "--replicas", help="With --ray: engine replicas, each with the machine's cores / replicas CPUs."),
    ray_address: Optional[str] = typer.Option(None, "--ray-address", help="With --ray: join this Ray cluster (default: start a local one)."),
    options: dict[str, Any] | None = None,
) -> None:
    """Serve an OpenAI-compatible API (vLLM's routes and fields)."""
    from fastgemma.preset import load_preset
    from fastgemma.server import run_server, settings_from_env

    try:
        engine = dict(options or {})
        if preset is not None:
            chosen = load_preset(preset)
            engine = {**chosen.options, **engine}  # a flag given here wins over the preset
            model = model if model is not None else chosen.model
        settings = settings_from_env(model=model, served_model_name=served_model_name, host=host, port=port)
        config = EngineConfig(model=settings.pop("model"), **engine)
        server = {"api_key": api_key, "max_queue": max_queue, "allow_remote_media": allow_remote_media,
                  "shutdown_timeout": shutdown_timeout}
        if use_ray:
            from fastgemma.server.ray_serve import run_ray

            run_ray(config, **settings, **server, replicas=replicas, address=ray_address)
        elif replicas != 1 or ray_address is not None:
            fail("--replicas and --ray-address need --ray")
        else:
            run_server(config, **settings, **server)
    except ValueError as e:
        fail(str(e))


@app.command()
def quantize(
    model: Optional[str] = typer.Argument(None, help="Model folder, .gguf file or hub id (default: the embedded model)."),
    scheme: str = typer.Option(..., "--scheme", "-s", help="int8 | int4-g32 | int4-g128."),
    out: Path = typer.Option(..., "--out", "-o", help="Folder to write."),
    dtype: str = typer.Option(
        "auto", "--dtype", help="The other tensors: auto (as stored; a GGUF's in bfloat16) | bfloat16 | float32."
    ),
) -> None:
    """Write MODEL with its body linears quantised: a folder that loads like any checkpoint."""
    from fastgemma.weights.quantize import write_quantized_folder

    try:
        typer.echo(str(write_quantized_folder(model, scheme, out, dtype)))
    except ValueError as e:
        fail(str(e))


bench_app = typer.Typer(no_args_is_help=True, rich_markup_mode=None, context_settings=HELP_SETTINGS, help="Benchmarks that print a table and a final JSON line.")
app.add_typer(bench_app, name="bench")


@bench_app.command("decode")
@engine_options(lists=("quantization", "speculative"))
def bench_decode(
    model: Optional[str] = ModelOpt,
    prompts: Optional[Path] = typer.Option(None, "--prompts", help="sharegpt JSON (default: the challenge prompts)."),
    num_prompts: int = typer.Option(4, "--num-prompts"),
    output_len: int = typer.Option(256, "--output-len", help="Tokens generated per prompt (EOS ignored)."),
    compare: str = typer.Option("", "--compare", help="Comma-separated: transformers,llama.cpp."),
    repetitions: int = typer.Option(1, "--repetitions", help="Passes over the prompts."),
    warmup: int = typer.Option(1, "--warmup", help="Untimed short runs per engine first."),
    no_check: bool = typer.Option(False, "--no-check", help="Skip the greedy comparison with the plain path."),
    ppl_records: int = typer.Option(0, "--ppl-records", help="Also score this many PPL records per scheme (0: none)."),
    ppl_data: Optional[Path] = typer.Option(None, "--ppl-data", help="PPL records JSONL (default: the challenge's)."),
    as_json: bool = typer.Option(False, "--json", help="Print only the JSON line."),
    options: dict[str, Any] | None = None,
) -> None:
    """Batch-1 prefill and decode speed, fastgemma side by side with other engines.

    Timed per prompt and engine: TTFT = from the request until the first generated token (prefill + first sample); prefill tok/s = prompt tokens / TTFT; decode tok/s = (OUTPUT_LEN - 1) / time from the first to the last of OUTPUT_LEN greedy tokens (EOS ignored). Medians (± stdev) over prompts x repetitions, engines alternating prompt by prompt. Model load and warm-up are not timed.

    Each --quantization scheme and each --speculative method is its own fastgemma engine in the same alternation; a speculative engine also reports its mean acceptance length and per-position acceptance. Also reported per fastgemma engine: the bytes one decode step reads (its cost model), the GB/s that implies and its share of the read bandwidth measured in the same run, whether its greedy tokens equal those of the same configuration's plain path (EngineConfig.plain(): per-op, full lm_head, no drafting), prompt by prompt, and with --ppl-records N the PPL over N challenge records and its change against the unquantised model (not timed).
    """
    from fastgemma.bench.decode import DecodeBenchConfig, render_table, run_decode_bench

    try:
        engine = {"model": model, **(options or {})}
        grid = DecodeBenchConfig.engine_grid(
            engine, engine.pop("quantization", ("none",)), engine.pop("speculative", ("none",))
        )
        cfg = DecodeBenchConfig(
            engines=grid,
            prompts=prompts, num_prompts=num_prompts, output_len=output_len,
            compare=tuple(c.strip() for c in compare.split(",") if c.strip()),
            repetitions=repetitions, warmup=warmup, check_identity=not no_check, ppl_records=ppl_records, ppl_data=ppl_data,
        )
        result = run_decode_bench(cfg, log=(lambda *_: None) if as_json else (lambda m: typer.echo(m, err=True)))
    except ValueError as e:
        fail(str(e))
    if not as_json:
        render_table(result)
    typer.echo(json.dumps(result))


@bench_app.command("serve")
@engine_options()
def bench_serve(
    model: Optional[str] = ModelOpt,
    url: Optional[str] = typer.Option(None, "--url", help="An OpenAI-compatible endpoint to measure (default: start fastgemma serve with the options given here)."),
    concurrency: str = typer.Option("1,2,4,8", "--concurrency", help="Comma-separated client counts."),
    num_prompts: int = typer.Option(16, "--num-prompts", help="Challenge prompts used, in turn."),
    output_len: int = typer.Option(256, "--output-len", help="Tokens generated per request (EOS ignored)."),
    rounds: int = typer.Option(2, "--rounds", help="Requests per client at each concurrency."),
    prompts: Optional[Path] = typer.Option(None, "--prompts", help="sharegpt JSON (default: the challenge prompts)."),
    as_json: bool = typer.Option(False, "--json", help="Print only the JSON line."),
    options: dict[str, Any] | None = None,
) -> None:
    """Served throughput and latency at several concurrencies (continuous batching).

    At each concurrency C, C clients stream chat requests of OUTPUT_LEN greedy tokens back to back (ROUNDS each). Reported: aggregate output tok/s and its ratio to the first concurrency's, time to first token and inter-token latency (median, p99).
    """
    from fastgemma.bench.serve import ServeBenchConfig, render_table, run_serve_bench

    try:
        levels = tuple(int(c) for c in concurrency.split(",") if c.strip())
        cfg = ServeBenchConfig(
            engine=EngineConfig(model=model, **(options or {})), url=url, concurrency=levels,
            num_prompts=num_prompts, output_len=output_len, rounds=rounds, prompts=prompts,
        )
        result = run_serve_bench(cfg, log=(lambda *_: None) if as_json else (lambda m: typer.echo(m, err=True)))
    except (ValueError, RuntimeError) as e:
        fail(str(e))
    if not as_json:
        render_table(result)
    typer.echo(json.dumps(result))


app.command("verify")(verify)
app.command("tune", help=tune_help())(tune)
app.command("submission")(submission)


def main() -> None:
    app()


if __name__ == "__main__":
    main()
