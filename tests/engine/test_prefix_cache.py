"""Exact prefix caching: a prompt that begins with kept chunks skips them, and its tokens are
the ones it gets computing everything (a hit gives the same bits as a miss)."""

from __future__ import annotations

import pytest
import torch

from fastgemma import LLM, SamplingParams
from fastgemma.engine.prefix_cache import PrefixCache
from fastgemma.kernels import native
from fastgemma.models.kv_cache import SavedChunk

needs_native = pytest.mark.skipif(native.load() is None, reason=f"native kernels unavailable: {native.status()}")

LEN = 128
PATHS = {"fused bf16": dict(dtype="bfloat16"), "per-op fp32": dict(dtype="float32")}
A = [5 + (7 * i) % 300 for i in range(45)]  # chunks of 16 end at 16 and 32; the ring holds 8
PROMPTS = [A, A[:40] + [9, 9, 9], list(A), A[:32], A[:16] + [1, 2], [4] + A[1:40]]
KEPT = [0, 32, 32, 16, 16, 0]  # prompt tokens each finds kept, run one after another in this order


def _chunk(start: int, end: int, nbytes: int = 1) -> SavedChunk:
    return SavedChunk(start, end, {0: (torch.zeros(nbytes, dtype=torch.uint8), torch.zeros(0))}, {})


def test_lookup_takes_consecutive_kept_chunks_short_of_the_last_token():
    cache = PrefixCache(4, 100)
    ids = list(range(13))
    for end in (4, 8, 12):
        cache.store(ids, end, lambda end=end: _chunk(end - 4, end))
    assert [c.end for c in cache.lookup(ids)] == [4, 8, 12]
    assert [c.end for c in cache.lookup(ids[:12])] == [4, 8]  # the chunk holding the last token runs
    assert [c.end for c in cache.lookup(ids[:8] + [99, 9, 10, 11, 12])] == [4, 8]  # the keys are compared whole
    assert cache.lookup([99, *ids[1:]]) == []
    assert (cache.queries, cache.hits) == (13 + 12 + 13 + 13, 12 + 8 + 8)
    saved = []
    cache.store(ids, 8, lambda: saved.append(1))  # kept already: not copied again
    assert not saved and cache.nbytes == 3


def test_memory_is_bounded_and_the_end_of_a_prefix_goes_first():
    cache = PrefixCache(4, 10)
    a, b = list(range(20)), [7] * 20
    for end in (4, 8, 12):
        cache.store(a, end, lambda end=end: _chunk(end - 4, end, 3))
    cache.store(b, 4, lambda: _chunk(0, 4, 3))  # 12 bytes > 10: the least recently used goes
    assert [c.end for c in cache.lookup(a)] == [4, 8] and len(cache.lookup(b)) == 1  # a's last chunk went
    cache.store(b, 8, lambda: _chunk(4, 8, 20))  # larger than the whole cache: not kept
    assert cache.nbytes == 9 and len(cache.entries) == 3


def _run(llm: LLM, prompts, params, starts: list[int]):
    """llm.generate(prompts, params); `starts` gets the start of every prompt chunk computed."""
    start = llm.runner.start_prefill
    llm.runner.start_prefill = lambda ids, at, *a, **k: starts.append(at) or start(ids, at, *a, **k)
    try:
        return llm.generate(prompts, params)
    finally:
        llm.runner.start_prefill = start


