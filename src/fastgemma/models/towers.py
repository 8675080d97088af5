"""Gemma 4's vision and audio towers and their embedders: media features -> soft tokens [N, D].

transformers' own modules (`Gemma4VisionModel`, `Gemma4AudioModel`,
`Gemma4MultimodalEmbedder`), built from the checkpoint's `vision_config` / `audio_config`
and filled with its `vision_tower.*`, `embed_vision.*`, `audio_tower.*`, `embed_audio.*`
tensors. They run once per request, at prefill; the decode hot path never touches them, so
reusing the reference modules costs nothing per token and is exact by construction. The
audio tower runs with eager attention (its chunked attention exists in eager only); the
vision tower with eager in fp32 (bit-identical to the reference there, where SDPA's other
summation order, ~1e-6 in the soft tokens, grew to ~7e-5 in the tiny test model's logits)
and with SDPA, transformers' default, in lower precisions, where eager's fp32 softmax over
every patch pair is most of an image's cost (a 280-token image on 2 cores: 8.2 s to the
first token with eager, 4.7 s with SDPA; benchmarks/results/prefix-cache-image-cpu.txt).
This module computes what `Gemma4Model.forward` merges, in the same order:

    image: vision_tower(pixel_values [I, P, 3*p*p], position_ids [I, P, 2]) -> [n_valid, Dv]
           -> embed_vision (weightless RMSNorm + Linear) -> [n_valid, D]
    audio: audio_tower(features [1, F, 128], mask [1, F]) -> [1, F/4, Da], mask [1, F/4]
           -> embed_audio -> [1, F/4, D] -> rows where the tower's mask is True -> [n_valid, D]

`soft_embeddings(ids, inputs)` lays them out in prompt order (image rows at the image
placeholder id, audio rows at the audio placeholder id), ready for
`GemmaForCausalLM.embed(ids, soft_embeds, soft_mask)`, which puts the pad id under them for
the per-layer embeddings, as transformers does. Soft tokens are not scaled by sqrt(D).

Owns no preprocessing (multimodal/processor.py) and no decoder.
"""

from __future__ import annotations

import copy
import hashlib
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

TOWER_PREFIXES = ("vision_tower.", "embed_vision.", "audio_tower.", "embed_audio.")


@dataclass
class MultimodalInputs:
    """Preprocessed media of one prompt (multimodal/processor.py), in prompt order per kind."""

    pixel_values: torch.Tensor | None = None  # [I, max_patches, 3 * patch^2], fp32 in [0, 1]
    image_position_ids: torch.Tensor | None = None  # [I, max_patches, 2]; (-1, -1) = padding
    audio_features: list[torch.Tensor] | None = None  # per clip [1, F, mel bins]
    audio_masks: list[torch.Tensor] | None = None  # per clip [1, F] bool, True = real audio

    @property
    def num_images(self) -> int:
        return 0 if self.pixel_values is None else self.pixel_values.shape[0]

    @property
    def num_audios(self) -> int:
        return len(self.audio_features or [])

    def digest(self) -> bytes:
        """SHA-256 of every tensor here (shape, dtype and bytes): equal for equal media."""
        h = hashlib.sha256()
        tensors = [self.pixel_values, self.image_position_ids, *(self.audio_features or []), *(self.audio_masks or [])]
        for t in tensors:
            if t is None:
                h.update(b"none")
                continue
            t = t.detach().contiguous().cpu()
            h.update(f"{tuple(t.shape)} {t.dtype};".encode())
            h.update(t.view(torch.uint8).numpy().tobytes())
        return h.digest()


