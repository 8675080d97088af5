"""Continuous batching: every request's tokens are the ones it gets alone.

Checked on tiny random models (rings of 8 slots, so sequences cross the sliding window many
times; prefill chunks of 16, so long prompts take several steps beside running decodes) for
every decode path: fused bf16, per-op bf16, per-op fp32, and the fixed-shape step on CPU.
Requests arrive at different steps, some are cancelled mid-stream, neighbours sample, ask for
logprobs or stop early; a greedy request's tokens never change, and a seeded sampled one's
neither.
"""

from __future__ import annotations

import random

import pytest
import torch

from fastgemma import LLM, SamplingParams
from fastgemma.engine.llm_engine import LLMEngine
from fastgemma.engine.model_runner import ModelRunner
from fastgemma.kernels import native

needs_native = pytest.mark.skipif(native.load() is None, reason=f"native kernels unavailable: {native.status()}")

LEN = 128
PATHS = {
    "fused bf16": dict(dtype="bfloat16"),
    "per-op bf16": dict(dtype="bfloat16", fused_decode=False),
    "per-op fp32": dict(dtype="float32"),
}


def _workload(seed: int = 0) -> list[tuple[int, list[int], SamplingParams]]:
    """(arrival step, prompt, params): prompts of 2-45 tokens (past the window of 8 and the
    chunk of 16), outputs of 5-60 tokens, greedy, greedy with logprobs, and seeded sampling."""
    rng = random.Random(seed)
    work = []
    for i in range(9):
        prompt = [rng.randrange(1, 500) for _ in range(rng.choice([2, 7, 20, 45]))]
        kind = i % 3
        params = SamplingParams(
            max_tokens=rng.randrange(5, 60), ignore_eos=True,
            temperature=0.0 if kind < 2 else 0.9, top_k=0 if kind < 2 else 40,
            seed=None if kind < 2 else 100 + i, logprobs=2 if kind == 1 else None,
        )
        work.append((rng.randrange(0, 30), prompt, params))
    return work


def _run(
    engine: LLMEngine, work, cancel: dict[int, int] | None = None, paused: list[int] | None = None
) -> list[tuple[list[int], list]]:
    """Add each request at its arrival step; `cancel` {request: output length}: abort it
    there. Returns every request's (tokens, logprobs); `paused` gets, after each step, the
    number of sequences whose prompt chunk stopped between stages."""
    cancel = cancel or {}
    seqs: dict[int, object] = {}
    step = 0
    while len(seqs) < len(work) or engine.has_unfinished():
        for i, (arrival, prompt, params) in enumerate(work):
            if arrival == step and i not in seqs:
                seqs[i] = engine.add_request(prompt, params)
        for i, n in cancel.items():
            if i in seqs and len(seqs[i].output_token_ids) >= n:
                engine.finish(seqs[i], "abort")
        if engine.has_unfinished():
            engine.step()
            if paused is not None:
                paused.append(sum(seq.prefill is not None for seq in engine.scheduler.running))
        step += 1
    return [(list(seqs[i].output_token_ids), list(seqs[i].output_logprobs)) for i in range(len(work))]


def _alone(folder, opts: dict, work) -> list[tuple[list[int], list]]:
    llm = LLM(str(folder), device="cpu", max_model_len=LEN, prefill_chunk=16, max_num_seqs=1, **opts)
    return [_run(llm.engine, [(0, prompt, params)])[0] for _, prompt, params in work]


@needs_native
@pytest.mark.parametrize("name", ["tiny_e4b", "tiny_e2b", "tiny_gemma3"])
@pytest.mark.parametrize("path", list(PATHS))
@pytest.mark.parametrize("budget", [20, 6])
def test_each_request_gets_its_tokens_alone_whatever_joins_or_leaves(name, path, budget, request):
    """budget 20 tokens a step: whole chunks of 16 beside 4 decodes; 6: a chunk runs a stage
    or a few per step (a layer's attention or feed-forward), paused between stages while the
    others decode."""
    folder, opts = request.getfixturevalue(name), PATHS[path]
    work = _workload()
    alone = _alone(folder, opts, work)
    llm = LLM(str(folder), device="cpu", max_model_len=LEN, prefill_chunk=16, max_num_seqs=4,
              max_num_batched_tokens=budget, **opts)
    assert llm.runner.batched and llm.model.fused_decode == (path == "fused bf16")
    paused: list[int] = []
    assert _run(llm.engine, work, paused=paused) == alone
    assert (max(paused) > 0) == (budget == 6)  # with the small budget, chunks ran over several steps
    # Cancelled mid-stream: the others are unaffected; the cancelled ones stopped where cut.
    cut = {1: 3, 4: 1}
    got = _run(llm.engine, work, cancel=cut)
    for i, (tokens, _) in enumerate(got):
        want = alone[i][0]
        assert tokens == (want[: len(tokens)] if i in cut else want), i
        if i in cut:
            assert cut[i] <= len(tokens) < len(want)
    assert not llm.engine.scheduler.running and len(llm.engine.scheduler.free_slots) == 4  # every slot back