@needs_native
@pytest.mark.parametrize("name", ["tiny_e4b", "tiny_e2b", "tiny_gemma3"])
@pytest.mark.parametrize("path", list(PATHS))
def test_prompts_that_begin_with_kept_chunks_get_the_tokens_of_computing_them(name, path, request, monkeypatch):
    from fastgemma.models import kv_cache

    folder, opts = request.getfixturevalue(name), PATHS[path]
    params = SamplingParams(max_tokens=12, temperature=0.0, ignore_eos=True, logprobs=1)
    base = dict(device="cpu", max_model_len=LEN, prefill_chunk=16, **opts)
    plain = LLM(str(folder), enable_prefix_caching=False, max_num_seqs=1, **base)
    want = [plain.generate([p], params)[0] for p in PROMPTS]
    monkeypatch.setattr(kv_cache, "INITIAL_CAPACITY", 16)  # and the pool grows while chunks are loaded
    cached = LLM(str(folder), max_num_seqs=3, max_num_batched_tokens=6, **base)
    for prompt, kept, w in zip(PROMPTS, KEPT, want):
        starts: list[int] = []
        got = _run(cached, [prompt], params, starts)[0]
        assert (got.token_ids, got.outputs[0].logprobs) == (w.token_ids, w.outputs[0].logprobs)
        assert starts[0] == kept, (prompt, starts)
        starts.clear()
        hits = cached.engine.prefix_cache.hits
        again = _run(cached, [prompt], params, starts)[0]  # now everything but the last chunk is kept
        assert starts == [(len(prompt) - 1) // 16 * 16] and again.token_ids == w.token_ids
        assert cached.engine.prefix_cache.hits - hits == starts[0]
    # all at once, several finding the same chunks while others decode
    assert [o.token_ids for o in cached.generate(PROMPTS, params)] == [w.token_ids for w in want]


def test_prefix_caching_off_or_no_memory_keeps_nothing(tiny_gemma3):
    opts = dict(device="cpu", max_model_len=LEN, prefill_chunk=16, dtype="float32")
    assert LLM(str(tiny_gemma3), enable_prefix_caching=False, **opts).engine.prefix_cache is None
    assert LLM(str(tiny_gemma3), cache_ram=0, **opts).engine.prefix_cache is None
    assert LLM(str(tiny_gemma3), cache_ram=3, **opts).engine.prefix_cache.capacity_bytes == 3 << 20


def test_media_key_holds_the_media_digest_from_the_first_placeholder_on():
    from fastgemma.engine.prefix_cache import media_key

    key = media_key(5, b"digest")
    assert [key(end) for end in (4, 5, 6, 64)] == [b"", b"", b"digest", b"digest"]


def test_media_digest_tells_media_apart():
    from fastgemma.models.towers import MultimodalInputs

    pixels = torch.rand(1, 8, 12)
    positions = torch.zeros(1, 8, 2, dtype=torch.long)
    a = MultimodalInputs(pixel_values=pixels, image_position_ids=positions)
    assert a.digest() == MultimodalInputs(pixel_values=pixels.clone(), image_position_ids=positions.clone()).digest()
    other = pixels.clone()
    other[0, 3, 4] += 1e-6
    assert MultimodalInputs(pixel_values=other, image_position_ids=positions).digest() != a.digest()
    audio = MultimodalInputs(audio_features=[pixels[0][None]], audio_masks=[torch.ones(1, 8, dtype=torch.bool)])
    assert audio.digest() != a.digest()


def test_image_prompts_reuse_chunks_of_the_same_image_only(tiny_multimodal, monkeypatch):
    """A prompt with an image finds its own kept chunks (tokens and logprobs those of computing
    everything) and, when they hold the whole image, runs no tower; the same ids with another
    image share only the chunks before the image."""
    from tests.media_samples import make_image

    text = ("Here is a picture I took on a long walk by the sea last summer, look at it closely: <|image|> "
            "What is it? Tell me in a few plain words what you can see in the middle of it, please.")
    prompts = [{"prompt": text, "multi_modal_data": {"image": [make_image(seed=s)]}} for s in (1, 2)]
    params = SamplingParams(max_tokens=6, temperature=0.0, ignore_eos=True, logprobs=2)
    opts = dict(dtype="float32", max_model_len=512, prefill_chunk=16)
    plain = LLM(str(tiny_multimodal), enable_prefix_caching=False, **opts)
    want = [plain.generate(p, params)[0] for p in prompts]
    assert want[0].outputs[0].logprobs != want[1].outputs[0].logprobs  # the images matter
    cached = LLM(str(tiny_multimodal), **opts)
    ids, _ = cached.encode_inputs(prompts[0])
    placeholders = cached.runner.soft_positions(ids)
    last_chunk = (len(ids) - 1) // 16 * 16
    assert placeholders[0] >= 16 and last_chunk > placeholders[-1], (placeholders, len(ids))  # chunks before and after
    towers, calls = cached.runner.towers, []
    real = towers.soft_embeddings
    monkeypatch.setattr(towers, "soft_embeddings", lambda *a: calls.append(1) or real(*a))
    for prompt, w, kept, tower_runs in ((prompts[0], want[0], 0, 1), (prompts[0], want[0], last_chunk, 0),
                                        (prompts[1], want[1], placeholders[0] // 16 * 16, 1)):
        starts: list[int] = []
        calls.clear()
        got = _run(cached, [prompt], params, starts)[0]
        assert (got.token_ids, got.outputs[0].logprobs) == (w.token_ids, w.outputs[0].logprobs)
        assert (starts[0], len(calls)) == (kept, tower_runs)
