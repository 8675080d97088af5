"""Gemma 4 preprocessing: images and audio clips -> tower inputs, placeholders -> soft-token slots.

Contract: `process(ids, images, audios)` takes a tokenised prompt with one image placeholder
(`<|image|>`) per image and one audio placeholder (`<|audio|>`) per clip, in the order the
media are given, and returns the prompt with each placeholder expanded as transformers'
`Gemma4Processor` expands it, plus the tower inputs (`models.towers.MultimodalInputs`):

    image: <|image|>  ->  <|image> + <|image|> * n + <image|>,  n = pooled patches of the resized image
    audio: <|audio|>  ->  <|audio> + <|audio|> * m + <audio|>,  m = valid mel frames after two
                                                                 stride-2 subsamplings (40 ms each)

Each placeholder is one medium, also where two are adjacent; a run already expanded between
its begin and end tokens to exactly n (m) copies is kept as it is (token-id prompts that went
through the processor elsewhere). Expansion works on ids, not text: special
tokens are never merged with their neighbours, so this equals the processor's text-level
replacement followed by tokenisation, without tokenising twice.

Why not `Gemma4Processor` itself: it always builds a `Gemma4VideoProcessor`, which needs
torchvision, and PyPI's torchvision does not import beside the torch this project pins on
CPU machines. Its image and audio parts need no torchvision, so we use them directly —
`Gemma4ImageProcessorPil` (aspect-preserving bicubic resize to the soft-token budget,
16-px patches, padded to `max_soft_tokens * 9` patches) and `Gemma4AudioFeatureExtractor`
(128-bin log-mel at 16 kHz, 20 ms windows, 10 ms hop) — configured from the checkpoint's
`processor_config.json` / `preprocessor_config.json` when it has one. Video is therefore
not supported (the video processor is the torchvision part).

Each clip is featurised alone (a batch of one): its valid frames are the same as in a
padded batch, the padded frames are masked either way. Clips at other sample rates are
resampled to 16 kHz (scipy's polyphase `resample_poly`); stereo is averaged to mono.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import numpy as np
import torch

from fastgemma.models.towers import MultimodalInputs

MAX_AUDIO_SECONDS = 30.0  # the feature extractor's max_length (480 000 samples at 16 kHz)

AudioClip = tuple[np.ndarray, int]  # (waveform [samples] or [samples, channels], sample rate)


class MultimodalProcessor:
    def __init__(self, folder: Path, hf_config: Any, has_vision: bool, has_audio: bool):
        from transformers.models.gemma4 import Gemma4AudioFeatureExtractor, Gemma4ImageProcessorPil

        self.has_vision, self.has_audio = has_vision, has_audio
        self.image_token_id = hf_config.image_token_id
        self.boi_token_id, self.eoi_token_id = hf_config.boi_token_id, hf_config.eoi_token_id
        self.audio_token_id = hf_config.audio_token_id
        self.boa_token_id, self.eoa_token_id = hf_config.boa_token_id, hf_config.eoa_token_index
        has_config = any((folder / f).is_file() for f in ("processor_config.json", "preprocessor_config.json"))
        if has_config:
            self.image_processor = Gemma4ImageProcessorPil.from_pretrained(folder)
            self.feature_extractor = Gemma4AudioFeatureExtractor.from_pretrained(folder)
        else:
            self.image_processor, self.feature_extractor = Gemma4ImageProcessorPil(), Gemma4AudioFeatureExtractor()
        self.sampling_rate = self.feature_extractor.sampling_rate

    def process(
        self, ids: list[int], images: list[Any] | None = None, audios: list[AudioClip] | None = None
    ) -> tuple[list[int], MultimodalInputs | None]:
        """(prompt ids with soft-token slots, tower inputs); (ids, None) without media."""
        images, audios = list(images or []), list(audios or [])
        if images and not self.has_vision:
            raise ValueError("this model has no vision tower; it cannot take images")
        if audios and not self.has_audio:
            raise ValueError("this model has no audio tower; it cannot take audio")
        inputs = MultimodalInputs()
        image_counts: list[int] = []
        if images:
            out = self.image_processor(images, return_tensors="pt")
            inputs.pixel_values = out["pixel_values"]  # [I, max_patches, 3 * 16 * 16]
            inputs.image_position_ids = out["image_position_ids"]  # [I, max_patches, 2]
            image_counts = [int(n) for n in out["num_soft_tokens_per_image"]]
        audio_counts: list[int] = []
        if audios:
            inputs.audio_features, inputs.audio_masks = [], []
            for i, clip in enumerate(audios):
                wave = self._waveform(clip, i)
                out = self.feature_extractor([wave], sampling_rate=self.sampling_rate, return_tensors="pt")
                mask = out["input_features_mask"]  # [1, F] bool
                inputs.audio_features.append(out["input_features"])  # [1, F, 128]
                inputs.audio_masks.append(mask)
                audio_counts.append(_audio_soft_tokens(mask[0]))
        ids = _expand(ids, self.image_token_id, self.boi_token_id, self.eoi_token_id, image_counts, "image")
        ids = _expand(ids, self.audio_token_id, self.boa_token_id, self.eoa_token_id, audio_counts, "audio")
        return ids, (inputs if images or audios else None)

    def _waveform(self, clip: AudioClip, index: int) -> np.ndarray:
        """A float32 mono waveform at the feature extractor's rate."""
        if not (isinstance(clip, tuple) and len(clip) == 2):
            raise ValueError(f"audio {index}: give (waveform array, sample rate)")
        wave, rate = np.asarray(clip[0]), int(clip[1])
        if wave.ndim == 2:
            wave = wave.mean(axis=1)  # [samples, channels] -> mono
        if wave.ndim != 1 or wave.size == 0:
            raise ValueError(f"audio {index}: expected a non-empty 1-D (or [samples, channels]) waveform")
        if rate <= 0:
            raise ValueError(f"audio {index}: sample rate must be positive, got {rate}")
        if np.issubdtype(wave.dtype, np.integer):
            wave = wave / float(np.iinfo(wave.dtype).max)
        wave = wave.astype(np.float32)
        if wave.size / rate > MAX_AUDIO_SECONDS:
            raise ValueError(f"audio {index}: {wave.size / rate:.1f} s is longer than the {MAX_AUDIO_SECONDS:.0f} s limit")
        if rate != self.sampling_rate:
            from scipy.signal import resample_poly

            g = math.gcd(rate, self.sampling_rate)
            wave = resample_poly(wave, self.sampling_rate // g, rate // g).astype(np.float32)
        if not np.isfinite(wave).all():
            raise ValueError(f"audio {index}: the waveform has NaN or infinite samples")
        return wave


def _audio_soft_tokens(mask: torch.Tensor) -> int:
    """Valid frames after the tower's two stride-2 convolutions (Gemma4Processor.replace_audio_token)."""
    t = len(mask)
    for _ in range(2):
        t_out = (t + 2 - 3) // 2 + 1
        mask = mask[::2][:t_out]
        t = len(mask)
    return int(mask.sum())


def _expand(ids: list[int], token: int, begin: int, end: int, counts: list[int], kind: str) -> list[int]:
    """Replace the k-th placeholder by begin + token * counts[k] + end. Each `token` is one
    placeholder, also next to another (two media with no text between them); a run already
    expanded (between `begin` and `end`, as the processor writes it) is one medium, kept as
    it is when its length is counts[k]."""
    slots, i = [], 0  # (start, end, already expanded) of each medium's placeholder(s)
    while i < len(ids):
        if ids[i] != token:
            i += 1
            continue
        j = i
        while j < len(ids) and ids[j] == token:
            j += 1
        if i > 0 and ids[i - 1] == begin and j < len(ids) and ids[j] == end:
            slots.append((i, j, True))
        else:
            slots += [(k, k + 1, False) for k in range(i, j)]
        i = j
    if len(slots) != len(counts):
        raise ValueError(
            f"the prompt has {len(slots)} {kind} placeholder(s) but {len(counts)} {kind}(s) were given; "
            f"put one {kind} placeholder in the prompt per {kind}"
        )
    out, prev = [], 0
    for (s, e, expanded), n in zip(slots, counts):
        out += ids[prev:s]
        if not expanded:
            out += [begin] + [token] * n + [end]
        elif e - s == n:
            out += ids[s:e]
        else:
            raise ValueError(f"a run of {e - s} {kind} placeholders does not fit a {kind} of {n} soft tokens")
        prev = e
    return out + ids[prev:]
