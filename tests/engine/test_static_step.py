"""The fixed-shape decode step (engine/static_step.py), run eagerly on the CPU.

On CUDA this step is what a CUDA graph replays (tests/test_cuda.py checks the replay against
it); here the same computation runs without a graph: it must match the plain per-op path,
write nothing but its tokens' slots, and give verification rows that are its decode steps'
bits — which makes speculative greedy decoding on it identical to plain decoding.
"""

from __future__ import annotations

import pytest
import torch

from fastgemma import LLM, SamplingParams, kernels
from fastgemma.engine.llm_engine import LLMEngine
from fastgemma.engine.model_runner import ModelRunner
from fastgemma.engine.mtp import MtpProposer
from fastgemma.engine.ngram import NgramProposer
from fastgemma.engine.static_step import STATIC_ROWS
from fastgemma.weights.assistant import load_assistant
from tests import tiny_models
from tests.engine.test_mtp import _assistant
from tests.engine.test_speculative import PROMPTS, _PartlyRight

LEN = 128


def _runners(folder, dtype: str, spare: int = 4, chunk: int = 512) -> tuple[LLM, ModelRunner, ModelRunner]:
    """(llm, plain per-op runner, static-step runner) over one model with torch's kernels."""
    llm = LLM(str(folder), dtype=dtype, device="cpu", max_model_len=LEN, kernels="torch")
    plain = ModelRunner(llm.model, LEN, prefill_chunk=chunk, num_speculative_tokens=spare)
    static = ModelRunner(
        llm.model, LEN, prefill_chunk=chunk, num_speculative_tokens=spare, static_steps=True, enforce_eager=True
    )
    return llm, plain, static


def _static_engine(llm: LLM, k: int | None) -> LLMEngine:
    """An engine on the static step (eager), with an n-gram drafter of K tokens (None: none)."""
    runner = ModelRunner(llm.model, LEN, num_speculative_tokens=k or 0, static_steps=True, enforce_eager=True)
    proposer = NgramProposer(k, 1, 4) if k else None
    return LLMEngine(runner, llm.spec.eos_token_ids, llm.spec.vocab_size, proposer)


def _generate(llm: LLM, engine: LLMEngine, params: SamplingParams) -> list[list[int]]:
    llm.engine = engine
    return [o.outputs[0].token_ids for o in llm.generate(PROMPTS, params)]


@pytest.mark.parametrize("name", ["tiny_e4b", "tiny_k_eq_v", "tiny_gemma3"])
def test_static_step_matches_the_plain_path(name, request):
    """fp32 logits of 60 decode steps (rings of 8 slots wrap many times) after a prefill in
    chunks of 4 agree with the per-op path; the masked whole-buffer attention only reorders sums."""
    llm, plain, static = _runners(request.getfixturevalue(name), "float32", chunk=4)
    ids = list(range(3, 14))
    a = plain.prefill(ids)
    static.prefill(ids)
    token, worst, worst_hidden = int(a.argmax()), 0.0, 0.0
    for position in range(len(ids), len(ids) + 60):
        la, lb = plain.decode(token, position), static.decode(token, position)
        worst = max(worst, float((la - lb).abs().max()))
        assert int(la.argmax()) == int(lb.argmax())
        worst_hidden = max(worst_hidden, float((plain.last_hidden - static.last_hidden).abs().max()))
        token = int(la.argmax())
    assert worst < 1e-4 and worst_hidden < 1e-3


@pytest.mark.parametrize("dtype", ["bfloat16", "float32"])
@pytest.mark.parametrize("name", ["tiny_e4b", "tiny_gemma3"])
def test_verification_rows_are_the_decode_steps_bits(name, dtype, request):
    """K + 1 rows in one step equal K + 1 one-token steps bit for bit, past the window."""
    llm, _, static = _runners(request.getfixturevalue(name), dtype, spare=5)
    ids, draft = list(range(3, 30)), [11, 12, 13, 14, 15]
    static.prefill(ids[:-1])
    rows = static.verify([ids[-1], *draft], len(ids) - 1, greedy=False)
    hidden = static.last_hidden
    static.prefill(ids[:-1])
    steps = [static.decode(t, len(ids) - 1 + i) for i, t in enumerate([ids[-1], *draft])]
    assert torch.equal(rows, torch.stack(steps))
    static.prefill(ids[:-1])
    assert static.verify([ids[-1], *draft], len(ids) - 1, greedy=True) == torch.argmax(rows, -1).tolist()
    assert torch.equal(static.last_hidden, hidden)


def test_a_step_writes_only_its_tokens_slots(tiny_e4b):
    """Padding rows (STATIC_ROWS - n of them) write the scratch slot and nothing else."""
    llm, _, static = _runners(tiny_e4b, "float32")
    cache = static.cache
    static.prefill(list(range(3, 20)))
    for ids, position in (([7], 17), ([8, 9, 10], 18)):
        before = {i: t.clone() for i, t in cache.k.items()}
        static.verify(ids, position, greedy=True)
        for i, k in cache.k.items():
            ring = llm.spec.layers[i].is_sliding
            own = {(p % cache.ring) if ring else p for p in range(position, position + len(ids))}
            scratch = k.shape[1] - 1
            changed = {s for s in range(k.shape[1]) if not torch.equal(k[:, s], before[i][:, s])}
            assert own <= changed <= own | {scratch}, (i, own, changed)


