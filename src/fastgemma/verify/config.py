"""What one verification run does: `VerifyConfig` (validated once, never mutated).

`ServeOptions` is the one place that knows how a model is served: `cli_args()` builds the
`fastgemma serve` arguments, `llm_kwargs()` the in-process reference's `LLM(...)` arguments.
Both are derived from `EngineConfig`'s field metadata (config.py): a field's `flag` is its
serve flag, and a field marked `reference` is loaded with the served value by the reference,
because it changes the model's numbers (dtype, quantisation, kernels) or limits. Every other
option (speculation, the lm_head screen, threads, prefill chunk) changes only the speed, so
the reference runs the plain path without it: greedy identity is checked against plain
decoding of the same checkpoint. `--quantization` is the one option with two references:
greedy identity against the quantised model's own plain path, PPL against the unquantised
model (`unquantized_llm_kwargs()`), so that the cap bounds what quantising costs.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path
from typing import Any

from fastgemma.config import MAX_SPECULATIVE_TOKENS, SPECULATIVE_METHODS, EngineConfig
from fastgemma.kernels.quant import SCHEMES
from fastgemma.data import PPL_FILE, PROMPTS_FILE, challenge_file

DTYPES = ("auto", "bfloat16", "bf16", "float32", "fp32")  # as `fastgemma serve --dtype` takes them

# --quick: a few prompts and short outputs (about 4 minutes on a 2-core AVX2 CPU in fp32).
QUICK = {"num_prompts": 4, "num_private_prompts": 4, "output_len": 64, "warmup": 1, "num_ppl_records": 2}


def serve_flag(name: str) -> str | None:
    """The `fastgemma serve` flag of the `EngineConfig` option `name` (None: not a serve option)."""
    return {f.name: f.metadata["flag"] for f in fields(EngineConfig)}.get(name)


@dataclass(frozen=True)
class ServeOptions:
    """The model and the `EngineConfig` options that have a serve flag (a test keeps the two
    field lists equal), with `EngineConfig`'s defaults; validated by `EngineConfig` itself."""

    model: str | None = None  # None: the embedded default model
    dtype: str = "auto"
    max_model_len: int | None = None
    prefill_chunk: int = 512
    kernels: str = "auto"
    enforce_eager: bool = False  # CUDA: no CUDA graph
    threads: int | None = None
    quantization: str = "none"  # one of kernels.quant.SCHEMES
    lm_head_screen: bool = True
    speculative: str = "none"  # one of config.SPECULATIVE_METHODS
    num_speculative_tokens: int = 4
    draft_model: str | None = None  # --speculative mtp: the Gemma 4 assistant
    prompt_lookup_min: int = 2
    prompt_lookup_max: int = 4

    def __post_init__(self) -> None:
        if self.speculative not in SPECULATIVE_METHODS:
            raise ValueError(f"invalid --speculative {self.speculative!r}; use one of: {', '.join(SPECULATIVE_METHODS)}")
        if not 1 <= self.num_speculative_tokens <= MAX_SPECULATIVE_TOKENS:
            raise ValueError(f"--num-speculative-tokens must be in 1..{MAX_SPECULATIVE_TOKENS}")
        if (self.speculative == "mtp") != (self.draft_model is not None):
            raise ValueError("--speculative mtp and --draft-model go together: give both or neither")
        if self.dtype not in DTYPES:
            raise ValueError(f"invalid --dtype {self.dtype!r}; use one of: auto, bfloat16, float32")
        if self.quantization not in SCHEMES:
            raise ValueError(f"invalid --quantization {self.quantization!r}; use one of: {', '.join(SCHEMES)}")
        if self.max_model_len is not None and self.max_model_len < 2:
            raise ValueError(f"--max-model-len must be >= 2 (got {self.max_model_len})")
        EngineConfig(**asdict(self))  # every other rule, in the engine's own words

    def changed(self) -> dict[str, Any]:
        """The options that differ from the defaults, model excluded (a preset's content)."""
        return {f.name: getattr(self, f.name) for f in fields(self)
                if f.name != "model" and getattr(self, f.name) != f.default}

    def cli_args(self) -> list[str]:
        """Arguments after `fastgemma serve` (host and port are added by the endpoint): the
        model, then every option that differs from its default, by its flag."""
        args = [self.model] if self.model else []
        for name, value in self.changed().items():
            flag = serve_flag(name)
            assert flag is not None, f"ServeOptions.{name} has no serve flag in EngineConfig"
            if isinstance(value, bool):
                args.append(flag if value else "--no-" + flag.removeprefix("--"))
            else:
                args += [flag, str(value)]
        return args

    def llm_kwargs(self) -> dict[str, Any]:
        """The served checkpoint: greedy identity is checked against its plain path."""
        return {f.name: getattr(self, f.name) for f in fields(EngineConfig)
                if f.metadata["reference"] and hasattr(self, f.name)}

    def unquantized_llm_kwargs(self) -> dict[str, Any]:
        """The model before `--quantization`: the PPL reference the cap is taken from."""
        return {**self.llm_kwargs(), "quantization": "none"}


