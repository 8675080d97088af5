"""The ready-form cache (weights/ready.py) and what loading leaves resident.

A warm load reads the cached state and screen: it neither opens the GGUF nor quantises,
and gives the same model (tensors and tokens). A source that changed is not read from the
cache. Loading a model leaves resident about its tensors' bytes, not copies of them."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
import torch

from fastgemma import LLM, SamplingParams
from fastgemma.kernels import native
from fastgemma.weights.ready import ReadyEntry
from fastgemma.weights.source import ModelSource
from tests import tiny_models

needs_native = pytest.mark.skipif(native.load() is None, reason=f"native kernels unavailable: {native.status()}")
GREEDY = SamplingParams(max_tokens=24, temperature=0.0, ignore_eos=True)


def _state(llm) -> dict[str, torch.Tensor]:
    return {k: v.clone() for k, v in llm.model.state_dict().items()}


@needs_native
def test_a_warm_load_does_not_open_the_gguf_and_gives_the_same_model(monkeypatch):
    first = LLM(max_model_len=256, max_num_seqs=1)  # fills the cache if this run is its first
    want_tokens = first.generate(["The capital of France is"], GREEDY)[0].token_ids
    want_screen = [t.clone() for t in first.model.lm_head_screen.codes()]
    want_state = _state(first)
    del first

    def no_gguf(*args, **kwargs):
        raise AssertionError("the GGUF was opened")

    monkeypatch.setattr("gguf.GGUFReader", no_gguf)
    monkeypatch.setattr("fastgemma.kernels.lm_head_screen._build", no_gguf)
    warm = LLM(max_model_len=256, max_num_seqs=1)
    assert warm.generate(["The capital of France is"], GREEDY)[0].token_ids == want_tokens
    assert all(torch.equal(a, b) for a, b in zip(warm.model.lm_head_screen.codes(), want_screen))
    got = _state(warm)
    assert got.keys() == want_state.keys() and all(torch.equal(got[k], want_state[k]) for k in got)


@needs_native
def test_quantising_on_load_is_cached_and_a_changed_source_is_not_read(tiny_gemma3, tmp_path, monkeypatch):
    monkeypatch.setenv("FASTGEMMA_CACHE", str(tmp_path / "cache"))
    opts = dict(dtype="bfloat16", quantization="int8", max_model_len=128, max_num_seqs=1)
    cold = LLM(str(tiny_gemma3), **opts)
    want = cold.generate([[5, 6, 7]], GREEDY)[0].token_ids
    entries = list((tmp_path / "cache" / "ready").iterdir())
    assert len(entries) == 1 and (entries[0] / "state.safetensors").is_file()
    assert oct((entries[0] / "state.safetensors").stat().st_mode & 0o777) != oct(0o600)  # normal permissions
    calls = []
    monkeypatch.setattr("fastgemma.kernels.quant.quantize", lambda *a: calls.append(a))
    warm = LLM(str(tiny_gemma3), **opts)
    assert calls == [] and warm.generate([[5, 6, 7]], GREEDY)[0].token_ids == want
    # The source changes: the entry no longer matches it and is not read.
    source = ModelSource("folder", tiny_gemma3, "tiny")
    entry = ReadyEntry(source, torch.bfloat16, "int8")
    assert entry.read("state") is not None
    config = tiny_gemma3 / "config.json"
    os.utime(config, ns=(config.stat().st_atime_ns, config.stat().st_mtime_ns + 10**9))
    assert ReadyEntry(source, torch.bfloat16, "int8").read("state") is None


_MEASURE = """
import json, sys
from fastgemma.memory import peak_resident_bytes, resident_bytes
import torch
import transformers.models.gemma3, safetensors.torch  # the libraries loading imports, before measuring
from fastgemma.llm import LLM
from fastgemma.kernels import native
native.load()
before = resident_bytes()
llm = LLM(sys.argv[1], dtype="bfloat16", max_model_len=256, max_num_seqs=2)
after, peak = resident_bytes(), peak_resident_bytes()
m = llm.model
weights = sum(t.numel() * t.element_size() for t in [*m.parameters(), *m.buffers()])
screen = m.lm_head_screen.nbytes() if m.lm_head_screen is not None else 0
rope = sum(t.numel() * t.element_size() for d in (m.rope_cos, m.rope_sin) for t in d.values())
print(json.dumps(dict(growth=after - before, after=after, peak=peak, weights=weights, screen=screen,
                      kv=llm.runner.pool.num_bytes, rope=rope)))
"""


@needs_native
def test_loading_leaves_about_the_tensors_bytes_resident(tmp_path):
    """A Gemma 3 of 230 MiB in bf16 (65536 x 1024 embeddings, 6 layers; stored in fp32), loaded
    in a fresh process: what loading leaves resident is at most its tensors + 0.5 GiB, and
    the peak while loading at most 1.5x the process's final figure (before
    this, the screen's construction alone left 2.7 GB behind on the embedded model)."""
    config = tiny_models.gemma3_config(vocab_size=65536)
    config.hidden_size, config.intermediate_size, config.num_hidden_layers = 1024, 2048, 6
    config.layer_types = ["sliding_attention"] * 5 + ["full_attention"]
    config.num_attention_heads, config.num_key_value_heads, config.head_dim = 4, 1, 256
    folder = tiny_models.save_tiny(config, tmp_path / "mid", seed=7)
    env = {**os.environ, "FASTGEMMA_CACHE": str(tmp_path / "cache")}
    out = subprocess.run([sys.executable, "-c", _MEASURE, str(folder)], capture_output=True, text=True, env=env,
                         timeout=600)
    assert out.returncode == 0, out.stderr[-2000:]
    r = json.loads(out.stdout.strip().splitlines()[-1])
    held = r["weights"] + r["screen"] + r["kv"] + r["rope"]
    assert r["weights"] > 120 * 2**20, r  # large enough for the bound to mean something
    assert r["growth"] <= held + 2**29, r
    # measured 1.33x-1.42x here, the higher in a full run (the embedded model: 1.07x); the
    # temporaries this guards against were GBs (2.7 GB left behind on the embedded model)
    assert r["peak"] <= 1.5 * r["after"], r


def test_tables_a_folder_stores_as_they_run_are_mapped_from_it_not_cached(tiny_e4b, tmp_path, monkeypatch):
    """Quantising an fp32 Gemma 4 on load, in fp32: the cached state holds the codes but not
    the embedding or PLE tables (the folder has them as they run); a warm load maps them from
    the folder and gives the same tokens."""
    from fastgemma.weights.ready import read_safetensors

    monkeypatch.setenv("FASTGEMMA_CACHE", str(tmp_path / "cache"))
    opts = dict(device="cpu", dtype="float32", quantization="int8", max_model_len=64, max_num_seqs=1)
    want = LLM(str(tiny_e4b), **opts).generate([[5, 6, 7]], GREEDY)[0].token_ids
    (entry,) = (tmp_path / "cache" / "ready").iterdir()
    cached = read_safetensors(entry / "state.safetensors")
    assert any(k.endswith(".qweight") for k in cached)
    assert "embed_tokens.weight" not in cached and "embed_tokens_per_layer.weight" not in cached
    warm = LLM(str(tiny_e4b), **opts)
    assert warm.generate([[5, 6, 7]], GREEDY)[0].token_ids == want