def test_the_step_rejects_more_rows_than_it_has(tiny_gemma3):
    _, _, static = _runners(tiny_gemma3, "float32")
    static.prefill([1, 2, 3])
    with pytest.raises(AssertionError, match="1..16"):
        static.verify(list(range(STATIC_ROWS + 1)), 3, greedy=True)


@pytest.mark.parametrize("dtype", ["bfloat16", "float32"])
@pytest.mark.parametrize("name", ["tiny_e4b", "tiny_e2b", "tiny_gemma3"])
def test_speculative_greedy_on_the_static_step_is_identical_to_plain(name, dtype, request):
    """n-gram drafts and partly right drafts (every acceptance length, every rollback)."""
    llm = LLM(str(request.getfixturevalue(name)), dtype=dtype, device="cpu", max_model_len=LEN, kernels="torch")
    params = SamplingParams(max_tokens=70, temperature=0.0, ignore_eos=True)
    expected = _generate(llm, _static_engine(llm, None), params)
    for k in (1, 3, 7):
        engine = _static_engine(llm, k)
        assert _generate(llm, engine, params) == expected
        engine.proposer = _PartlyRight({tuple(p): e for p, e in zip(PROMPTS, expected)}, k)
        assert _generate(llm, engine, params) == expected
        stats = engine.spec_stats
        assert 0 < stats.num_accepted_tokens < stats.num_draft_tokens


def test_logprobs_and_sampling_on_the_static_step(tiny_gemma3):
    llm = LLM(str(tiny_gemma3), dtype="float32", device="cpu", max_model_len=LEN, kernels="torch")
    params = SamplingParams(max_tokens=20, temperature=0.0, ignore_eos=True, logprobs=2)
    plain = llm.generate([PROMPTS[1]], params)[0].outputs[0]
    llm.engine = _static_engine(llm, 3)
    static = llm.generate([PROMPTS[1]], params)[0].outputs[0]
    assert static.token_ids == plain.token_ids
    for a, b in zip(plain.logprobs, static.logprobs):
        assert a.keys() == b.keys() and all(abs(a[t] - b[t]) < 1e-4 for t in a)
    sampled = llm.generate([PROMPTS[1]], SamplingParams(max_tokens=12, temperature=1.0, seed=5, ignore_eos=True))
    again = llm.generate([PROMPTS[1]], SamplingParams(max_tokens=12, temperature=1.0, seed=5, ignore_eos=True))
    assert sampled[0].outputs[0].token_ids == again[0].outputs[0].token_ids


def test_mtp_on_the_static_step_is_identical_to_plain(tiny_e4b, tmp_path_factory):
    assistant = _assistant(tiny_models.gemma4_e4b_like_config(), tmp_path_factory, 11)
    llm = LLM(str(tiny_e4b), dtype="bfloat16", device="cpu", max_model_len=LEN, kernels="torch")
    params = SamplingParams(max_tokens=70, temperature=0.0, ignore_eos=True)
    expected = _generate(llm, _static_engine(llm, None), params)
    for k in (1, 4):
        # the drafter reads one position further back than a sliding query: K + 1 spare slots
        runner = ModelRunner(llm.model, LEN, num_speculative_tokens=k + 1, static_steps=True, enforce_eager=True)
        drafter = load_assistant(str(assistant), llm.spec, llm.model.dtype, runner.device, LEN)
        proposer = MtpProposer(drafter, llm.model, runner.cache, k)
        engine = LLMEngine(runner, llm.spec.eos_token_ids, llm.spec.vocab_size, proposer)
        assert _generate(llm, engine, params) == expected
        assert engine.spec_stats.num_drafts > 0


@pytest.fixture
def triton_on_cpu(monkeypatch):
    """Route the static step's attention and quantised linears through the Triton kernels
    (kernels/cuda_*.py), which tests/conftest.py runs in Triton's interpreter without a GPU."""
    pytest.importorskip("triton")
    if not torch.cuda.is_available():
        monkeypatch.setattr(kernels, "use_triton", lambda x: True)


@pytest.mark.parametrize("quantization", [None, "int4-g32"])
def test_the_triton_step_matches_and_keeps_rows_independent(quantization, tiny_e4b, triton_on_cpu):
    """The CUDA kernels inside the step (interpreted here, a few seconds a step, hence few
    steps): logits close to the per-op path past the window, and verification rows equal to
    the decode steps bit for bit."""
    llm = LLM(str(tiny_e4b), dtype="float32", device="cpu", max_model_len=LEN, kernels="torch",
              quantization=quantization)
    plain = ModelRunner(llm.model, LEN, num_speculative_tokens=3)
    static = ModelRunner(llm.model, LEN, num_speculative_tokens=3, static_steps=True, enforce_eager=True)
    ids, draft = list(range(3, 14)), [11, 12, 13]  # 11 + 4 positions: past the window of 8
    plain.prefill(ids[:-1])
    static.prefill(ids[:-1])
    steps = []
    for i, token in enumerate([ids[-1], *draft]):
        expected = plain.decode(token, len(ids) - 1 + i)
        steps.append(static.decode(token, len(ids) - 1 + i))
        assert (steps[-1] - expected).abs().max() < 1e-4
    static.prefill(ids[:-1])
    rows = static.verify([ids[-1], *draft], len(ids) - 1, greedy=False)
    assert torch.equal(rows, torch.stack(steps))
