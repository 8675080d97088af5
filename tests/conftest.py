"""Shared fixtures: tiny random checkpoints, the embedded model, the challenge data."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
import torch

from tests import tiny_models

# Without a GPU the CUDA kernels (kernels/cuda_*.py, Triton) are tested in Triton's
# interpreter on CPU tensors; it must be chosen before they are first imported.
if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")

from fastgemma.data import challenge_file  # the packaged challenge data (what users have)


@pytest.fixture(scope="session")
def eval_prompts() -> list[str]:
    items = json.loads(challenge_file("eval_prompts_sharegpt.json").read_text())
    return [next(t["value"] for t in item["conversations"] if t["from"] == "human") for item in items]


@pytest.fixture(scope="session")
def ppl_records() -> list[dict]:
    lines = challenge_file("ppl_ground_truth_tokens.jsonl").read_text().splitlines()
    return [json.loads(line) for line in lines if line.strip()]


@pytest.fixture(scope="session")
def small_prompts(tmp_path_factory) -> Path:
    """The challenge prompts cut down (12 prompts of <= 300 chars): a tiny model serves them in seconds."""
    items = json.loads(challenge_file("eval_prompts_sharegpt.json").read_text())[:12]
    for item in items:
        item["conversations"][0]["value"] = item["conversations"][0]["value"][:300]
    path = tmp_path_factory.mktemp("data") / "prompts.json"
    path.write_text(json.dumps(items))
    return path


@pytest.fixture(scope="session")
def small_ppl(tmp_path_factory) -> Path:
    """The challenge PPL records cut down (4 records of 48 context + 24 target tokens)."""
    lines = challenge_file("ppl_ground_truth_tokens.jsonl").read_text().splitlines()[:4]
    records = [json.loads(line) for line in lines]
    path = tmp_path_factory.mktemp("data") / "ppl.jsonl"
    path.write_text("".join(
        json.dumps({"id": r["id"], "context_token_ids": r["context_token_ids"][:48],
                    "target_token_ids": r["target_token_ids"][:24]}) + "\n" for r in records))
    return path


@pytest.fixture(scope="session")
def tiny_e4b(tmp_path_factory) -> Path:
    return tiny_models.save_tiny(tiny_models.gemma4_e4b_like_config(), tmp_path_factory.mktemp("e4b"), seed=1)


@pytest.fixture(scope="session")
def tiny_e2b(tmp_path_factory) -> Path:
    return tiny_models.save_tiny(tiny_models.gemma4_e2b_like_config(), tmp_path_factory.mktemp("e2b"), seed=2)


@pytest.fixture(scope="session")
def tiny_k_eq_v(tmp_path_factory) -> Path:
    return tiny_models.save_tiny(tiny_models.gemma4_k_eq_v_config(), tmp_path_factory.mktemp("keqv"), seed=4)


@pytest.fixture(scope="session")
def tiny_gemma3(tmp_path_factory) -> Path:
    return tiny_models.save_tiny(tiny_models.gemma3_config(), tmp_path_factory.mktemp("g3"), seed=3)


@pytest.fixture(scope="session")
def tiny_text_model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A tiny random Gemma 3 with the real Gemma tokenizer (vocab 262144): text prompts work."""
    import shutil

    import torch
    from transformers import Gemma3ForCausalLM, Gemma3TextConfig

    from fastgemma.weights.checkpoint import gguf_meta_folder
    from fastgemma.weights.source import embedded_model_path

    folder = tmp_path_factory.mktemp("models") / "tiny-gemma3-text"
    config = Gemma3TextConfig(
        vocab_size=262144,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=2,
        num_key_value_heads=1,
        head_dim=16,
        sliding_window=16,
        max_position_embeddings=1024,
        layer_types=["sliding_attention", "full_attention"],
        bos_token_id=2,
        eos_token_id=1,
        pad_token_id=0,
    )
    torch.manual_seed(1234)
    Gemma3ForCausalLM(config).save_pretrained(folder)
    tokenizer_folder = gguf_meta_folder(embedded_model_path())
    for name in ("tokenizer.json", "tokenizer_config.json"):
        shutil.copy(tokenizer_folder / name, folder / name)
    return folder


@pytest.fixture(scope="session")
def tiny_multimodal(tmp_path_factory) -> Path:
    """A tiny random Gemma4ForConditionalGeneration (vision + audio) with a Gemma 4 tokenizer."""
    return tiny_models.save_tiny_multimodal(tmp_path_factory.mktemp("models") / "tiny-gemma4-mm")


@pytest.fixture(scope="session")
def mm_llm(tiny_multimodal):
    from fastgemma import LLM

    return LLM(str(tiny_multimodal), dtype="float32", max_model_len=512)


@pytest.fixture(scope="session")
def embedded_llm_fp32():
    from fastgemma import LLM

    return LLM(dtype="float32", max_model_len=4096, max_num_seqs=4)  # the longest PPL record: 2943 tokens


@pytest.fixture(scope="session")
def embedded_reference():
    """transformers' Gemma 3 on the same GGUF, fp32 eager (its GGUF loader dequantises)."""
    import torch
    from transformers import AutoModelForCausalLM

    from fastgemma.weights.source import embedded_model_path

    path = embedded_model_path()
    return AutoModelForCausalLM.from_pretrained(
        path.parent, gguf_file=path.name, dtype=torch.float32, attn_implementation="eager"
    ).eval()
