"""Placeholder expansion, prompt forms and input checks of the Gemma 4 preprocessing."""

from __future__ import annotations

import re

import numpy as np
import pytest
import torch

from fastgemma.multimodal.processor import _audio_soft_tokens
from tests.media_samples import make_clip, make_image

IMAGE = make_image()


def test_image_expansion_equals_the_processors_text_replacement(mm_llm):
    """Gemma4Processor replaces <|image|> in the text by <|image> + <|image|> * n + <image|>
    and tokenises; we expand ids. Both must give the same prompt."""
    hf, p = mm_llm.tokenizer.hf, mm_llm.processor
    ids, mm = mm_llm.encode_inputs({"prompt": "A <|image|> and <|image|>.", "multi_modal_data": {"image": [make_image(), make_image(90, 30, seed=3)]}})
    counts = [int(n) for n in p.image_processor([make_image(), make_image(90, 30, seed=3)])["num_soft_tokens_per_image"]]
    text = "A " + "<|image>" + "<|image|>" * counts[0] + "<image|>" + " and " + "<|image>" + "<|image|>" * counts[1] + "<image|>."
    assert ids == hf.encode(text)
    assert mm.pixel_values.shape[0] == 2 and ids.count(p.image_token_id) == sum(counts)


def test_audio_expansion_counts_subsampled_valid_frames(mm_llm):
    p = mm_llm.processor
    ids, mm = mm_llm.encode_inputs({"prompt": "<|audio|>", "multi_modal_data": {"audio": [(make_clip(1.0), 16000)]}})
    n = _audio_soft_tokens(mm.audio_masks[0][0])
    assert n == 25  # 1 s at 40 ms per soft token
    assert ids == [2, p.boa_token_id] + [p.audio_token_id] * n + [p.eoa_token_id]
    # the tower produces exactly that many rows
    with torch.inference_mode():
        assert mm_llm.runner.towers.audio_embeddings(mm.audio_features[0], mm.audio_masks[0]).shape[0] == n


def test_token_id_prompts_and_pre_expanded_runs(mm_llm):
    p = mm_llm.processor
    image = make_image()
    ids, _ = mm_llm.encode_inputs({"prompt": "x <|image|>", "multi_modal_data": {"image": image}})
    raw = mm_llm.tokenizer.encode("x <|image|>")
    again, _ = mm_llm.encode_inputs({"prompt_token_ids": raw, "multi_modal_data": {"image": [image]}})
    assert again == ids
    kept, _ = mm_llm.encode_inputs({"prompt_token_ids": ids, "multi_modal_data": {"image": [image]}})
    assert kept == ids  # already expanded: left as it is
    assert ids.count(p.boi_token_id) == 1


def test_resampled_audio_gives_the_same_number_of_soft_tokens(mm_llm):
    a, _ = mm_llm.encode_inputs({"prompt": "<|audio|>", "multi_modal_data": {"audio": [(make_clip(2.0, 16000), 16000)]}})
    b, mm = mm_llm.encode_inputs({"prompt": "<|audio|>", "multi_modal_data": {"audio": [(make_clip(2.0, 44100), 44100)]}})
    assert len(a) == len(b)
    stereo = np.stack([make_clip(1.0), make_clip(1.0, seed=1)], axis=1)  # [samples, 2]
    c, _ = mm_llm.encode_inputs({"prompt": "<|audio|>", "multi_modal_data": {"audio": [(stereo, 16000)]}})
    assert c.count(mm_llm.processor.audio_token_id) == 25


@pytest.mark.parametrize(
    "prompt,data,needle",
    [
        ({"prompt": "no placeholder"}, {"image": [IMAGE]}, "0 image placeholder(s) but 1 image(s)"),
        ({"prompt": "<|image|> <|image|>"}, {"image": [IMAGE]}, "2 image placeholder(s) but 1"),
        ({"prompt": "<|audio|>"}, {"audio": [(np.zeros(16000 * 31, np.float32), 16000)]}, "30 s limit"),
        ({"prompt": "<|audio|>"}, {"audio": [np.zeros(10)]}, "give (waveform array, sample rate)"),
        ({"prompt": "<|image|>"}, {"video": [1]}, "multi_modal_data takes image and audio"),
        ({"prompt": "a", "prompt_token_ids": [2]}, {}, "exactly one of"),
    ],
)
def test_bad_multimodal_prompts_are_value_errors(mm_llm, prompt, data, needle):
    with pytest.raises(ValueError, match=re.escape(needle)):
        mm_llm.encode_inputs({**prompt, "multi_modal_data": data})


def test_text_only_model_refuses_media(tiny_text_model):
    from fastgemma import LLM

    llm = LLM(str(tiny_text_model), dtype="float32")
    assert llm.processor is None
    with pytest.raises(ValueError, match="this model has no vision tower"):
        llm.generate({"prompt": "<|image|>", "multi_modal_data": {"image": [make_image()]}})
    with pytest.raises(ValueError, match="this model has no audio tower"):
        llm.encode_inputs({"prompt": "x", "multi_modal_data": {"audio": [(make_clip(), 16000)]}})


def test_two_media_with_no_text_between_them(mm_llm):
    """content: [image, image] and [clip, clip]: each part its own placeholder and soft tokens."""
    import base64

    from tests.media_samples import png_bytes, wav_bytes

    image = {"type": "image_url", "image_url": {"url": "data:image/png;base64," + base64.b64encode(png_bytes(IMAGE)).decode()}}
    clip = {"type": "input_audio", "input_audio": {"data": base64.b64encode(wav_bytes(make_clip(1.0))).decode(), "format": "wav"}}
    p = mm_llm.processor
    ids, mm = mm_llm.chat_inputs([{"role": "user", "content": [image, image]}])
    assert ids.count(p.boi_token_id) == 2 and len(mm.pixel_values) == 2
    ids, mm = mm_llm.chat_inputs([{"role": "user", "content": [clip, clip, {"type": "text", "text": "Same?"}]}])
    assert ids.count(p.audio_token_id) == 2 * 25 and len(mm.audio_features) == 2
