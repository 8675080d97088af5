"""The `fastgemma` command line: generate, convert, serve.

Every command runs on the embedded default model when no model is given. A user mistake
(bad path, unknown model type, invalid value) prints one line `error: ...` to stderr and
exits with code 2; nothing else is printed for it.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Optional

import typer

app = typer.Typer(add_completion=False, no_args_is_help=True, help="fastgemma: fast, faithful Gemma inference.")

ModelOpt = typer.Option(None, "--model", "-m", help="Model folder, .gguf file or hub id (default: embedded Gemma 3 270M).")
DtypeOpt = typer.Option("auto", "--dtype", help="auto | bfloat16 | float32.")
MaxLenOpt = typer.Option(None, "--max-model-len", help="Prompt + output tokens (default: min(model max, 32768)).")


def _fail(message: str) -> None:
    one_line = " ".join(part.strip() for part in message.splitlines() if part.strip())
    typer.echo(f"error: {one_line}", err=True)
    raise typer.Exit(code=2)


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
) -> None:
    """Stream a completion of PROMPT to stdout."""
    from fastgemma import LLM, SamplingParams

    try:
        params = SamplingParams(max_tokens=max_tokens, temperature=temperature, top_p=top_p, top_k=top_k, seed=seed)
        llm = LLM(model=model, dtype=dtype, max_model_len=max_model_len)
        ids = llm.chat_prompt_ids([{"role": "user", "content": prompt}]) if chat else llm.encode_prompt(prompt)
        for delta in llm.stream(ids, params):
            sys.stdout.write(delta.text)
            sys.stdout.flush()
    except ValueError as e:
        _fail(str(e))
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
        _fail(str(e))


@app.command()
def serve(
    model: Optional[str] = typer.Argument(None, help="Model (default: $MODEL_ID, else the embedded model)."),
    host: Optional[str] = typer.Option(None, "--host", help="Bind address (default: $HOST, else 127.0.0.1)."),
    port: Optional[int] = typer.Option(None, "--port", help="Port (default: $PORT, else 8000)."),
    served_model_name: Optional[str] = typer.Option(None, "--served-model-name", help="Default: $SERVED_MODEL_NAME."),
    api_key: Optional[str] = typer.Option(None, "--api-key", help="Require this bearer token."),
    dtype: str = DtypeOpt,
    max_model_len: Optional[int] = MaxLenOpt,
    max_queue: int = typer.Option(64, "--max-queue", help="Requests waiting at most; more get 429."),
) -> None:
    """Serve an OpenAI-compatible API (vLLM's routes and fields)."""
    from fastgemma.server import run_server, settings_from_env

    try:
        settings = settings_from_env(model=model, served_model_name=served_model_name, host=host, port=port)
        run_server(**settings, api_key=api_key, dtype=dtype, max_model_len=max_model_len, max_queue=max_queue)
    except ValueError as e:
        _fail(str(e))


def main() -> None:
    app()


if __name__ == "__main__":
    main()