@dataclass(frozen=True)
class VerifyConfig:
    url: str | None = None  # an OpenAI-compatible endpoint; None: start `fastgemma serve` with `serve`
    serve: ServeOptions = field(default_factory=ServeOptions)
    api_key: str | None = None  # bearer token for --url
    prompts: Path | None = None  # sharegpt JSON; None: the packaged challenge prompts
    ppl_data: Path | None = None  # PPL JSONL; None: the packaged challenge records
    private_prompts: Path | None = None  # None: a seeded held-out split of `prompts`
    private_ppl_data: Path | None = None  # None: no private PPL re-run
    num_prompts: int | None = None  # None: all (with private_prompts) or half of the prompt file
    num_private_prompts: int | None = None  # None: as many as num_prompts (held-out: the rest)
    num_ppl_records: int | None = None  # None: every record (first N in file order otherwise)
    output_len: int = 512  # max_tokens with ignore_eos: every request emits exactly this many
    warmup: int = 4  # untimed warm-up requests before each timed run
    seed: int = 1  # prompt order, as bench_serving --seed
    reference_ppl: float | None = None  # None: measure the plain path in-process (model known)
    reference_outputs: Path | None = None  # plain greedy ids (JSONL); None: in-process (model known)
    out: Path = Path("verify-out")  # summary.json, requests.jsonl, record.md, plots, serve.log
    serve_port: int = 0  # port for the started server; 0: a free one
    ready_timeout_s: float = 900.0  # wait this long for GET /v1/models to answer 200
    request_timeout_s: float = 3600.0  # one request at most
    quick: bool = False  # recorded in the summary; QUICK holds the sizes it implies
    progress: bool = True  # progress bars on stderr

    def __post_init__(self) -> None:
        if self.url is not None and self.serve != ServeOptions():
            raise ValueError("--model and serve options (--dtype, --max-model-len) start a server; --url uses a running one: give one or the other")
        if self.url is not None and not self.url.startswith(("http://", "https://")):
            raise ValueError(f"--url must start with http:// or https:// (got {self.url!r})")
        for name in ("num_prompts", "num_private_prompts", "num_ppl_records"):
            value = getattr(self, name)
            if value is not None and value < 1:
                raise ValueError(f"--{name.replace('_', '-')} must be >= 1 (got {value})")
        if self.output_len < 1:
            raise ValueError(f"--output-len must be >= 1 (got {self.output_len})")
        if self.warmup < 0:
            raise ValueError(f"--warmup must be >= 0 (got {self.warmup})")
        if self.reference_ppl is not None and not (math.isfinite(self.reference_ppl) and self.reference_ppl >= 1.0):
            raise ValueError(f"--reference-ppl must be a finite number >= 1 (got {self.reference_ppl})")
        if not 0 <= self.serve_port <= 65535:
            raise ValueError(f"--serve-port must be in [0, 65535] (got {self.serve_port})")
        if self.ready_timeout_s <= 0 or self.request_timeout_s <= 0:
            raise ValueError("timeouts must be > 0 seconds")

    @property
    def model_known(self) -> bool:
        """The verifier knows the checkpoint (so it can run the plain path itself)."""
        return self.url is None

    def prompts_path(self) -> Path:
        return self.prompts or challenge_file(PROMPTS_FILE)

    def ppl_path(self) -> Path:
        return self.ppl_data or challenge_file(PPL_FILE)

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d.pop("api_key")  # never written to the outputs
        d.update(prompts=str(self.prompts_path()), ppl_data=str(self.ppl_path()))
        return {k: (str(v) if isinstance(v, Path) else v) for k, v in d.items()}
