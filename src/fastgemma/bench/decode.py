"""`fastgemma bench decode`: batch-1 prefill and decode speed, engines side by side.

Protocol (llama-bench style): every engine gets the same chat-formatted prompts (the first
human turn of each sharegpt item) and generates exactly `output_len` greedy tokens with
end-of-sequence ignored. `warmup` untimed runs per engine first; then `repetitions` passes
over the prompts, the engines alternating prompt by prompt (their order rotating each pass)
so that machine noise falls on all of them alike. Reported per engine: the median over runs
of prefill tok/s (prompt tokens / time to first token), decode tok/s ((output_len - 1) /
time from first to last token), TTFT and ms per token, each with its spread (stdev).
For fastgemma also: the bytes a decode step reads (its cost model at the mean context),
the GB/s that implies, and its fraction of the read bandwidth measured in the same run.
Schemes: `quantization` lists the weight schemes to run (kernels/quant.py) and `speculative`
the drafting methods (engine/speculative.py); each pair is its own fastgemma engine
("fastgemma", "fastgemma int8", "fastgemma ngram", ...) in the same alternation. A
speculative engine also reports its acceptance over the timed runs (mean acceptance length,
per-position acceptance).
Memory: each engine (llama.cpp's and transformers' too) is loaded and warmed up in turn;
the resident memory that added and its peak during it are reported ("+MiB (peak)"; the
process's peak is reset before each, Linux `clear_refs`), with the GPU's peak allocation on
CUDA, and the process's overall peak; and the seconds each took to load.
Greedy identity: each fastgemma engine's outputs are compared, prompt by prompt, with its
configuration's plain path (`EngineConfig.plain()`, loaded as a second engine after the
timed runs: one op at a time, full lm_head, no drafting); they must agree. `ppl_records` > 0 also scores that many challenge PPL records per
scheme and reports the PPL and its change against the unquantised model.
"""

from __future__ import annotations

import json
import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from fastgemma.bench.bandwidth import read_bandwidth_gb_s
from fastgemma.bench.cost_model import bytes_per_token
from fastgemma.bench.engines import FastgemmaEngine, LlamaCppEngine, Timing, TransformersEngine
from fastgemma.bench.ppl import load_ppl_records, perplexity
from fastgemma.config import EngineConfig
from fastgemma.data import PPL_FILE, PROMPTS_FILE, challenge_file
from fastgemma.kernels.cpu import set_cpu_threads
from fastgemma.memory import MemoryMeter, peak_resident_bytes

COMPARE_ENGINES = ("transformers", "llama.cpp")


@dataclass(frozen=True)
class DecodeBenchConfig:
    engines: tuple[EngineConfig, ...] = (EngineConfig(),)  # each a fastgemma engine in the alternation
    prompts: Path | None = None  # sharegpt JSON; None = the packaged challenge prompts
    num_prompts: int = 4
    output_len: int = 256
    compare: tuple[str, ...] = ()
    repetitions: int = 1
    warmup: int = 1
    check_identity: bool = True
    ppl_records: int = 0
    ppl_data: Path | None = None  # JSONL; None = the packaged challenge PPL records

    def __post_init__(self) -> None:
        if not self.engines or len(set(self.engines)) != len(self.engines):
            raise ValueError("--quantization and --speculative need one or more distinct values each")
        if len({(e.model, e.dtype, e.device) for e in self.engines}) != 1:
            raise ValueError("the engines of one bench share the model, dtype and device")
        if self.ppl_records < 0:
            raise ValueError(f"--ppl-records must be >= 0 (got {self.ppl_records})")
        unknown = [c for c in self.compare if c not in COMPARE_ENGINES]
        if unknown:
            raise ValueError(f"unknown --compare engine {unknown[0]!r}; choose from {', '.join(COMPARE_ENGINES)}")
        for name, value, least in (("num-prompts", self.num_prompts, 1), ("output-len", self.output_len, 2),
                                   ("repetitions", self.repetitions, 1), ("warmup", self.warmup, 0)):
            if value < least:
                raise ValueError(f"--{name} must be >= {least} (got {value})")

    @staticmethod
    def engine_grid(options: dict[str, Any], quantization: tuple[str, ...] = ("none",),
                    speculative: tuple[str, ...] = ("none",)) -> tuple[EngineConfig, ...]:
        """One engine per (scheme, method), the other options shared; `draft_model` goes to mtp."""
        for name, values in (("quantization", quantization), ("speculative", speculative)):
            if not values or len(set(values)) != len(values):
                raise ValueError(f"--{name} needs one or more distinct values (got {','.join(values)!r})")
        draft = options.get("draft_model")
        if ("mtp" in speculative) != (draft is not None):
            raise ValueError("--speculative mtp and --draft-model go together: give both or neither")
        return tuple(
            EngineConfig(**{**options, "quantization": q, "speculative": m, "draft_model": draft if m == "mtp" else None})
            for q in quantization for m in speculative
        )


