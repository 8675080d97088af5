"""Pick the next token from one position's logits.

Greedy is `argmax` (ties go to the lowest id, as torch.argmax does). Otherwise:
logits / temperature -> keep top_k -> keep the smallest set whose mass reaches top_p ->
softmax -> one draw from the request's own `torch.Generator` (seeded when a seed is given).
"""

from __future__ import annotations

import torch

from fastgemma.engine.sampling_params import SamplingParams


def filtered_probs(logits: torch.Tensor, params: SamplingParams) -> torch.Tensor:
    """logits: [V] -> the sampling distribution [V] (fp32) after temperature, top-k, top-p."""
    x = logits.float() / params.temperature
    if params.top_k > 0 and params.top_k < x.shape[-1]:
        kth = torch.topk(x, params.top_k).values[-1]
        x = x.masked_fill(x < kth, float("-inf"))
    if params.top_p < 1.0:
        sorted_x, order = torch.sort(x, descending=True)
        probs = torch.softmax(sorted_x, dim=-1)
        # Drop a token when the mass before it already reaches top_p; the first always stays
        # (a top_p that rounds to 0 in fp32 would otherwise drop every token).
        drop = (probs.cumsum(-1) - probs) >= params.top_p
        drop[0] = False
        x = x.scatter(0, order, sorted_x.masked_fill(drop, float("-inf")))
    return torch.softmax(x, dim=-1)


def sample(logits: torch.Tensor, params: SamplingParams, generator: torch.Generator | None) -> int:
    """logits: [V] -> token id."""
    if params.greedy:
        return int(torch.argmax(logits))
    probs = filtered_probs(logits, params)
    return int(torch.multinomial(probs, 1, generator=generator))
