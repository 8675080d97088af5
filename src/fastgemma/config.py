"""Engine configuration: what to load and how to run it, validated once.

Every engine option is declared once, here, as a field of `EngineConfig` made by `option(...)`:
its type (the annotation), default, help text, command-line flag, accepted values (`choices`,
or an integer range `low..high`), the devices where it has an effect, whether it changes the
model's numbers (`numerics`), the value the plain path uses (`plain`) and how `fastgemma tune`
searches it (`tune`). Everything else is derived from these declarations and lists no option
itself: the `serve`, `generate`, `bench decode`, `verify` and `tune` command lines
(cli/options.py), `LLM(**options)`, presets (preset.py), the tuner's search space
(tune/space.py), the server command lines the verifier and the tuner start (`serve_args`),
and the reference the verifier and the bench compare against (`plain`).

`EngineConfig(...)` validates every field against its declaration, then the rules that tie
options together, and raises `ValueError` naming the one bad value and what to give instead.
`torch_dtype()` and `torch_device()` turn "auto" choices into concrete ones for this machine,
`kernel_choice()` the kernels the model is built with. Nothing mutates a config: `plain()`,
`unquantized()` and `dataclasses.replace` make new ones.
"""

from __future__ import annotations

import dataclasses
import functools
import typing
from collections.abc import Callable
from dataclasses import dataclass, field, fields
from typing import TYPE_CHECKING, Any

from fastgemma.kernels import KernelChoice, native
from fastgemma.kernels.cpu import cpu_has_fast_bf16, physical_cores
from fastgemma.kernels.schemes import SCHEMES, QuantScheme

if TYPE_CHECKING:
    import torch

DTYPES = {"auto": None, "bfloat16": "bfloat16", "bf16": "bfloat16", "float32": "float32", "fp32": "float32"}  # -> torch's
DEFAULT_MAX_MODEL_LEN_CAP = 32768  # without --max-model-len: min(model maximum, this)
SPECULATIVE_METHODS = ("none", "ngram", "mtp")
MAX_SPECULATIVE_TOKENS = 15  # a verification's K + 1 rows stay within the row-invariant GEMVs' 16
ALL_DEVICES = ("cpu", "cuda")
KEEP = object()  # `plain=KEEP`: the plain path runs with the served value


@dataclass(frozen=True)
class Tunable:
    """How `fastgemma tune` searches one option: `choices` (categorical), or integers in
    `low..high` (`high` may be a function of the machine, e.g. its physical cores)."""

    choices: tuple[Any, ...] = ()
    low: int | None = None
    high: int | Callable[[], int] | None = None
    devices: tuple[str, ...] = ALL_DEVICES  # device types where searching it makes sense
    when: tuple[str, tuple[Any, ...]] | None = None  # searched only while option `when[0]` is one of `when[1]`

    def upper(self) -> int:
        return self.high() if callable(self.high) else int(self.high)


@dataclass(frozen=True)
class OptionSpec:
    """The declaration of one engine option (the metadata of its `EngineConfig` field)."""

    help: str  # one sentence or two; the command lines show it with the default
    flag: str | None = None  # long flag ("--dtype"); None: not a command-line option
    short: str | None = None  # short flag ("-q")
    choices: tuple[Any, ...] = ()  # the accepted values (strings); empty: any of the type
    low: int | None = None  # integers: the smallest accepted value
    high: int | None = None  # integers: the largest accepted value
    devices: tuple[str, ...] = ALL_DEVICES  # device types where the option has an effect
    numerics: bool = False  # changes the model's numbers: the plain path keeps the served value
    plain: Any = KEEP  # the plain path's value (KEEP: the served one; numerics options keep theirs)
    tune: Tunable | None = None  # how `fastgemma tune` searches it; None: not searched


def option(default: Any, help: str, **spec: Any) -> Any:
    """A config field declared by an `OptionSpec` (see the module docstring)."""
    return field(default=default, metadata={"option": OptionSpec(help=help, **spec)})


def spec_of(f: dataclasses.Field) -> OptionSpec:
    return f.metadata["option"]