def load_sharegpt_prompts(path: Path, n: int) -> list[str]:
    """The first `n` items' first human turns, in file order; errors name the file and the item."""
    try:
        items = json.loads(path.read_text())
    except (OSError, ValueError) as e:
        raise ValueError(f"cannot read sharegpt prompts from {path}: {e}") from e
    if not isinstance(items, list):
        raise ValueError(f"cannot read sharegpt prompts from {path}: it must hold a JSON list of sharegpt items")
    prompts = []
    for i, item in enumerate(items[:n]):
        try:
            prompts.append(next(t["value"] for t in item["conversations"] if t["from"] == "human"))
        except (KeyError, TypeError, StopIteration):
            raise ValueError(f"cannot read sharegpt prompts from {path}: item {i} needs a \"conversations\" list "
                             f"with a {{\"from\": \"human\", \"value\": ...}} turn") from None
    if not prompts:
        raise ValueError(f"{path} holds no prompts")
    return prompts


@dataclass
class EngineRuns:
    runs: list[tuple[int, Timing]] = field(default_factory=list)  # (prompt length, timing)

    def stats(self, output_len: int) -> dict[str, float]:
        def med_sd(values: list[float]) -> tuple[float, float]:
            return statistics.median(values), (statistics.stdev(values) if len(values) > 1 else 0.0)

        prefill = [n / t.ttft_s for n, t in self.runs]
        decode = [(output_len - 1) / t.decode_s for _, t in self.runs]
        ttft = [1000 * t.ttft_s for _, t in self.runs]
        mspt = [1000 * t.decode_s / (output_len - 1) for _, t in self.runs]
        out = {}
        for key, values in (("prefill_tok_s", prefill), ("decode_tok_s", decode), ("ttft_ms", ttft), ("ms_per_token", mspt)):
            out[key], out[key + "_sd"] = med_sd(values)
        return out


