"""Speculative decoding: which drafted tokens a verification keeps, and how often they are kept.

A step with a draft d_1..d_K runs the target once over [last token, d_1, ..., d_K]
(`ModelRunner.verify`), which gives the target's next-token logits after each of those
K + 1 positions: row i is what a plain decode step would compute after d_1..d_i.

Greedy (`accept_greedy`): keep the longest prefix of the draft that equals the target's
argmax row by row, then add the target's own token at the first mismatch (or after the last
draft token). Why the output is token-identical to plain greedy decoding, by construction:
row i of the verification is bit for bit the logits (or screened argmax) a one-token decode
step computes at that position — the same kernels with row-invariant reductions, every
query attending alone over the same keys in the same order (models/kv_cache.py,
kernels/cpu_decode_layer.c, models/gemma.py) — so while the draft agrees with the target,
the kept tokens are exactly the plain path's, and the first disagreement is replaced by the
plain path's token. The K/V written for rejected tokens sit at positions that are written
again before any query can see them.

Sampling (`accept_sampled`): standard speculative rejection sampling (Leviathan et al.,
Chen et al.). Draft token d_i, proposed with probability q_i(d_i) (n-gram drafts: q = 1 on
d_i), is kept with probability min(1, p_i(d_i) / q_i(d_i)), p_i the target's sampling
distribution (temperature, top-k, top-p applied); at the first rejection a token is drawn
from normalise(max(p_i - q_i, 0)); when every draft token is kept, one more is drawn from
p_{K+1}. Each emitted token is then distributed exactly as under plain sampling (the random
stream differs, so a seed reproduces a speculative run, not a plain one).

`SpecStats` counts drafts and kept tokens in vLLM's terms: mean acceptance length =
1 + accepted / drafts (tokens emitted per verification), and acceptance per draft position
(of the drafts that reached position i, the fraction whose i-th token was kept).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from fastgemma.engine.sampler import filtered_probs, sample
from fastgemma.engine.sampling_params import SamplingParams


def accept_greedy(draft: list[int], targets: list[int]) -> list[int]:
    """targets[i]: the target's greedy token after position i of the verification
    [len(draft) + 1] -> the tokens to emit (1 to len(draft) + 1)."""
    n = 0
    while n < len(draft) and draft[n] == targets[n]:
        n += 1
    return list(targets[: n + 1])


def accept_sampled(
    draft: list[int],
    logits: torch.Tensor,  # [len(draft) + 1, V] the verification's rows
    params: SamplingParams,
    generator: torch.Generator | None,
    draft_probs: torch.Tensor | None = None,  # [len(draft), V] q_i; None: deterministic drafts (q = 1 on d_i)
) -> list[int]:
    """The tokens to emit under rejection sampling (see the module docstring)."""
    out: list[int] = []
    for i, d in enumerate(draft):
        p = filtered_probs(logits[i], params)
        q_d = 1.0 if draft_probs is None else float(draft_probs[i, d])
        u = float(torch.rand((), generator=generator, device=p.device))
        if u * q_d < float(p[d]):  # u < p(d) / q(d), without dividing by a zero q
            out.append(d)
            continue
        if draft_probs is None:
            residual = p.clone()
            residual[d] = 0.0
        else:
            residual = (p - draft_probs[i].to(p.dtype)).clamp(min=0.0)
        if float(residual.sum()) <= 0.0:  # p == q: any rejection is measure-zero; draw from p
            residual = p
        out.append(int(torch.multinomial(residual / residual.sum(), 1, generator=generator)))
        return out
    out.append(sample(logits[len(draft)], params, generator))
    return out


@dataclass
class SpecStats:
    """Drafting counters of one engine (all requests since start)."""

    num_drafts: int = 0  # verifications that carried at least one drafted token
    num_draft_tokens: int = 0
    num_accepted_tokens: int = 0
    accepted_per_position: list[int] = field(default_factory=list)  # [K]: drafts whose i-th token was kept
    drafted_per_position: list[int] = field(default_factory=list)  # [K]: drafts that had an i-th token

    def record(self, num_draft: int, num_accepted: int) -> None:
        self.num_drafts += 1
        self.num_draft_tokens += num_draft
        self.num_accepted_tokens += num_accepted
        grow = num_draft - len(self.drafted_per_position)
        if grow > 0:
            self.accepted_per_position += [0] * grow
            self.drafted_per_position += [0] * grow
        for i in range(num_draft):
            self.drafted_per_position[i] += 1
        for i in range(num_accepted):
            self.accepted_per_position[i] += 1

    @property
    def mean_acceptance_length(self) -> float:
        """Tokens emitted per verification that had a draft (1 = nothing kept)."""
        return 1.0 + self.num_accepted_tokens / self.num_drafts if self.num_drafts else 0.0

    @property
    def acceptance_rate(self) -> float:
        return self.num_accepted_tokens / self.num_draft_tokens if self.num_draft_tokens else 0.0

    def as_dict(self) -> dict:
        per_pos = [a / d for a, d in zip(self.accepted_per_position, self.drafted_per_position) if d]
        return {
            "num_drafts": self.num_drafts, "num_draft_tokens": self.num_draft_tokens,
            "num_accepted_tokens": self.num_accepted_tokens,
            "mean_acceptance_length": round(self.mean_acceptance_length, 4),
            "acceptance_rate": round(self.acceptance_rate, 4),
            "acceptance_per_position": [round(x, 4) for x in per_pos],
        }

    def since(self, before: SpecStats) -> SpecStats:
        """The counts accumulated after the snapshot `before` (a copy taken with `snapshot`)."""

        def minus(now: list[int], then: list[int]) -> list[int]:
            return [n - (then[i] if i < len(then) else 0) for i, n in enumerate(now)]

        return SpecStats(
            self.num_drafts - before.num_drafts, self.num_draft_tokens - before.num_draft_tokens,
            self.num_accepted_tokens - before.num_accepted_tokens,
            minus(self.accepted_per_position, before.accepted_per_position),
            minus(self.drafted_per_position, before.drafted_per_position),
        )

    def snapshot(self) -> SpecStats:
        return SpecStats(
            self.num_drafts, self.num_draft_tokens, self.num_accepted_tokens, list(self.accepted_per_position),
            list(self.drafted_per_position),
        )