class MultimodalTowers(nn.Module):
    def __init__(self, hf_config: Any, vision_attention: str = "eager"):
        super().__init__()
        from transformers.initialization import no_init_weights
        from transformers.models.gemma4.modeling_gemma4 import (
            Gemma4AudioModel,
            Gemma4MultimodalEmbedder,
            Gemma4VisionModel,
        )

        text = hf_config.get_text_config()
        self.image_token_id = getattr(hf_config, "image_token_id", None)
        self.video_token_id = getattr(hf_config, "video_token_id", None)
        self.audio_token_id = getattr(hf_config, "audio_token_id", None)
        self.hidden_size = text.hidden_size
        # E2B / E4B attend causally over images; the larger Gemma 4s attend bidirectionally
        # within an image ("vision"), which our causal engine does not do.
        self.bidirectional_vision = getattr(text, "use_bidirectional_attention", None) in ("vision", "all")
        self.vision_tower = self.embed_vision = self.audio_tower = self.embed_audio = None
        with no_init_weights():  # every parameter comes from the checkpoint
            if hf_config.vision_config is not None:
                self.vision_tower = Gemma4VisionModel(_with_attention(hf_config.vision_config, vision_attention))
                self.embed_vision = Gemma4MultimodalEmbedder(hf_config.vision_config, text)
            if hf_config.audio_config is not None:
                self.audio_tower = Gemma4AudioModel(_with_attention(hf_config.audio_config, "eager"))
                self.embed_audio = Gemma4MultimodalEmbedder(hf_config.audio_config, text)

    @property
    def has_vision(self) -> bool:
        return self.vision_tower is not None

    @property
    def has_audio(self) -> bool:
        return self.audio_tower is not None

    @property
    def dtype(self) -> torch.dtype:
        return next(self.parameters()).dtype

    @property
    def device(self) -> torch.device:
        return next(self.parameters()).device

    def image_embeddings(self, pixel_values: torch.Tensor, position_ids: torch.Tensor) -> torch.Tensor:
        """[I, P, 3*p*p], [I, P, 2] -> [sum of valid pooled tokens, D], images in order."""
        assert self.vision_tower is not None and self.embed_vision is not None
        out = self.vision_tower(
            pixel_values=pixel_values.to(self.device, self.dtype), pixel_position_ids=position_ids.to(self.device)
        )
        return self.embed_vision(inputs_embeds=out.last_hidden_state)  # padding already stripped

    def audio_embeddings(self, features: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        """[1, F, bins], [1, F] -> [valid tokens, D] (the tower's own output mask decides)."""
        assert self.audio_tower is not None and self.embed_audio is not None
        out = self.audio_tower(features.to(self.device, self.dtype), mask.to(self.device), return_dict=True)
        embeds = self.embed_audio(inputs_embeds=out.last_hidden_state)  # [1, F', D]
        return embeds[out.attention_mask.to(embeds.device)]  # [valid, D]

    def placeholders(self, ids: torch.Tensor) -> torch.Tensor:
        """ids [T] -> soft_mask [T] bool: the positions the towers' rows go to."""
        return (ids == self.image_token_id) | (ids == self.audio_token_id)

    def soft_embeddings(self, ids: torch.Tensor, inputs: MultimodalInputs) -> tuple[torch.Tensor, torch.Tensor]:
        """ids [T] -> (soft_embeds [N, D] in prompt order, soft_mask [T] bool with N True)."""
        is_image = ids == self.image_token_id
        soft_mask = self.placeholders(ids)
        kinds = is_image[soft_mask]  # [N]: True = an image row, False = an audio row
        soft = torch.empty(int(soft_mask.sum()), self.hidden_size, dtype=self.dtype, device=self.device)
        if inputs.num_images:
            rows = self.image_embeddings(inputs.pixel_values, inputs.image_position_ids)
            _check_count("image", rows.shape[0], int(kinds.sum()))
            soft[kinds.to(soft.device)] = rows
        if inputs.num_audios:
            rows = torch.cat([self.audio_embeddings(f, m) for f, m in zip(inputs.audio_features, inputs.audio_masks)])
            _check_count("audio", rows.shape[0], int((~kinds).sum()))
            soft[~kinds.to(soft.device)] = rows
        return soft, soft_mask


def _with_attention(config: Any, implementation: str) -> Any:
    config = copy.deepcopy(config)
    config._attn_implementation = implementation
    return config


def _check_count(kind: str, produced: int, placeholders: int) -> None:
    if produced != placeholders:
        raise ValueError(f"the {kind} tower produced {produced} soft tokens for {placeholders} {kind} placeholders")


def load_towers(
    hf_config: Any, tensors: Mapping[str, torch.Tensor], dtype: torch.dtype, device: torch.device
) -> MultimodalTowers | None:
    """The towers of a multimodal checkpoint (None when its config has neither), from
    `tensors` keyed by tower names (`vision_tower.…`, `embed_vision.…`, ...), in `dtype`
    (which picks the vision tower's attention: module docstring)."""
    if getattr(hf_config, "vision_config", None) is None and getattr(hf_config, "audio_config", None) is None:
        return None
    towers = MultimodalTowers(hf_config, vision_attention="eager" if dtype == torch.float32 else "sdpa")
    expected = towers.state_dict()
    missing = sorted(set(expected) - set(tensors))
    if missing:
        shown = ", ".join(missing[:6]) + (f", ... ({len(missing)} in all)" if len(missing) > 6 else "")
        raise ValueError(f"checkpoint is missing tensors the vision / audio towers need: {shown}")
    state = {}
    for key, want in expected.items():
        value = tensors[key]
        if value.shape != want.shape:
            raise ValueError(f"tensor {key} has shape {tuple(value.shape)}, the config implies {tuple(want.shape)}")
        state[key] = value.to(device=device, dtype=dtype if value.is_floating_point() else value.dtype)
    towers.load_state_dict(state, strict=True, assign=True)
    return towers.requires_grad_(False).to(device).eval()