def run_decode_bench(cfg: DecodeBenchConfig, log=print) -> dict[str, Any]:
    from fastgemma import LLM, SamplingParams

    texts = load_sharegpt_prompts(cfg.prompts or challenge_file(PROMPTS_FILE), cfg.num_prompts)
    records = load_ppl_records(cfg.ppl_data or challenge_file(PPL_FILE), cfg.ppl_records) if cfg.ppl_records else []
    if cfg.engines[0].torch_device().type == "cpu":
        set_cpu_threads(cfg.engines[0].cpu_threads())  # once, before any engine loads
    device = cfg.engines[0].torch_device()
    memory: dict[str, dict[str, float]] = {}  # engine -> the memory its load and warm-up added
    engines: list[Any] = []
    prompts: list[list[int]] = []

    def add(make: Callable[[], Any]) -> Any:
        meter = MemoryMeter(device)
        t0 = time.perf_counter()
        engine = make()
        load_s = time.perf_counter() - t0
        if not prompts:  # the first engine is ours: its tokenizer builds the prompts
            prompts.extend(engine.llm.chat_prompt_ids([{"role": "user", "content": t}]) for t in texts)
        for _ in range(cfg.warmup):
            engine.run(prompts[0][:64], 8)
        memory[engine.name] = {**meter.read(), "load_s": load_s}
        engines.append(engine)
        return engine

    for config in cfg.engines:
        add(lambda c=config: FastgemmaEngine(LLM.from_config(c)))
    llm = engines[0].llm
    max_len = max(map(len, prompts)) + cfg.output_len + 1
    dtype = llm.model.dtype
    ours = {e.name: e.llm for e in engines}
    notes: list[str] = []
    for name in cfg.compare:
        try:
            if name == "transformers":
                add(lambda: TransformersEngine(llm.source, dtype, llm.runner.device))
            elif llm.source.kind != "gguf":
                notes.append("llama.cpp skipped: it needs a GGUF model")
            else:
                add(lambda: LlamaCppEngine(llm.source.path, max_len, cfg.engines[0].cpu_threads()))
        except ImportError as e:
            notes.append(f"{name} skipped: {e.name or e} not installed (pip install 'fastgemma[compare]')")
    for note in notes:
        log(note)
    bandwidth = read_bandwidth_gb_s(device=str(llm.runner.device))
    spec_before = {name: m.engine.spec_stats.snapshot() for name, m in ours.items()}
    results = {e.name: EngineRuns() for e in engines}
    outputs: dict[str, dict[int, list[int]]] = {name: {} for name in ours}
    for rep in range(cfg.repetitions):
        for i, ids in enumerate(prompts):
            order = engines[rep % len(engines) :] + engines[: rep % len(engines)]
            for engine in order:
                timing = engine.run(ids, cfg.output_len)
                results[engine.name].runs.append((len(ids), timing))
                if engine.name in ours:
                    outputs[engine.name][i] = timing.token_ids
            log(f"pass {rep + 1}/{cfg.repetitions}, prompt {i + 1}/{len(prompts)} ({len(ids)} tokens) done")

    stats = {name: runs.stats(cfg.output_len) for name, runs in results.items()}
    for name, m in memory.items():
        stats[name].update(m)
    mean_context = statistics.mean(len(p) for p in prompts) + cfg.output_len / 2
    for name, m in ours.items():
        s = stats[name]
        s["quantization"] = m.quantization
        s["lm_head_screen"] = m.model.lm_head_screen is not None
        s["speculative"] = m.config.speculative
        if m.config.speculative != "none":
            s["num_speculative_tokens"] = m.config.num_speculative_tokens
            s["acceptance"] = m.engine.spec_stats.since(spec_before[name]).as_dict()
        s["bytes_per_token"] = bytes_per_token(m.model, int(mean_context))  # of one decode step
        if m.config.speculative == "none":  # with drafting a step emits several tokens: no per-token GB/s
            s["achieved_gb_s"] = s["bytes_per_token"] / (s["ms_per_token"] / 1000) / 1e9
            s["bandwidth_fraction"] = s["achieved_gb_s"] / bandwidth
    step_bytes = stats[engines[0].name]["bytes_per_token"]

    identity: dict[str, Any] = {"checked": False}
    if cfg.check_identity:
        params = SamplingParams(max_tokens=cfg.output_len, temperature=0.0, ignore_eos=True)
        identity = {"checked": True}
        references: dict[EngineConfig, list[list[int]]] = {}  # engines with the same plain path share it
        for name, m in ours.items():
            plain_config = m.config.plain()
            if plain_config not in references:
                plain = LLM.from_config(plain_config)  # a second engine: the timed one is not touched
                references[plain_config] = [plain.generate([ids], params)[0].token_ids for ids in prompts]
                del plain
            first_diff = [
                next((j for j, (a, b) in enumerate(zip(outputs[name][i], ref)) if a != b), None)
                for i, ref in enumerate(references[plain_config])
            ]
            identity[name] = {
                "identical_prompts": sum(d is None for d in first_diff), "prompts": len(prompts), "first_divergence": first_diff
            }
    if records:
        reference = ours.get("fastgemma") or LLM.from_config(cfg.engines[0].plain().unquantized())
        ref_ppl, n_tokens = perplexity(reference, records)
        for name, m in ours.items():
            ppl = ref_ppl if m is reference else perplexity(m, records)[0]
            stats[name].update(ppl=ppl, ppl_delta_pct=100 * (ppl / ref_ppl - 1), ppl_tokens=n_tokens)
    return {
        "engines": stats,
        "read_bandwidth_gb_s": bandwidth,
        "bytes_per_token": step_bytes,
        "model": llm.model_name,
        "dtype": str(dtype).removeprefix("torch."),
        "kernels": "native" if llm.model.kernels.native else "torch",
        "threads": cfg.engines[0].cpu_threads(),
        "num_prompts": len(prompts),
        "output_len": cfg.output_len,
        "repetitions": cfg.repetitions,
        "greedy_identity_vs_plain_path": identity,
        "peak_resident_mib": (peak_resident_bytes() or 0) / 2**20,
        "notes": notes,
    }