@needs_native
def test_speculative_sequences_batch_exactly(tiny_e4b):
    """n-gram drafts share a forward's rows with the other sequences' decodes."""
    work = [(a, p, SamplingParams(max_tokens=s.max_tokens, temperature=0.0, ignore_eos=True)) for a, p, s in _workload(1)]
    work += [(3, [9, 4] * 10, SamplingParams(max_tokens=50, temperature=0.0, ignore_eos=True))]  # drafts well
    alone = _alone(tiny_e4b, PATHS["fused bf16"], work)
    spec = LLM(str(tiny_e4b), device="cpu", max_model_len=LEN, prefill_chunk=16, max_num_seqs=3, dtype="bfloat16",
               speculative="ngram", num_speculative_tokens=5, prompt_lookup_min=1)
    assert _run(spec.engine, work) == alone
    assert spec.engine.spec_stats.num_accepted_tokens > 0


def test_the_fixed_shape_step_batches_exactly(tiny_gemma3):
    """The fixed-shape step (CUDA's graph path, run eagerly on CPU): one step per sequence slot."""
    llm = LLM(str(tiny_gemma3), dtype="float32", device="cpu", max_model_len=LEN, kernels="torch")

    def engine(num_seqs: int) -> LLMEngine:
        runner = ModelRunner(llm.model, LEN, prefill_chunk=16, static_steps=True, enforce_eager=True,
                             max_num_seqs=num_seqs)
        return LLMEngine(runner, llm.spec.eos_token_ids, llm.spec.vocab_size)

    work = [(a, p, SamplingParams(max_tokens=min(s.max_tokens, 20), temperature=0.0, ignore_eos=True))
            for a, p, s in _workload(2)[:5]]
    alone = [_run(engine(1), [(0, p, s)])[0] for _, p, s in work]
    batched = engine(3)
    assert _run(batched, work) == alone
    assert sorted(batched.runner.static) == [0, 1, 2]  # each slot ran its own step


@needs_native
@pytest.mark.parametrize("path", ["fused bf16", "per-op fp32"])
@pytest.mark.parametrize("budget", [19, 6])
def test_a_growing_cache_gives_the_tokens_of_a_whole_one(tiny_e4b, path, budget, monkeypatch):
    """The pool's full layers start at 8 positions per slot and double while sequences run
    (reallocated between forwards, the fused step's pointers taken again; with budget 6 also
    while a prompt chunk is paused between stages): every request's tokens are the ones it
    gets with the cache allocated whole."""
    from fastgemma.models import kv_cache

    work = _workload(3)
    opts = dict(device="cpu", max_model_len=LEN, prefill_chunk=16, max_num_seqs=3, max_num_batched_tokens=budget)
    whole = LLM(str(tiny_e4b), **opts, **PATHS[path])
    assert whole.runner.pool.capacity == LEN
    want = _run(whole.engine, work)
    monkeypatch.setattr(kv_cache, "INITIAL_CAPACITY", 8)
    grown = LLM(str(tiny_e4b), **opts, **PATHS[path])
    assert grown.runner.pool.capacity == 8
    assert _run(grown.engine, work) == want
    assert grown.runner.pool.generation >= 3 and grown.runner.pool.capacity <= LEN


@needs_native
def test_a_request_cancelled_while_its_chunk_is_paused_frees_its_slot_cleanly(tiny_e4b):
    """Aborted between two stages of its prompt chunk: the others' tokens do not change, and
    the next request in its slot gets its own tokens alone (nothing of the paused chunk is
    left in the slot or the engine)."""
    greedy = SamplingParams(max_tokens=30, temperature=0.0, ignore_eos=True)
    a, b, c = [3, 1, 4, 1, 5], [7 + i % 50 for i in range(40)], [2, 7, 1, 8, 2, 8, 1, 8, 2, 8, 4, 5, 9]
    alone = _alone(tiny_e4b, PATHS["fused bf16"], [(0, a, greedy), (0, c, greedy)])
    llm = LLM(str(tiny_e4b), device="cpu", max_model_len=LEN, prefill_chunk=16, max_num_seqs=2,
              max_num_batched_tokens=4, dtype="bfloat16")
    engine = llm.engine
    sa = engine.add_request(a, greedy)
    engine.step()
    sb = engine.add_request(b, greedy)
    while sb.prefill is None or sb.num_computed_tokens == 0:
        engine.step()  # until b's second chunk stops between stages
    slot = sb.slot
    engine.finish(sb, "abort")
    sc = engine.add_request(c, greedy)
    while engine.has_unfinished():
        engine.step()
    assert sc.slot == slot and not sb.output_token_ids
    assert [sa.output_token_ids, sc.output_token_ids] == [t for t, _ in alone]


