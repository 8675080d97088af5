"""Engine configuration: what to load and how to run it, validated once.

`EngineConfig` is built from user input (CLI flags, `LLM(...)` arguments); `resolve()` turns
"auto" choices into concrete ones for this machine. Invalid values raise `ValueError`
naming the accepted ones. Nothing mutates a config after construction.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

import torch

from fastgemma.kernels.quant import QuantScheme

DTYPES = {"auto": None, "bfloat16": torch.bfloat16, "bf16": torch.bfloat16, "float32": torch.float32, "fp32": torch.float32}
DEFAULT_MAX_MODEL_LEN_CAP = 32768  # without --max-model-len: min(model maximum, this)
SPECULATIVE_METHODS = ("none", "ngram", "mtp")
MAX_SPECULATIVE_TOKENS = 15  # a verification's K + 1 rows stay within the row-invariant GEMVs' 16


def physical_cores() -> int:
    """Distinct (physical id, core id) pairs in /proc/cpuinfo; os.cpu_count() elsewhere."""
    cores, phys = set(), "0"
    try:
        for line in open("/proc/cpuinfo"):
            key, _, value = line.partition(":")
            if key.strip() == "physical id":
                phys = value.strip()
            elif key.strip() == "core id":
                cores.add((phys, value.strip()))
    except OSError:
        pass
    return len(cores) or os.cpu_count() or 1


def cpu_flags() -> set[str]:
    """The CPU feature flags /proc/cpuinfo lists (empty where there is none)."""
    try:
        for line in open("/proc/cpuinfo"):
            if line.startswith("flags"):
                return set(line.split(":", 1)[1].split())
    except OSError:
        pass
    return set()


def cpu_has_fast_bf16() -> bool:
    """AVX-512 BF16 or AMX: the CPU multiplies bf16 natively."""
    return bool({"avx512_bf16", "amx_bf16"} & cpu_flags())


@dataclass(frozen=True)
class EngineConfig:
    model: str | None = None  # folder, .gguf file or hub id; None = the embedded default model
    dtype: str = "auto"  # auto | bfloat16 | float32
    max_model_len: int | None = None  # prompt + output tokens; None = min(model maximum, 32768)
    device: str | None = None  # "cpu", "cuda", "cuda:1"; None = cuda when available
    prefill_chunk: int = 512  # prompt tokens per prefill forward (bounds activation memory)
    kernels: str = "auto"  # auto: fastgemma's CPU kernels where the CPU has AVX2 + FMA; torch: stock only
    threads: int | None = None  # CPU threads; None = the physical cores
    quantization: str = "none"  # body linears: none | int8 | int4-g32 | int4-g128 (kernels/quant.py)
    lm_head_screen: bool = True  # greedy tokens through the exact int8 lm_head screen where supported
    speculative: str = "none"  # none | ngram (engine/ngram.py) | mtp (engine/mtp.py): drafts verified K at a time
    num_speculative_tokens: int = 4  # K: tokens drafted per step
    draft_model: str | None = None  # mtp: the Gemma 4 assistant checkpoint (folder or hub id)
    prompt_lookup_min: int = 2  # ngram: shortest suffix matched
    prompt_lookup_max: int = 4  # ngram: longest suffix matched (tried first)

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