def _memory_cell(s: dict[str, Any]) -> str:
    """Resident memory the engine's load and warm-up added, with the peak during them
    (and the GPU's peak allocation on CUDA)."""
    if "resident_mib" not in s:
        return ""
    cell = f"{s['resident_mib']:.0f} ({s['peak_mib']:.0f})"
    return cell + (f", GPU {s['gpu_peak_mib']:.0f}" if "gpu_peak_mib" in s else "")


def render_table(result: dict[str, Any]) -> None:
    from rich.console import Console
    from rich.table import Table

    table = Table(title=f"decode bench: {result['model']} {result['dtype']}, batch 1, {result['output_len']} tokens")
    with_ppl = any("ppl" in s for s in result["engines"].values())
    cols = ["engine", "prefill tok/s", "decode tok/s", "TTFT ms", "ms/token", "MB/token", "GB/s", "of bandwidth",
            "+MiB (peak)"]
    for col in cols + (["PPL", "ΔPPL"] if with_ppl else []):
        table.add_column(col, justify="right")
    for name, s in result["engines"].items():
        gb = f"{s['achieved_gb_s']:.1f}" if "achieved_gb_s" in s else ""
        frac = f"{100 * s['bandwidth_fraction']:.0f}%" if "bandwidth_fraction" in s else ""
        mb = f"{s['bytes_per_token'] / 1e6:.0f}" if "bytes_per_token" in s else ""
        ppl = [f"{s['ppl']:.4f}", f"{s['ppl_delta_pct']:+.2f}%"] if "ppl" in s else ([""] * 2 if with_ppl else [])
        table.add_row(
            name,
            f"{s['prefill_tok_s']:.1f} ± {s['prefill_tok_s_sd']:.1f}",
            f"{s['decode_tok_s']:.1f} ± {s['decode_tok_s_sd']:.1f}",
            f"{s['ttft_ms']:.0f}",
            f"{s['ms_per_token']:.1f}",
            mb,
            gb,
            frac,
            _memory_cell(s),
            *ppl,
        )
    console = Console(stderr=False)
    console.print(table)
    console.print(
        f"read bandwidth {result['read_bandwidth_gb_s']:.1f} GB/s; fastgemma step reads "
        f"{result['bytes_per_token'] / 1e6:.0f} MB ({result['kernels']} kernels, {result['threads']} threads)"
    )
    for name, s in result["engines"].items():
        if "acceptance" in s:
            a = s["acceptance"]
            per_pos = " ".join(f"{x:.2f}" for x in a["acceptance_per_position"])
            console.print(
                f"{name}: k={s['num_speculative_tokens']}, mean acceptance length {a['mean_acceptance_length']:.2f} "
                f"over {a['num_drafts']} drafts, acceptance rate {a['acceptance_rate']:.2f}, per position [{per_pos}]"
            )
    ident = result["greedy_identity_vs_plain_path"]
    for name, entry in ident.items():
        if name == "checked":
            continue
        same, n = entry["identical_prompts"], entry["prompts"]
        console.print(
            f"{name}: greedy tokens vs its plain path: {same}/{n} prompts identical"
            + ("" if same == n else f" (first divergence {entry['first_divergence']})")
        )