@needs_native
def test_penalised_requests_follow_their_logits_alone_batched_and_drafted(tiny_gemma3):
    """Penalties and a bias: each greedy token is the argmax of the processed logits of the
    plain path (prompt, output so far), the rows read through the lm_head screen's sparse
    logits (runner: DecodeRows.keep); the same alone, beside others, and with n-gram drafts
    verified row by row (the bias makes the output repeat 9 / 4, so drafts are kept, until
    the penalties outweigh it)."""
    from fastgemma.engine.sampler import process_logits

    prompt = [5, 9, 4, 9, 4, 9, 4, 9, 4, 7]
    params = SamplingParams(max_tokens=24, temperature=0.0, ignore_eos=True, repetition_penalty=1.3,
                            frequency_penalty=0.4, presence_penalty=0.3, logit_bias={9: 4.0, 4: 4.0})
    base = dict(device="cpu", max_model_len=LEN, prefill_chunk=16, dtype="bfloat16")
    plain = LLM(str(tiny_gemma3), **base)
    runner, out = plain.runner, []
    with torch.inference_mode():
        logits = runner.prefill(prompt)
        for _ in range(params.max_tokens):
            out.append(int(torch.argmax(process_logits(logits[None], params, prompt, out)[0])))
            logits = runner.decode(out[-1], len(prompt) + len(out) - 1)
    unpenalised = plain.generate([prompt], SamplingParams(max_tokens=24, temperature=0.0, ignore_eos=True))[0]
    assert list(unpenalised.outputs[0].token_ids) != out  # the penalties matter here
    other = SamplingParams(max_tokens=30, temperature=0.0, ignore_eos=True)
    screen, screened = plain.model.lm_head_screen, []
    assert screen is not None
    sparse = screen.sparse_logits
    screen.sparse_logits = lambda *a: screened.append(1) or sparse(*a)  # the screen picks them
    assert list(plain.generate([prompt], params)[0].outputs[0].token_ids) == out
    assert len(screened) == params.max_tokens - 1  # every decode step's row (the first token: the prompt's logits)
    batched = _run(plain.engine, [(0, [3, 1, 4, 1, 5], other), (0, prompt, params), (3, prompt, params)])
    assert [tokens for tokens, _ in batched[1:]] == [out, out]  # joined together and three steps later
    spec = LLM(str(tiny_gemma3), **base, speculative="ngram", num_speculative_tokens=5, prompt_lookup_min=1)
    assert list(spec.generate([prompt], params)[0].outputs[0].token_ids) == out
    assert spec.engine.spec_stats.num_accepted_tokens > 0  # drafts were kept: later rows counted them


@needs_native
@pytest.mark.parametrize("speculative", [None, "ngram"])
def test_min_tokens_holds_back_end_of_sequence_and_stop_ids(tiny_gemma3, speculative):
    """The first min_tokens tokens are those of the plain path with the stop ids masked:
    a stop id that is the greedy pick at once (by itself, through the greedy screen after
    min_tokens; or made so by a bias: end-of-sequence, a stop_token_id) comes no earlier."""
    from fastgemma.engine.sampler import process_logits

    base = dict(device="cpu", max_model_len=LEN, prefill_chunk=16, dtype="bfloat16")
    spec = dict(speculative="ngram", num_speculative_tokens=5, prompt_lookup_min=1) if speculative else {}
    llm = LLM(str(tiny_gemma3), **base, **spec)
    eos = sorted(llm.engine.eos_token_ids)[0]
    prompt = [5, 9, 4, 9, 4, 9, 4, 9, 4, 7]
    first = llm.generate([prompt], SamplingParams(max_tokens=1, temperature=0.0))[0].outputs[0].token_ids[0]
    cases = [({"stop_token_ids": [first]}, None), ({"logit_bias": {eos: 60.0}}, eos),
             ({"stop_token_ids": [11], "logit_bias": {11: 60.0}}, 11)]
    for extra, ends_with in cases:
        params = SamplingParams(max_tokens=20, temperature=0.0, min_tokens=6, **extra)
        out = list(llm.generate([prompt], params)[0].outputs[0].token_ids)
        runner, want = llm.runner, []
        stop_ids = sorted(set(extra.get("stop_token_ids", [])) | llm.engine.eos_token_ids)
        with torch.inference_mode():
            logits = runner.prefill(prompt)
            for _ in range(6):
                want.append(int(torch.argmax(process_logits(logits[None], params, prompt, want, (), stop_ids)[0])))
                logits = runner.decode(want[-1], len(prompt) + len(want) - 1)
        assert out[:6] == want and not set(want) & set(stop_ids), (extra, out)
        if ends_with is not None:
            assert out[6:] == [ends_with], (extra, out)