@dataclass(frozen=True)
class EngineConfig:
    model: str | None = option(
        None, "Model folder, .gguf file or hub id (default: the embedded Gemma 3 270M).", numerics=True
    )
    dtype: str = option(
        "auto", "auto | bfloat16 | float32. auto: bf16 on CUDA and where fastgemma's CPU kernels run, else fp32.",
        flag="--dtype", choices=tuple(DTYPES), numerics=True, tune=Tunable(choices=("bfloat16", "float32")),
    )
    max_model_len: int | None = option(
        None, "Prompt + output tokens (default: min(model maximum, 32768)).",
        flag="--max-model-len", low=2, numerics=True,
    )
    device: str | None = option(None, "cpu | cuda | cuda:N (default: cuda when available).", numerics=True)
    # Numerics: a bf16 prefill's matmuls round by the chunk's shape, so a prompt longer than
    # the chunk can decode differently (`fastgemma tune` found one: 128 vs 512, a 332-token
    # prompt, token 140); hence not tuned, and the plain path uses the served value.
    prefill_chunk: int = option(
        512, "Prompt tokens per prefill forward (bounds activation memory; not tuned: it changes bf16 rounding).",
        flag="--prefill-chunk", low=1, numerics=True,
    )
    # Continuous batching (engine/scheduler.py): a cache slot per running sequence, allocated at
    # start (models/kv_cache.py); the plain path runs one sequence at a time.
    max_num_seqs: int = option(
        8, "Sequences decoded together (each holds a KV-cache slot, allocated at start); more requests wait.",
        flag="--max-num-seqs", low=1, high=1024, plain=1,
    )
    max_num_batched_tokens: int | None = option(
        None, "Tokens one engine step computes: decode rows plus prompt tokens, a chunk that does not fit running "
        "a few layers a step (default: on CPU paced to the decode rows, so that streams stay smooth and prompts keep "
        "up; elsewhere max-num-seqs + prefill-chunk).",
        flag="--max-num-batched-tokens", low=1, plain=None,
    )
    # engine/prefix_cache.py: a kept chunk is the bits computing it gives, so on by default
    enable_prefix_caching: bool = option(
        True, "Keep computed prompt chunks (whole --prefill-chunk blocks) for later prompts that begin with the same "
        "tokens, which then skip them (same numbers as computing them).",
        flag="--enable-prefix-caching", plain=False,
    )
    cache_ram: int = option(
        512, "MiB of memory (on the model's device) for kept prompt chunks, least recently used out first "
        "(llama.cpp's --cache-ram); 0 keeps none.",
        flag="--cache-ram", low=0,
    )
    kernels: str = option(
        "auto", "auto: fastgemma's CPU kernels where the CPU has AVX2 + FMA, and CUDA's fixed-shape decode step | "
        "torch: stock per-op paths only.",
        flag="--kernels", choices=("auto", "torch"), numerics=True, tune=Tunable(choices=("auto", "torch"), devices=("cpu",)),
    )
    enforce_eager: bool = option(
        False, "CUDA: run the fixed-shape decode step eagerly instead of replaying its CUDA graph (same numbers).",
        flag="--enforce-eager", devices=("cuda",), plain=True,
    )
    fused_decode: bool = option(
        True, "CPU, bf16: a decode step's layers in one native call (same tokens as one op at a time).",
        flag="--fused-decode", devices=("cpu",), plain=False,
    )
    threads: int | None = option(
        None, "CPU threads (default: the physical cores); set once, when the process starts.",
        flag="--threads", low=1, devices=("cpu",), plain=None, tune=Tunable(low=1, high=physical_cores, devices=("cpu",)),
    )
    # kernels/quant.py; decode through cpu_quant_gemv.c on CPU, the Triton kernel of
    # kernels/cuda_quant.py on CUDA; gguf: kernels/gguf.py, cpu_gguf_gemv.c
    quantization: str = option(
        "none", "Body linear weights at load: none | int8 | int4-g32 | int4-g128 | gguf (a GGUF's own "
        "blocks, CPU).",
        flag="--quantization", short="-q", choices=SCHEMES, numerics=True, tune=Tunable(choices=SCHEMES),
    )
    lm_head_screen: bool = option(
        True, "CPU: greedy tokens through the exact int8 lm_head screen (same tokens as the full lm_head).",
        flag="--lm-head-screen", devices=("cpu",), plain=False,
        tune=Tunable(choices=(True, False), devices=("cpu",), when=("kernels", ("auto",))),
    )
    # engine/ngram.py, engine/mtp.py: drafts verified K at a time; exact with the native CPU
    # kernels or CUDA's fixed-shape step (llm.py says why)
    speculative: str = option(
        "none", "Speculative decoding: none | ngram (prompt lookup) | mtp (Gemma 4 assistant, --draft-model); "
        "greedy output unchanged.",
        flag="--speculative", choices=SPECULATIVE_METHODS, plain="none",
        tune=Tunable(choices=SPECULATIVE_METHODS, when=("kernels", ("auto",))),
    )
    num_speculative_tokens: int = option(
        4, f"Tokens drafted per step (1-{MAX_SPECULATIVE_TOKENS}).",
        flag="--num-speculative-tokens", short="-k", low=1, high=MAX_SPECULATIVE_TOKENS, plain=4,
        tune=Tunable(low=1, high=MAX_SPECULATIVE_TOKENS, when=("speculative", ("ngram", "mtp"))),
    )
    # An input of the tuner, not a choice: with one, mtp joins the search space.
    draft_model: str | None = option(
        None, "mtp: the Gemma 4 assistant checkpoint (folder or hub id).", flag="--draft-model", plain=None,
    )
    prompt_lookup_min: int = option(
        2, "ngram: shortest suffix matched.", flag="--prompt-lookup-min", low=1, plain=2,
        tune=Tunable(low=1, high=4, when=("speculative", ("ngram",))),
    )
    prompt_lookup_max: int = option(
        4, "ngram: longest suffix matched (tried first).", flag="--prompt-lookup-max", low=1, plain=4,
        tune=Tunable(low=1, high=8, when=("speculative", ("ngram",))),
    )

    def __post_init__(self) -> None:
        for f in fields(self):
            check_value(f, getattr(self, f.name))
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
        if self.prompt_lookup_min > self.prompt_lookup_max:
            raise ValueError(
                f"need prompt_lookup_min <= prompt_lookup_max (got {self.prompt_lookup_min} > {self.prompt_lookup_max})"
            )
        if self.device is not None:
            import torch

            try:
                dev = torch.device(self.device)
            except RuntimeError as e:
                raise ValueError(f"invalid device {self.device!r}: use cpu or cuda[:N]") from e
            if dev.type == "cuda" and not torch.cuda.is_available():
                raise ValueError("device cuda requested but no CUDA device is available; use --device cpu")

    # ---- derived configurations ----------------------------------------------------------

    def plain(self) -> EngineConfig:
        """The reference numerics of this configuration: the same model, dtype, device,
        kernels, quantisation and prefill chunk; no drafter, no CUDA graph, no fused decode
        step, the full lm_head; every option that only changes speed at its plain value."""
        return dataclasses.replace(self, **{
            f.name: spec_of(f).plain for f in fields(self) if not spec_of(f).numerics and spec_of(f).plain is not KEEP
        })

    def unquantized(self) -> EngineConfig:
        """This configuration's model before `quantization`."""
        return dataclasses.replace(self, quantization="none")

    def changed(self) -> dict[str, Any]:
        """The options that differ from their defaults, model excluded (a preset's content)."""
        return {f.name: getattr(self, f.name) for f in fields(self)
                if f.name != "model" and getattr(self, f.name) != f.default}

    def serve_args(self) -> list[str]:
        """Arguments after `fastgemma serve` that start a server with this configuration (host
        and port are the caller's): the model, then every changed option by its flag."""
        args = [self.model] if self.model else []
        for name, value in self.changed().items():
            flag = spec_of(FIELDS[name]).flag
            if flag is None:
                raise ValueError(f"{name} has no fastgemma serve flag; it cannot be served")
            if isinstance(value, bool):
                args.append(flag if value else "--no-" + flag.removeprefix("--"))
            else:
                args += [flag, str(value)]
        return args

    # ---- resolved for this machine -------------------------------------------------------

    def quant_scheme(self) -> QuantScheme | None:
        return QuantScheme.parse(self.quantization)

    def torch_device(self) -> torch.device:
        import torch

        if self.device is not None:
            return torch.device(self.device)
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")

    def torch_dtype(self) -> torch.dtype:
        """auto: bf16 on CUDA, on CPUs with native bf16 maths, and where fastgemma's own CPU
        kernels run (they read bf16 weights, half the bytes, and widen them exactly to fp32);
        fp32 where only torch's stock CPU kernels are left (slow in bf16 without hardware)."""
        import torch

        explicit = DTYPES[self.dtype]
        if explicit is not None:
            return getattr(torch, explicit)
        if self.torch_device().type == "cuda" or cpu_has_fast_bf16():
            return torch.bfloat16
        if self.kernels == "auto" and native.load() is not None:
            return torch.bfloat16
        return torch.float32

    def kernel_choice(self) -> KernelChoice:
        """The kernels the model is built with: fastgemma's CPU kernels with kernels=auto on
        a CPU where they build (the model then decides where the fast paths apply)."""
        use_native = self.torch_device().type == "cpu" and self.kernels == "auto" and native.load() is not None
        return KernelChoice(native=use_native, fused_decode=use_native and self.fused_decode,
                            lm_head_screen=use_native and self.lm_head_screen)

    def cpu_threads(self) -> int:
        return self.threads or physical_cores()

    def resolve_max_model_len(self, model_maximum: int) -> int:
        if self.max_model_len is None:
            return min(model_maximum, DEFAULT_MAX_MODEL_LEN_CAP)
        if self.max_model_len > model_maximum:
            raise ValueError(
                f"max_model_len {self.max_model_len} exceeds the model's max_position_embeddings {model_maximum}"
            )
        return self.max_model_len


