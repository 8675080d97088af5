"""n choices of one prompt (SamplingParams.n): the prompt runs once, and each choice's tokens
are the ones it gets as a request of its own (choice i: `params.for_choice(i)`, seed + i)."""

from __future__ import annotations

import pytest

from fastgemma import LLM, SamplingParams
from fastgemma.kernels import native

needs_native = pytest.mark.skipif(native.load() is None, reason=f"native kernels unavailable: {native.status()}")

LEN = 128
PATHS = {"fused bf16": dict(dtype="bfloat16"), "per-op fp32": dict(dtype="float32")}
PROMPTS = [[5 + (7 * i) % 300 for i in range(45)], [3, 1, 4, 1, 5, 9, 2]]  # past the chunk of 16 and the window of 8
PARAMS = [
    SamplingParams(n=3, max_tokens=20, temperature=0.8, top_k=40, seed=11, ignore_eos=True),
    SamplingParams(n=2, max_tokens=12, temperature=0.0, logprobs=2, ignore_eos=True),
    SamplingParams(n=2, max_tokens=15, temperature=0.0, ignore_eos=True),
]


def _llm(folder, num_seqs: int, **opts) -> LLM:
    return LLM(str(folder), device="cpu", max_model_len=LEN, prefill_chunk=16, max_num_seqs=num_seqs, **opts)


def _finish(engine, seqs) -> list[tuple[list[int], list]]:
    while engine.has_unfinished():
        engine.step()
    return [(s.output_token_ids, s.output_logprobs) for s in seqs]


def _alone(folder, opts, prompt, params) -> list[tuple[list[int], list]]:
    llm = _llm(folder, 1, **opts)
    return [_finish(llm.engine, [llm.engine.add_request(prompt, params.for_choice(i))])[0] for i in range(params.n)]


@needs_native
@pytest.mark.parametrize("name", ["tiny_e4b", "tiny_gemma3"])
@pytest.mark.parametrize("path", list(PATHS))
def test_each_choice_gets_the_tokens_of_its_own_request_and_the_prompt_runs_once(name, path, request, monkeypatch):
    """Groups of choices (seeded sampling, greedy with logprobs, greedy) arrive while other
    choices decode; the small budget spreads prompt chunks over steps; the cache grows (its
    buffers reallocated) while they run."""
    from fastgemma.models import kv_cache

    folder, opts = request.getfixturevalue(name), PATHS[path]
    work = [(p, s) for p in PROMPTS for s in PARAMS]
    alone = [_alone(folder, opts, p, s) for p, s in work]
    assert alone[0][0] != alone[0][1]  # seeded choices differ (seed + i)
    monkeypatch.setattr(kv_cache, "INITIAL_CAPACITY", 16)
    llm = _llm(folder, 5, max_num_batched_tokens=6, enable_prefix_caching=False, **opts)  # each group computes its prompt
    chunks: list[int] = []
    start = llm.runner.start_prefill
    monkeypatch.setattr(llm.runner, "start_prefill", lambda ids, at, *a, **k: chunks.append(at) or start(ids, at, *a, **k))
    groups = []
    for prompt, params in work:
        groups.append(llm.engine.add_choices(prompt, params))
        llm.engine.step()
    got = _finish(llm.engine, [s for g in groups for s in g])
    assert got == [c for a in alone for c in a]
    assert sorted(chunks) == sorted(at for p, _ in work for at in range(0, len(p), 16))  # once per group
    assert len(llm.engine.scheduler.free_slots) == 5 and llm.runner.pool.generation >= 2


@needs_native
def test_cancelled_choices_leave_the_others_their_tokens(tiny_e4b):
    """The first choice cancelled while its prompt is paused: the forks compute the prompt
    themselves; a fork cancelled before the copy: the others go on. Every slot comes back."""
    prompt, params = PROMPTS[0], PARAMS[0]
    alone = _alone(tiny_e4b, PATHS["fused bf16"], prompt, params)
    llm = _llm(tiny_e4b, 4, max_num_batched_tokens=4, dtype="bfloat16")
    other = llm.engine.add_request([2, 7, 1, 8], SamplingParams(max_tokens=40, temperature=0.0, ignore_eos=True))
    llm.engine.step()
    first, second, third = llm.engine.add_choices(prompt, params)
    while first.prefill is None:
        llm.engine.step()  # its first chunk is paused between stages beside the decoding `other`
    llm.engine.finish(first, "abort")
    llm.engine.finish(second, "abort")
    assert _finish(llm.engine, [third])[0] == alone[2] and not first.output_token_ids and not second.output_token_ids
    assert other.is_finished and len(llm.engine.scheduler.free_slots) == 4


def test_more_choices_than_cache_slots_are_refused(tiny_gemma3):
    llm = _llm(tiny_gemma3, 2, dtype="float32")
    with pytest.raises(ValueError, match="n=3 choices .* max_num_seqs is 2; lower n or raise --max-num-seqs"):
        llm.engine.add_choices([1, 2, 3], SamplingParams(n=3))
    with pytest.raises(ValueError, match="use add_choices"):
        llm.engine.add_request([1, 2, 3], SamplingParams(n=2))
    assert not llm.engine.has_unfinished()
