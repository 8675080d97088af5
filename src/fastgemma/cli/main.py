"""The `fastgemma` command line: generate, convert, serve, quantize, bench, verify, tune, submission.

Every command runs on the embedded default model when no model is given. A user mistake
(bad path, unknown model type, invalid value) prints one line `error: ...` to stderr and
exits with code 2; nothing else is printed for it.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Optional

import typer

from fastgemma.cli.errors import fail, left_default
from fastgemma.cli.submission import submission
from fastgemma.cli.tune import tune
from fastgemma.cli.verify import verify

app = typer.Typer(add_completion=False, no_args_is_help=True, help="fastgemma: fast, faithful Gemma inference.")

ModelOpt = typer.Option(None, "--model", "-m", help="Model folder, .gguf file or hub id (default: embedded Gemma 3 270M).")
DtypeOpt = typer.Option("auto", "--dtype", help="auto | bfloat16 | float32.")
MaxLenOpt = typer.Option(None, "--max-model-len", help="Prompt + output tokens (default: min(model max, 32768)).")
QuantOpt = typer.Option(
    "none", "--quantization", "-q", help="Body linear weights: none | int8 | int4-g32 | int4-g128 (at load)."
)
ScreenOpt = typer.Option(
    True, "--lm-head-screen/--no-lm-head-screen", help="Greedy tokens through the exact int8 lm_head screen."
)
SpecOpt = typer.Option(
    "none", "--speculative",
    help="Speculative decoding: none | ngram (prompt lookup) | mtp (Gemma 4 assistant, --draft-model); greedy output unchanged.",
)
DraftOpt = typer.Option(None, "--draft-model", help="mtp: Gemma 4 assistant folder or hub id (gemma4_assistant).")
NumSpecOpt = typer.Option(4, "--num-speculative-tokens", "-k", help="Tokens drafted per step (1-15).")
LookupMinOpt = typer.Option(2, "--prompt-lookup-min", help="ngram: shortest suffix matched.")
LookupMaxOpt = typer.Option(4, "--prompt-lookup-max", help="ngram: longest suffix matched (tried first).")


@app.command()
def generate(
    prompt: str = typer.Argument(..., help="Prompt text (use --chat to wrap it in the chat template)."),
    model: Optional[str] = ModelOpt,
    dtype: str = DtypeOpt,
    max_model_len: Optional[int] = MaxLenOpt,
    max_tokens: int = typer.Option(128, "--max-tokens", help="Tokens to generate at most."),
    temperature: float = typer.Option(0.0, "--temperature", help="0 = greedy."),
    top_p: float = typer.Option(1.0, "--top-p"),
    top_k: int = typer.Option(0, "--top-k"),
    seed: Optional[int] = typer.Option(None, "--seed"),
    chat: bool = typer.Option(False, "--chat", help="Format the prompt as one user turn."),
    quantization: str = QuantOpt,
    speculative: str = SpecOpt,
    num_speculative_tokens: int = NumSpecOpt,
    draft_model: Optional[str] = DraftOpt,
) -> None:
    """Stream a completion of PROMPT to stdout."""
    from fastgemma import LLM, SamplingParams

    try:
        params = SamplingParams(max_tokens=max_tokens, temperature=temperature, top_p=top_p, top_k=top_k, seed=seed)
        llm = LLM(
            model=model, dtype=dtype, max_model_len=max_model_len, quantization=quantization,
            speculative=speculative, num_speculative_tokens=num_speculative_tokens, draft_model=draft_model,
        )
        ids = llm.chat_prompt_ids([{"role": "user", "content": prompt}]) if chat else llm.encode_prompt(prompt)
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
) -> None:
    """Write a GGUF checkpoint as a Hugging Face folder (fp32 safetensors, config, tokenizer)."""
    from fastgemma.weights.convert import convert_to_hf_folder

    try:
        typer.echo(str(convert_to_hf_folder(model, out)))
    except ValueError as e:
        fail(str(e))


@app.command()
def serve(
    ctx: typer.Context,
    model: Optional[str] = typer.Argument(None, help="Model (default: the preset's, else $MODEL_ID, else the embedded model)."),
    host: Optional[str] = typer.Option(None, "--host", help="Bind address (default: $HOST, else 127.0.0.1)."),
    port: Optional[int] = typer.Option(None, "--port", help="Port (default: $PORT, else 8000)."),
    served_model_name: Optional[str] = typer.Option(None, "--served-model-name", help="Default: $SERVED_MODEL_NAME."),
    api_key: Optional[str] = typer.Option(None, "--api-key", help="Require this bearer token."),
    preset: Optional[Path] = typer.Option(
        None, "--preset", help="JSON engine options (from `fastgemma tune`); flags given here override it."
    ),
    dtype: str = DtypeOpt,
    max_model_len: Optional[int] = MaxLenOpt,
    max_queue: int = typer.Option(64, "--max-queue", help="Requests waiting at most; more get 429."),
    prefill_chunk: int = typer.Option(512, "--prefill-chunk", help="Prompt tokens per prefill forward."),
    kernels: str = typer.Option(
        "auto", "--kernels",
        help="auto: fastgemma's CPU kernels where supported, CUDA's fixed-shape decode step | torch: stock only.",
    ),
    enforce_eager: bool = typer.Option(
        False, "--enforce-eager", help="CUDA: run the decode step eagerly instead of replaying its CUDA graph."
    ),
    threads: Optional[int] = typer.Option(None, "--threads", help="CPU threads (default: the physical cores)."),
    quantization: str = QuantOpt,
    lm_head_screen: bool = ScreenOpt,
    speculative: str = SpecOpt,
    num_speculative_tokens: int = NumSpecOpt,
    prompt_lookup_min: int = LookupMinOpt,
    prompt_lookup_max: int = LookupMaxOpt,
    draft_model: Optional[str] = DraftOpt,
    allow_remote_media: bool = typer.Option(
        False, "--allow-remote-media", help="Fetch http(s) image URLs in chat content parts (off: only data URLs)."
    ),
) -> None:
    """Serve an OpenAI-compatible API (vLLM's routes and fields)."""
    from fastgemma.preset import load_preset, serve_option_names
    from fastgemma.server import run_server, settings_from_env

    try:
        engine = {name: ctx.params[name] for name in serve_option_names()}
        if preset is not None:
            chosen = load_preset(preset)
            engine.update({name: value for name, value in chosen.options.items()
                           if left_default(ctx, name)})
            model = model if model is not None else chosen.model
        settings = settings_from_env(model=model, served_model_name=served_model_name, host=host, port=port)
        run_server(**settings, api_key=api_key, max_queue=max_queue, allow_remote_media=allow_remote_media, **engine)
    except ValueError as e:
        fail(str(e))


@app.command()
def quantize(
    model: Optional[str] = typer.Argument(None, help="Model folder, .gguf file or hub id (default: the embedded model)."),
    scheme: str = typer.Option(..., "--scheme", "-s", help="int8 | int4-g32 | int4-g128."),
    out: Path = typer.Option(..., "--out", "-o", help="Folder to write."),
) -> None:
    """Write MODEL with its body linears quantised: a folder that loads like any checkpoint."""
    from fastgemma.weights.quantize import write_quantized_folder

    try:
        typer.echo(str(write_quantized_folder(model, scheme, out)))
    except ValueError as e:
        fail(str(e))


bench_app = typer.Typer(no_args_is_help=True, help="Benchmarks that print a table and a final JSON line.")
app.add_typer(bench_app, name="bench")


@bench_app.command("decode")
def bench_decode(
    model: Optional[str] = ModelOpt,
    prompts: Optional[Path] = typer.Option(None, "--prompts", help="sharegpt JSON (default: the challenge prompts)."),
    num_prompts: int = typer.Option(4, "--num-prompts"),
    output_len: int = typer.Option(256, "--output-len", help="Tokens generated per prompt (EOS ignored)."),
    compare: str = typer.Option("", "--compare", help="Comma-separated: transformers,llama.cpp."),
    dtype: str = DtypeOpt,
    repetitions: int = typer.Option(1, "--repetitions", help="Passes over the prompts."),
    warmup: int = typer.Option(1, "--warmup", help="Untimed short runs per engine first."),
    no_check: bool = typer.Option(False, "--no-check", help="Skip the greedy comparison with the plain path."),
    quantization: str = typer.Option(
        "none", "--quantization", "-q", help="Comma-separated schemes, each its own engine: none,int8,int4-g32,int4-g128."
    ),
    lm_head_screen: bool = ScreenOpt,
    speculative: str = typer.Option(
        "none", "--speculative",
        help="Comma-separated, each its own engine: none,ngram,mtp (mtp needs --draft-model; greedy output unchanged).",
    ),
    num_speculative_tokens: int = NumSpecOpt,
    prompt_lookup_min: int = LookupMinOpt,
    prompt_lookup_max: int = LookupMaxOpt,
    draft_model: Optional[str] = DraftOpt,
    ppl_records: int = typer.Option(0, "--ppl-records", help="Also score this many PPL records per scheme (0: none)."),
    ppl_data: Optional[Path] = typer.Option(None, "--ppl-data", help="PPL records JSONL (default: the challenge's)."),
    as_json: bool = typer.Option(False, "--json", help="Print only the JSON line."),
) -> None:
    """Batch-1 prefill and decode speed, fastgemma side by side with other engines.

    Timed per prompt and engine: TTFT = from the request until the first generated token (prefill + first sample); prefill tok/s = prompt tokens / TTFT; decode tok/s = (OUTPUT_LEN - 1) / time from the first to the last of OUTPUT_LEN greedy tokens (EOS ignored). Medians (± stdev) over prompts x repetitions, engines alternating prompt by prompt. Model load and warm-up are not timed.

    Each --quantization scheme and each --speculative method is its own fastgemma engine in the same alternation; a speculative engine also reports its mean acceptance length and per-position acceptance. Also reported per fastgemma engine: the bytes one decode step reads (its cost model), the GB/s that implies and its share of the read bandwidth measured in the same run, whether its greedy tokens equal those of the same model on its plain path (per-op, full lm_head), prompt by prompt, and with --ppl-records N the PPL over N challenge records and its change against the unquantised model (not timed).
    """
    from fastgemma.bench.decode import DecodeBenchConfig, render_table, run_decode_bench

    try:
        cfg = DecodeBenchConfig(
            model=model, prompts=prompts, num_prompts=num_prompts, output_len=output_len,
            compare=tuple(c.strip() for c in compare.split(",") if c.strip()), dtype=dtype,
            repetitions=repetitions, warmup=warmup, check_identity=not no_check,
            quantization=tuple(q.strip() for q in quantization.split(",") if q.strip()), lm_head_screen=lm_head_screen,
            speculative=tuple(m.strip() for m in speculative.split(",") if m.strip()),
            num_speculative_tokens=num_speculative_tokens, prompt_lookup_min=prompt_lookup_min,
            prompt_lookup_max=prompt_lookup_max, draft_model=draft_model, ppl_records=ppl_records, ppl_data=ppl_data,
        )
        result = run_decode_bench(cfg, log=(lambda *_: None) if as_json else (lambda m: typer.echo(m, err=True)))
    except ValueError as e:
        fail(str(e))
    if not as_json:
        render_table(result)
    typer.echo(json.dumps(result))


app.command("verify")(verify)
app.command("tune")(tune)
app.command("submission")(submission)


def main() -> None:
    app()


if __name__ == "__main__":
    main()
