"""Our decoders against transformers' own (eager, fp32) on tiny random checkpoints.

Prefill logits for every prompt position, then a cached decode — one token per step — that
runs more than three times past the sliding window, each step's logits compared with the
reference's logits at that position. Chunked prefill is compared too.
"""

from __future__ import annotations

import pytest
import torch

from fastgemma import LLM
from tests.tiny_models import reference_model

TOL = 1e-4
PROMPT, TOTAL = 11, 40  # window 8: decode runs from position 11 to 39, > 3 windows past it


def _reference_logits(folder, ids: torch.Tensor) -> torch.Tensor:
    with torch.no_grad():
        return reference_model(folder)(ids[None]).logits[0]  # [T, V]


def _our_logits(llm: LLM, ids: list[int], prompt_len: int, chunk: int | None = None) -> torch.Tensor:
    runner = llm.runner
    rows = []
    with torch.inference_mode():
        step = chunk or prompt_len
        for s in range(0, prompt_len, step):
            n = min(step, prompt_len - s)
            rows.append(runner.model.compute_logits(runner._forward(ids[s : s + n], s, None)))
        for pos in range(prompt_len, len(ids)):
            rows.append(runner.decode(ids[pos], pos)[None])
    return torch.cat(rows).float()


@pytest.mark.parametrize("name", ["tiny_e4b", "tiny_e2b", "tiny_k_eq_v", "tiny_gemma3"])
def test_logits_match_transformers(name, request):
    folder = request.getfixturevalue(name)
    llm = LLM(str(folder), dtype="float32", device="cpu", max_model_len=64)
    ids = torch.randint(0, llm.spec.vocab_size, (TOTAL,), generator=torch.Generator().manual_seed(7))
    ref = _reference_logits(folder, ids)
    ours = _our_logits(llm, ids.tolist(), PROMPT)
    assert ours.shape == ref.shape
    err = (ours - ref).abs().max(dim=-1).values  # per position
    assert err[:PROMPT].max() < TOL, f"prefill max-abs {err[:PROMPT].max():.2e}"
    assert err[PROMPT:].max() < TOL, f"decode max-abs {err[PROMPT:].max():.2e} at step {int(err[PROMPT:].argmax())}"
    assert ref.abs().max() > 1.0, "logits too small to make the comparison meaningful"


@pytest.mark.parametrize("name", ["tiny_e4b", "tiny_gemma3"])
def test_chunked_prefill_matches_transformers(name, request):
    folder = request.getfixturevalue(name)
    llm = LLM(str(folder), dtype="float32", device="cpu", max_model_len=64)
    ids = torch.randint(0, llm.spec.vocab_size, (TOTAL,), generator=torch.Generator().manual_seed(8))
    ref = _reference_logits(folder, ids)
    ours = _our_logits(llm, ids.tolist(), TOTAL, chunk=5)  # chunks straddle the ring's wrap
    assert (ours - ref).abs().max() < TOL


def test_spec_reads_gemma4_geometry(tiny_e4b):
    llm = LLM(str(tiny_e4b), dtype="float32", device="cpu", max_model_len=64)
    layers = llm.spec.layers
    assert [l.kv_shared for l in layers] == [False] * 5 + [True] * 3
    assert [l.kv_source for l in layers[5:]] == [2, 4, 2]  # last non-shared layer of the same type
    assert {l.head_dim for l in layers if l.layer_type == "full_attention"} == {32}
    assert llm.spec.rope["full_attention"].rope_type == "proportional"
    assert set(llm.runner.cache.k) == {0, 1, 2, 3, 4}  # shared layers hold no cache
    assert llm.runner.cache.k[0].shape[1] == 8  # sliding ring = window
    assert llm.runner.cache.k[2].shape[1] == 64  # full = max_model_len


def test_double_wide_mlp(tiny_e2b):
    llm = LLM(str(tiny_e2b), dtype="float32", device="cpu", max_model_len=64)
    widths = [l.intermediate_size for l in llm.spec.layers]
    assert widths == [64, 64, 64, 128, 128, 128, 128]


def test_kv_shared_prefill_shortcut(tiny_e4b):
    """Prefill that keeps only the last position (shared layers skip the rest) = the full prefill's last row."""
    llm = LLM(str(tiny_e4b), dtype="float32", device="cpu", max_model_len=64)
    ids = torch.randint(0, llm.spec.vocab_size, (30,), generator=torch.Generator().manual_seed(9)).tolist()
    ref = _reference_logits(tiny_e4b, torch.tensor(ids))
    last = llm.runner.prefill(ids)  # keep = [last]
    assert (last - ref[-1]).abs().max() < TOL
    # The cache it leaves behind decodes like the reference.
    nxt = llm.runner.decode(ids[-1], len(ids))  # feed a token at position 30
    ref2 = _reference_logits(tiny_e4b, torch.tensor(ids + [ids[-1]]))
    assert (nxt - ref2[-1]).abs().max() < TOL
