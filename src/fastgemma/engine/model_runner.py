"""Runs the decoder over the static cache: prefill chunks, decode steps, prompt scoring.

Owns the device-side state of the one running sequence (its `KVCache`) and turns token ids
into logits. Knows nothing of sampling, stopping or text.

- `prefill(ids, multimodal=None)`: the prompt in chunks of `prefill_chunk` tokens; logits
  of the last one. Media (a multimodal Gemma 4) go through the towers once, first.
- `decode(id, position)`: one token through every layer; its logits.
- `decode_greedy(id, position)`: the same step when only its argmax is wanted (greedy, no
  logprobs): the model may pick it through the exact lm_head screen.
- `verify(ids, position, greedy)`: ids [K + 1] (the last token and K drafted ones) at
  positions position.. in one decode-like forward: per row the greedy token (greedy) or the
  logits, each bit for bit what `decode_greedy` / `decode` would give at that position after
  the rows before it (models/kv_cache.py, models/gemma.py). Needs `num_speculative_tokens`
  spare ring slots, given at construction.
- `last_hidden`: the final (normed) hidden rows behind the last prefill's, decode's or
  verification's logits, for drafters that read the target's state (engine/mtp.py).
- `prompt_logprobs(ids, top)`: every position's log-softmax (teacher forcing), computed in
  slices so that no [T, V] tensor larger than `logits_chunk` rows exists at once.

With `static_steps` (CUDA with kernels=auto), decode, decode_greedy and verify all run the
fixed-shape step of engine/static_step.py (a CUDA graph unless `enforce_eager`); prefill and
scoring stay as above. The cache then has a scratch slot per buffer.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from fastgemma.engine.static_step import StaticStep
from fastgemma.models.gemma import GemmaForCausalLM
from fastgemma.models.kv_cache import KVCache
from fastgemma.models.towers import MultimodalInputs, MultimodalTowers


@dataclass
class PositionLogprob:
    """The log-probability of the actual token at one prompt position, its rank and the top list."""

    logprob: float
    rank: int  # 1 = the most likely token
    top: list[tuple[int, float]]  # (token id, logprob), most likely first


class ModelRunner:
    def __init__(
        self,
        model: GemmaForCausalLM,
        max_model_len: int,
        prefill_chunk: int = 512,
        logits_chunk: int = 128,
        num_speculative_tokens: int = 0,
        towers: MultimodalTowers | None = None,
        static_steps: bool = False,
        enforce_eager: bool = False,
    ):
        self.model, self.max_model_len = model, max_model_len
        self.towers = towers  # Gemma 4 vision / audio towers: run at prefill only
        self.device = model.embed_tokens.weight.device
        self.prefill_chunk, self.logits_chunk = prefill_chunk, logits_chunk
        self.cache = KVCache(
            model.spec, max_model_len, model.dtype, self.device, num_speculative_tokens, scratch_slot=static_steps
        )
        self.static = StaticStep(model, self.cache, use_graph=not enforce_eager) if static_steps else None
        self.last_hidden: torch.Tensor | None = None  # [T, D] normed hidden rows of the last prefill / decode / verify

    def _ids(self, ids: list[int]) -> torch.Tensor:
        return torch.tensor(ids, dtype=torch.long, device=self.device)

    def _forward(
        self,
        ids: list[int],
        start: int,
        keep: torch.Tensor | None,
        decode_like: bool = False,
        soft: tuple[torch.Tensor, torch.Tensor] | None = None,  # this chunk's (soft_embeds [N, D], soft_mask [T])
    ) -> torch.Tensor:
        meta = self.cache.metadata(start, len(ids), decode_like)
        embeds, ple_ids = self.model.embed(self._ids(ids), *(soft or ()))
        return self.model(embeds, ple_ids, meta, self.cache, keep)

    @torch.inference_mode()
    def prefill(self, ids: list[int], start: int = 0, multimodal: MultimodalInputs | None = None) -> torch.Tensor:
        """Write ids (positions start..) into the cache; return the last position's logits [V].
        With `multimodal`, the towers run first and their soft tokens replace the
        placeholders' embeddings (models/towers.py), chunk by chunk."""
        hidden, soft_embeds, soft_mask = None, None, None
        if multimodal is not None:
            assert self.towers is not None, "multimodal inputs for a model without towers"
            soft_embeds, soft_mask = self.towers.soft_embeddings(self._ids(ids), multimodal)  # [N, D], [T]
            before = torch.cumsum(soft_mask, 0) - soft_mask.long()  # [T] soft rows before each position
        for s in range(0, len(ids), self.prefill_chunk):
            chunk = ids[s : s + self.prefill_chunk]
            last = torch.tensor([len(chunk) - 1], device=self.device)
            soft = None
            if soft_mask is not None and (mask := soft_mask[s : s + len(chunk)]).any():
                first = int(before[s])
                soft = (soft_embeds[first : first + int(mask.sum())], mask)
            hidden = self._forward(chunk, start + s, last, soft=soft)
        assert hidden is not None, "prefill of an empty prompt"
        self.last_hidden = hidden
        return self.model.compute_logits(hidden)[0]

    @torch.inference_mode()
    def decode(self, token_id: int, position: int) -> torch.Tensor:
        return self.verify([token_id], position, greedy=False)[0]

    @torch.inference_mode()
    def decode_greedy(self, token_id: int, position: int) -> int:
        return self.verify([token_id], position, greedy=True)[0]

    @torch.inference_mode()
    def verify(self, ids: list[int], position: int, greedy: bool) -> list[int] | torch.Tensor:
        """Greedy tokens [len(ids)] or logits [len(ids), V] after each of ids at position.."""
        if self.static is not None:
            out = self.static.run(ids, position, want_logits=not greedy)
            self.last_hidden = out.hidden
            return out.tokens if greedy else out.logits
        hidden = self.last_hidden = self._forward(ids, position, None, decode_like=True)  # [K + 1, D]
        return self.model.greedy_tokens(hidden) if greedy else self.model.compute_logits(hidden)

    @torch.inference_mode()
    def prompt_logprobs(self, ids: list[int], top: int = 0) -> list[PositionLogprob | None]:
        """Entry i scores ids[i] given ids[:i]; entry 0 is None (nothing to condition on)."""
        out: list[PositionLogprob | None] = [None]
        for s in range(0, len(ids), self.prefill_chunk):
            chunk = ids[s : s + self.prefill_chunk]
            hidden = self._forward(chunk, s, None)  # [T, D]
            for h0 in range(0, hidden.shape[0], self.logits_chunk):
                rows = hidden[h0 : h0 + self.logits_chunk]
                targets = ids[s + h0 + 1 : s + h0 + 1 + rows.shape[0]]
                if not targets:
                    break
                rows = rows[: len(targets)]
                logp = torch.log_softmax(self.model.compute_logits(rows).float(), dim=-1)  # [n, V]
                tgt = self._ids(targets)
                chosen = logp.gather(1, tgt[:, None])[:, 0]  # [n]
                ranks = (logp > chosen[:, None]).sum(-1) + 1
                tops = torch.topk(logp, top, dim=-1) if top > 0 else None
                for j in range(len(targets)):
                    top_list = (
                        list(zip(tops.indices[j].tolist(), tops.values[j].tolist())) if tops is not None else []
                    )
                    out.append(PositionLogprob(float(chosen[j]), int(ranks[j]), top_list))
        return out
