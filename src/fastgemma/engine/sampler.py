"""Pick the next token from one position's logits.

First the logits are processed (`process_logits`, only for requests that ask: vLLM's order
and formulas): the stop ids masked until min_tokens; + logit_bias; the repetition penalty r on every token of the prompt or the
output so far (a logit > 0 divided by r, else multiplied by it); then minus
frequency_penalty x its count in the output and presence_penalty where that count is > 0.
Greedy is then `argmax` (ties go to the lowest id, as torch.argmax does). Otherwise:
logits / temperature -> drop tokens below min_p x the top probability -> keep top_k ->
keep the smallest set whose mass reaches top_p -> softmax -> one draw from the request's
own `torch.Generator` (seeded when a seed is given).
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from fastgemma.engine.sampling_params import SamplingParams


def process_logits(
    logits: torch.Tensor,  # [R, V] the rows of a step: row i follows output_ids + draft[:i]
    params: SamplingParams,
    prompt_ids: list[int],
    output_ids: list[int],
    draft: Sequence[int] = (),
    stop_ids: Sequence[int] = (),
    columns: torch.Tensor | None = None,
) -> torch.Tensor:
    """The logits the pick reads [R, V] fp32: the stop ids (end-of-sequence unless ignored,
    stop_token_ids) at -inf in the rows before min_tokens, bias, penalties (module docstring).
    With `columns` (ids ascending [C]), logits [R, C] are those ids' entries and so is the
    result: the same numbers, computed for those ids only."""
    R, V = logits.shape
    x = logits.float().clone()
    dev = x.device

    def at(ids: list[int] | torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """(positions in x's columns, which of ids are there) for token ids."""
        ids = torch.as_tensor(ids, dtype=torch.long, device=dev)
        if columns is None:
            return ids, torch.ones_like(ids, dtype=torch.bool)
        pos = torch.searchsorted(columns, ids).clamp(max=max(V - 1, 0))
        return pos, columns[pos] == ids if V else torch.zeros_like(ids, dtype=torch.bool)

    short = min(R, params.min_tokens - len(output_ids))  # rows still before min_tokens
    if short > 0 and stop_ids:
        pos, there = at(list(stop_ids))
        x[:short, pos[there]] = float("-inf")
    if params.logit_bias:
        pos, there = at(list(params.logit_bias))
        x[:, pos[there]] += torch.tensor(list(params.logit_bias.values()), dtype=x.dtype, device=dev)[there]
    tokens = torch.tensor([*output_ids, *draft], dtype=torch.long, device=dev)
    seen_in_prompt = torch.zeros(V, dtype=torch.bool, device=dev)
    if params.repetition_penalty != 1.0:
        pos, there = at(prompt_ids)
        seen_in_prompt[pos[there]] = True
    for i in range(R):
        if columns is None:
            counts = torch.bincount(tokens[: len(output_ids) + i], minlength=V).to(x.dtype)  # [V]
        else:
            counts = (tokens[: len(output_ids) + i, None] == columns[None, :]).sum(0).to(x.dtype)  # [C]
        row = x[i]
        if params.repetition_penalty != 1.0:
            r = torch.where(seen_in_prompt | (counts > 0), params.repetition_penalty, 1.0)
            row.copy_(torch.where(row > 0, row / r, row * r))
        row -= params.frequency_penalty * counts + params.presence_penalty * (counts > 0).to(x.dtype)
    return x


def changed_ids(
    params: SamplingParams, prompt_ids: list[int], output_ids: list[int], draft: Sequence[int] = (),
    stop_ids: Sequence[int] = (),
) -> list[int]:
    """The ids whose logits `process_logits` may change in any row of the same call, ascending
    (every other id keeps its logit): the masked stop ids, the biased ids, and the prompt's,
    output's and draft's ids under a penalty."""
    ids = set(params.logit_bias or ())
    if min(len(draft) + 1, params.min_tokens - len(output_ids)) > 0:
        ids.update(stop_ids)
    if params.repetition_penalty != 1.0:
        ids.update(prompt_ids)
    if params.repetition_penalty != 1.0 or params.frequency_penalty != 0.0 or params.presence_penalty != 0.0:
        ids.update(output_ids)
        ids.update(draft)
    return sorted(ids)


def filtered_probs(logits: torch.Tensor, params: SamplingParams) -> torch.Tensor:
    """logits: [V] -> the sampling distribution [V] (fp32) after temperature, min-p, top-k, top-p."""
    x = logits.float() / params.temperature
    if params.min_p > 0.0:
        probs = torch.softmax(x, dim=-1)
        x = x.masked_fill(probs < params.min_p * probs.max(), float("-inf"))
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