FIELDS = {f.name: f for f in fields(EngineConfig)}


def option_types() -> dict[str, Any]:
    """Field name -> its annotation, resolved (`int | None`, `bool`, ...)."""
    return _type_hints(EngineConfig)


@functools.cache
def _type_hints(cls: type) -> dict[str, Any]:
    return typing.get_type_hints(cls)


def base_type(name: str) -> type:
    """The option's value type without None: bool, int or str."""
    hint = option_types()[name]
    args = [a for a in typing.get_args(hint) if a is not type(None)]
    return args[0] if args else hint


def optional(name: str) -> bool:
    return type(None) in typing.get_args(option_types()[name])


def describe(name: str) -> str:
    """How an error names an option: its flag and its keyword (`--quantization (quantization=)`)."""
    flag = spec_of(FIELDS[name]).flag
    return f"{flag} ({name}=)" if flag else f"{name}="


def check_value(f: dataclasses.Field, value: Any) -> None:
    """ValueError naming the option and the one bad value, unless `value` fits its declaration."""
    spec, name = spec_of(f), f.name
    if value is None and optional(name):
        return
    kind = base_type(name)
    if kind is int and (isinstance(value, bool) or not isinstance(value, int)):
        raise ValueError(f"{describe(name)} must be an integer (got {value!r})")
    if kind is bool and not isinstance(value, bool):
        raise ValueError(f"{describe(name)} must be true or false (got {value!r})")
    if kind is str and not isinstance(value, str):
        raise ValueError(f"{describe(name)} must be a string (got {value!r})")
    if spec.choices and value not in spec.choices:
        raise ValueError(f"unknown {name} {value!r} for {describe(name)}; use one of: {', '.join(map(str, spec.choices))}")
    if spec.low is not None and spec.high is not None and not spec.low <= value <= spec.high:
        raise ValueError(f"{describe(name)} must be in {spec.low}..{spec.high} (got {value})")
    if spec.low is not None and value < spec.low:
        raise ValueError(f"{describe(name)} must be >= {spec.low} (got {value})")
