"""Engine configuration: what to load and how to run it, validated once.

`EngineConfig` is built from user input (CLI flags, `LLM(...)` arguments); `torch_dtype()`
and `torch_device()` turn "auto" choices into concrete ones for this machine. Invalid values
raise `ValueError` naming the accepted ones. Nothing mutates a config after construction.

Each field is declared with `option(...)`, whose metadata is the one description of the
option that the rest of fastgemma reads:
- `flag`: its `fastgemma serve` flag (verify/config.py builds server command lines from it);
- `reference`: the in-process plain-path reference is loaded with the served value, because
  the option changes the model's numbers (dtype, quantisation, kernels) or limits;
- `tune`: how `fastgemma tune` searches it (`Tunable`: values or an integer range, the
  devices where it has an effect, and the option value it depends on); tune/space.py builds
  the search space from these and nothing else.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch

from fastgemma.kernels.cpu import cpu_has_fast_bf16, physical_cores
from fastgemma.kernels.quant import SCHEMES, QuantScheme

DTYPES = {"auto": None, "bfloat16": torch.bfloat16, "bf16": torch.bfloat16, "float32": torch.float32, "fp32": torch.float32}
DEFAULT_MAX_MODEL_LEN_CAP = 32768  # without --max-model-len: min(model maximum, this)
SPECULATIVE_METHODS = ("none", "ngram", "mtp")
MAX_SPECULATIVE_TOKENS = 15  # a verification's K + 1 rows stay within the row-invariant GEMVs' 16


@dataclass(frozen=True)
class Tunable:
    """How `fastgemma tune` searches one option: `choices` (categorical), or integers in
    `low..high` (`high` may be a function of the machine, e.g. its physical cores)."""

    choices: tuple[Any, ...] = ()
    low: int | None = None
    high: int | Callable[[], int] | None = None
    devices: tuple[str, ...] = ("cpu", "cuda")  # device types where the option has an effect
    when: tuple[str, tuple[Any, ...]] | None = None  # searched only while option `when[0]` is one of `when[1]`

    def upper(self) -> int:
        return self.high() if callable(self.high) else int(self.high)


def option(default: Any, *, flag: str | None = None, reference: bool = False, tune: Tunable | None = None) -> Any:
    """A config field with the metadata described in the module docstring."""
    return field(default=default, metadata={"flag": flag, "reference": reference, "tune": tune})


@dataclass(frozen=True)
class EngineConfig:
    # folder, .gguf file or hub id; None = the embedded default model (`fastgemma serve MODEL`)
    model: str | None = option(None, reference=True)
    # auto | bfloat16 | float32
    dtype: str = option("auto", flag="--dtype", reference=True, tune=Tunable(choices=("bfloat16", "float32")))
    # prompt + output tokens; None = min(model maximum, 32768)
    max_model_len: int | None = option(None, flag="--max-model-len", reference=True)
    # "cpu", "cuda", "cuda:1"; None = cuda when available
    device: str | None = option(None)
    # prompt tokens per prefill forward (bounds activation memory). Not tuned: the chunk's shape
    # changes how a bf16 prefill's matmuls round, so a prompt longer than the chunk can decode
    # differently (`fastgemma tune` found one: 128 vs 512, a 332-token prompt, token 140).
    prefill_chunk: int = option(512, flag="--prefill-chunk")
    # auto: fastgemma's CPU kernels where the CPU has AVX2 + FMA, and on CUDA the fixed-shape
    # decode step (engine/static_step.py); torch: stock per-op paths only. The kernels round
    # differently in bf16, so they are part of the model's numbers.
    kernels: str = option("auto", flag="--kernels", reference=True, tune=Tunable(choices=("auto", "torch"), devices=("cpu",)))
    # CUDA, kernels=auto: run the fixed-shape decode step eagerly instead of replaying its CUDA
    # graph (vLLM's --enforce-eager). Same numbers either way: the graph replays the same kernels.
    enforce_eager: bool = option(False, flag="--enforce-eager")
    # CPU threads; None = the physical cores
    threads: int | None = option(None, flag="--threads", tune=Tunable(low=1, high=physical_cores, devices=("cpu",)))
    # body linears: none | int8 | int4-g32 | int4-g128 (kernels/quant.py; decode through
    # cpu_quant_gemv.c on CPU, the Triton kernel of kernels/cuda_quant.py on CUDA)
    quantization: str = option("none", flag="--quantization", reference=True, tune=Tunable(choices=SCHEMES))
    # greedy tokens through the exact int8 lm_head screen (native CPU kernels)
    lm_head_screen: bool = option(
        True, flag="--lm-head-screen", tune=Tunable(choices=(True, False), devices=("cpu",), when=("kernels", ("auto",)))
    )
    # none | ngram (engine/ngram.py) | mtp (engine/mtp.py): drafts verified K at a time; exact
    # with the native CPU kernels or CUDA's fixed-shape step (llm.py says why)
    speculative: str = option(
        "none", flag="--speculative",
        tune=Tunable(choices=SPECULATIVE_METHODS, when=("kernels", ("auto",))),
    )
    # K: tokens drafted per step
    num_speculative_tokens: int = option(
        4, flag="--num-speculative-tokens",
        tune=Tunable(low=1, high=MAX_SPECULATIVE_TOKENS, when=("speculative", ("ngram", "mtp"))),
    )
    # mtp: the Gemma 4 assistant checkpoint (folder or hub id); an input of the tuner, not a choice
    draft_model: str | None = option(None, flag="--draft-model")
    # ngram: shortest suffix matched
    prompt_lookup_min: int = option(2, flag="--prompt-lookup-min", tune=Tunable(low=1, high=4, when=("speculative", ("ngram",))))
    # ngram: longest suffix matched (tried first)
    prompt_lookup_max: int = option(4, flag="--prompt-lookup-max", tune=Tunable(low=1, high=8, when=("speculative", ("ngram",))))

    def __post_init__(self) -> None:
        if self.dtype not in DTYPES:
            raise ValueError(f"invalid dtype {self.dtype!r}; use one of: auto, bfloat16, float32")
        if self.max_model_len is not None and (not isinstance(self.max_model_len, int) or self.max_model_len < 2):
            raise ValueError(f"max_model_len must be an integer >= 2 (got {self.max_model_len!r})")
        if self.kernels not in ("auto", "torch"):
            raise ValueError(f"invalid kernels {self.kernels!r}; use auto or torch")
        if self.threads is not None and self.threads < 1:
            raise ValueError(f"threads must be >= 1 (got {self.threads})")
        self.quant_scheme()  # raises on an unknown scheme
        if self.speculative not in SPECULATIVE_METHODS:
            raise ValueError(f"invalid speculative method {self.speculative!r}; use one of: {', '.join(SPECULATIVE_METHODS)}")
        if self.speculative == "mtp" and not self.draft_model:
            raise ValueError(
                "speculative mtp needs a draft model: pass --draft-model (draft_model=) with a Gemma 4 assistant "
                "checkpoint, e.g. google/gemma-4-E4B-it-assistant"
            )
        if self.draft_model and self.speculative != "mtp":
            raise ValueError("a draft model is only used by --speculative mtp; add it or drop --draft-model")
        if self.speculative != "none" and self.kernels == "torch":
            raise ValueError(
                "speculative decoding needs fastgemma's kernels (kernels=auto): with kernels=torch use speculative=none"
            )
        if not 1 <= self.num_speculative_tokens <= MAX_SPECULATIVE_TOKENS:
            raise ValueError(
                f"num_speculative_tokens must be in 1..{MAX_SPECULATIVE_TOKENS} (got {self.num_speculative_tokens})"
            )
        if not 1 <= self.prompt_lookup_min <= self.prompt_lookup_max:
            raise ValueError(
                f"need 1 <= prompt_lookup_min <= prompt_lookup_max (got {self.prompt_lookup_min}, {self.prompt_lookup_max})"
            )
        if self.prefill_chunk < 1:
            raise ValueError(f"prefill_chunk must be >= 1 (got {self.prefill_chunk})")
        if self.device is not None:
            try:
                dev = torch.device(self.device)
            except RuntimeError as e:
                raise ValueError(f"invalid device {self.device!r}: use cpu or cuda[:N]") from e
            if dev.type == "cuda" and not torch.cuda.is_available():
                raise ValueError("device cuda requested but no CUDA device is available; use --device cpu")

    def quant_scheme(self) -> QuantScheme | None:
        return QuantScheme.parse(self.quantization)

    def torch_device(self) -> torch.device:
        if self.device is not None:
            return torch.device(self.device)
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")

    def torch_dtype(self) -> torch.dtype:
        """auto: bf16 on CUDA, on CPUs with native bf16 maths, and where fastgemma's own CPU
        kernels run (they read bf16 weights, half the bytes, and widen them exactly to fp32);
        fp32 where only torch's stock CPU kernels are left (slow in bf16 without hardware)."""
        from fastgemma.kernels import native  # here: native imports this module

        explicit = DTYPES[self.dtype]
        if explicit is not None:
            return explicit
        if self.torch_device().type == "cuda" or cpu_has_fast_bf16():
            return torch.bfloat16
        if self.kernels == "auto" and native.load() is not None:
            return torch.bfloat16
        return torch.float32

    def resolve_max_model_len(self, model_maximum: int) -> int:
        if self.max_model_len is None:
            return min(model_maximum, DEFAULT_MAX_MODEL_LEN_CAP)
        if self.max_model_len > model_maximum:
            raise ValueError(
                f"max_model_len {self.max_model_len} exceeds the model's max_position_embeddings {model_maximum}"
            )
        return self.max_model_len
