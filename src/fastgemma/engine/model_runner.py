"""Runs the decoder over the static cache: prefill chunks, decode steps, prompt scoring.

Owns the device-side state of the one running sequence (its `KVCache`) and turns token ids
into logits. Knows nothing of sampling, stopping or text.

- `prefill(ids)`: the prompt in chunks of `prefill_chunk` tokens; logits of the last one.
- `decode(id, position)`: one token through every layer; its logits.
- `decode_greedy(id, position)`: the same step when only its argmax is wanted (greedy, no
  logprobs): the model may pick it through the exact lm_head screen.
- `verify(ids, position, greedy)`: ids [K + 1] (the last token and K drafted ones) at
  positions position.. in one decode-like forward: per row the greedy token (greedy) or the
  logits, each bit for bit what `decode_greedy` / `decode` would give at that position after
  the rows before it (engine/kv_cache.py, models/gemma.py). Needs `num_speculative_tokens`
  spare ring slots, given at construction.
- `prompt_logprobs(ids, top)`: every position's log-softmax (teacher forcing), computed in
  slices so that no [T, V] tensor larger than `logits_chunk` rows exists at once.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from fastgemma.engine.kv_cache import KVCache
from fastgemma.models.gemma import GemmaForCausalLM


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
    ):
        self.model, self.max_model_len = model, max_model_len
        self.device = model.embed_tokens.weight.device
        self.prefill_chunk, self.logits_chunk = prefill_chunk, logits_chunk
        self.cache = KVCache(model.spec, max_model_len, model.dtype, self.device, num_speculative_tokens)

    def _ids(self, ids: list[int]) -> torch.Tensor:
        return torch.tensor(ids, dtype=torch.long, device=self.device)

    def _forward(self, ids: list[int], start: int, keep: torch.Tensor | None, decode_like: bool = False) -> torch.Tensor:
        meta = self.cache.metadata(start, len(ids), decode_like)
        embeds, ple_ids = self.model.embed(self._ids(ids))
        return self.model(embeds, ple_ids, meta, self.cache, keep)

    @torch.inference_mode()
    def prefill(self, ids: list[int], start: int = 0) -> torch.Tensor:
        """Write ids (positions start..) into the cache; return the last position's logits [V]."""
        hidden = None
        for s in range(0, len(ids), self.prefill_chunk):
            chunk = ids[s : s + self.prefill_chunk]
            last = torch.tensor([len(chunk) - 1], device=self.device)
            hidden = self._forward(chunk, start + s, last)
        assert hidden is not None, "prefill of an empty prompt"
        return self.model.compute_logits(hidden)[0]

    @torch.inference_mode()
    def decode(self, token_id: int, position: int) -> torch.Tensor:
        hidden = self._forward([token_id], position, None)  # [1, D]
        return self.model.compute_logits(hidden)[0]

    @torch.inference_mode()
    def decode_greedy(self, token_id: int, position: int) -> int:
        hidden = self._forward([token_id], position, None)  # [1, D]
        return self.model.greedy_tokens(hidden)[0]

    @torch.inference_mode()
    def verify(self, ids: list[int], position: int, greedy: bool) -> list[int] | torch.Tensor:
        """Greedy tokens [len(ids)] or logits [len(ids), V] after each of ids at position.."""
        hidden = self._forward(ids, position, None, decode_like=True)  # [K + 1, D]
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
