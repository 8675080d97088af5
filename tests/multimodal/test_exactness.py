"""Image and audio prompts on a tiny random Gemma 4 against transformers' own model (fp32, eager).

Our preprocessing + towers + decoder against `Gemma4ForConditionalGeneration` fed the same
pixel / mel features: every prompt position's logits, then cached decode steps whose
queries attend to the soft tokens' keys and values in our cache.
"""

from __future__ import annotations

import pytest
import torch

from fastgemma import SamplingParams
from tests.media_samples import make_clip, make_image

TOL = 1e-4


@pytest.fixture(scope="module")
def reference(tiny_multimodal):
    from transformers import Gemma4ForConditionalGeneration

    return Gemma4ForConditionalGeneration.from_pretrained(
        tiny_multimodal, dtype=torch.float32, attn_implementation="eager"
    ).eval()


def _reference_logits(reference, ids: list[int], mm) -> torch.Tensor:
    kwargs = {}
    if mm.pixel_values is not None:
        kwargs.update(pixel_values=mm.pixel_values, image_position_ids=mm.image_position_ids)
    if mm.audio_features:
        kwargs.update(input_features=mm.audio_features[0], input_features_mask=mm.audio_masks[0])
    with torch.no_grad():
        return reference(input_ids=torch.tensor([ids]), **kwargs).logits[0]  # [T, V]


def _our_prompt_logits(llm, ids: list[int], mm) -> torch.Tensor:
    """Every position's logits: towers, merge, one forward over the whole prompt."""
    runner = llm.runner
    with torch.inference_mode():
        t = runner._ids(ids)
        soft, mask = runner.towers.soft_embeddings(t, mm)
        return runner.model.compute_logits(runner._forward(ids, 0, None, soft=(soft, mask))).float()


@pytest.mark.parametrize("kind", ["image", "audio"])
def test_multimodal_logits_match_transformers(kind, mm_llm, reference):
    data = {"image": [make_image()]} if kind == "image" else {"audio": [(make_clip(), 16000)]}
    placeholder = "<|image|>" if kind == "image" else "<|audio|>"
    ids, mm = mm_llm.encode_inputs({"prompt": f"Look: {placeholder} What is it?", "multi_modal_data": data})
    slot = mm_llm.processor.image_token_id if kind == "image" else mm_llm.processor.audio_token_id
    n_soft = ids.count(slot)
    assert n_soft > 10, f"expected a real soft-token run, got {n_soft}"

    # prompt: every position
    ref = _reference_logits(reference, ids, mm)
    ours = _our_prompt_logits(mm_llm, ids, mm)
    assert ours.shape == ref.shape
    assert (ours - ref).abs().max() < TOL
    assert ref.abs().max() > 1.0, "logits too small to make the comparison meaningful"

    # the engine's path: chunked prefill (chunks split the soft-token run), then cached decode
    runner = mm_llm.runner
    old_chunk, runner.prefill_chunk = runner.prefill_chunk, 16
    try:
        with torch.inference_mode():
            rows = [runner.prefill(ids, multimodal=mm)[None]]
            extra = [1000 + 17 * i for i in range(6)]
            for i, tok in enumerate(extra):
                rows.append(runner.decode(tok, len(ids) + i)[None])
    finally:
        runner.prefill_chunk = old_chunk
    ours = torch.cat(rows).float()
    ref = _reference_logits(reference, ids + extra, mm)[len(ids) - 1 :]
    assert (ours - ref).abs().max() < TOL


def test_soft_tokens_change_the_output(mm_llm):
    """Two different images give different greedy continuations' logits (the towers are used)."""
    params = SamplingParams(max_tokens=1, temperature=0.0, logprobs=5)
    outs = [
        mm_llm.generate({"prompt": "<|image|>", "multi_modal_data": {"image": [make_image(seed=s)]}}, params)[0]
        for s in (1, 2)
    ]
    lp = [o.outputs[0].logprobs[0] for o in outs]
    assert lp[0] != lp[1]


def test_towers_run_once_at_prefill_only(mm_llm, monkeypatch):
    """Decode steps never call the towers: an image request runs the vision tower once, a
    text-only request on the same multimodal model never."""
    towers = mm_llm.runner.towers
    calls = []
    real = towers.soft_embeddings
    monkeypatch.setattr(towers, "soft_embeddings", lambda *a: calls.append(1) or real(*a))
    params = SamplingParams(max_tokens=8, temperature=0.0, ignore_eos=True)
    out = mm_llm.generate({"prompt": "<|image|>", "multi_modal_data": {"image": [make_image()]}}, params)[0]
    assert len(out.outputs[0].token_ids) == 8 and len(calls) == 1
    out = mm_llm.generate("Just text", params)[0]
    assert len(out.outputs[0].token_ids) == 8 and len(calls) == 1


def test_an_image_prompt_spread_over_steps_beside_a_stream_gets_its_tokens_alone(tiny_multimodal):
    """Chunks of 16 that split the soft-token run, each run a stage or a few a step beside a
    decoding text stream (budget 3 tokens a step): the same tokens and log-probabilities as
    each prompt alone."""
    from fastgemma import LLM

    params = SamplingParams(max_tokens=48, temperature=0.0, ignore_eos=True, logprobs=3)  # the text stream outlasts the image prompt
    image = {"prompt": "Look: <|image|> What is it?", "multi_modal_data": {"image": [make_image()]}}
    opts = dict(dtype="float32", max_model_len=512, prefill_chunk=16)
    ref = LLM(str(tiny_multimodal), **opts)
    alone = [_tokens_and_logprobs(ref.generate(p, params)[0]) for p in ("Just text", image)]
    llm = LLM(str(tiny_multimodal), **opts, max_num_seqs=2, max_num_batched_tokens=3)
    engine, paused = llm.engine, []
    step = engine.step

    def watched_step():
        out = step()
        paused.append(any(s.prefill is not None for s in engine.scheduler.running))
        return out

    engine.step = watched_step
    together = [_tokens_and_logprobs(o) for o in llm.generate(["Just text", image], params)]
    assert any(paused) and together == alone


def _tokens_and_logprobs(out) -> tuple[list[int], list]:
    return list(out.outputs[0].token_ids), list(out.outputs[0].logprobs)
