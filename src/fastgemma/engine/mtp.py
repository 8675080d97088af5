"""MTP drafting: the Gemma 4 assistant proposes K tokens from the target's own state.

`MtpProposer(assistant, target, cache, k).propose(ids, limit, hidden, cache)`: ids[-1] is the last
token (position p = len(ids) - 1, not yet in the cache), `hidden` the target's final hidden
state [D] at p - 1 (the row that predicted ids[-1]; the engine keeps it on the `Sequence`),
`cache` the sequence's own (its slot's; default: the one given at construction).
Then, as transformers' `Gemma4AssistantCandidateGenerator` does:

    kv = target K/V of positions < p            (once per round; models/assistant.py)
    token, h = ids[-1], hidden
    repeat k times:
        y, h = assistant(cat(E_target(token), h), p, kv)    # same position p every time
        token = argmax(lm_head(y))                          # the draft token
    -> the k draft tokens

Drafts are argmaxes, deterministic given the target's state: for sampling they act as
point-mass proposals (q = 1 on the draft), which the rejection sampler handles exactly
(engine/speculative.py). The verification decides what is kept, so the drafter can only
cost time, never change the output.

The one difference from transformers' loop: after a partly rejected verification its
target K/V still holds the rejected tokens' entries, which its next round sees; here a
round sees exactly the accepted context (the cache's rejected slots lie at positions >= p).
"""

from __future__ import annotations

import torch

from fastgemma.models.assistant import Gemma4Assistant
from fastgemma.models.gemma import GemmaForCausalLM
from fastgemma.models.kv_cache import KVCache


class MtpProposer:
    def __init__(self, assistant: Gemma4Assistant, target: GemmaForCausalLM, cache: KVCache, k: int):
        assert k >= 1
        self.assistant, self.target, self.cache, self.k = assistant, target, cache, k

    @torch.inference_mode()
    def propose(
        self, ids: list[int], limit: int | None = None, hidden: torch.Tensor | None = None, cache: KVCache | None = None
    ) -> list[int]:
        """Up to min(k, limit) drafted tokens to follow `ids`."""
        k = self.k if limit is None else min(self.k, limit)
        if k <= 0 or hidden is None:
            return []
        p = len(ids) - 1
        kv = self.assistant.context_kv(self.target.spec, cache or self.cache, p)
        token, h = torch.tensor([ids[-1]], device=hidden.device), hidden[None]  # [1], [1, D]
        drafts = []
        for _ in range(k):
            emb, _ = self.target.embed(token)  # [1, D], scaled
            y, h = self.assistant(torch.cat([emb, h.to(emb.dtype)], dim=-1), p, kv)
            token = torch.argmax(self.assistant.logits(y), dim=-1)  # [1], left on the device
            drafts.append(token)
        return torch.cat(drafts).tolist()  # one host sync per round, not one per draft
