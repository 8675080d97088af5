"""n-gram (prompt lookup) drafting: propose the tokens that followed the last n tokens before.

`NgramProposer(k, prompt_lookup_min, prompt_lookup_max).propose(ids)`: for n from
`prompt_lookup_max` down to `prompt_lookup_min`, find the most recent earlier occurrence of
the sequence's last n tokens (prompt and output alike) and propose up to k tokens that
followed it; no match, no draft. No weights, no model: the verification step decides what
is kept (engine/speculative.py), so a draft only ever costs time, never correctness.
"""

from __future__ import annotations

import numpy as np


class NgramProposer:
    def __init__(self, k: int, prompt_lookup_min: int, prompt_lookup_max: int):
        assert k >= 1 and 1 <= prompt_lookup_min <= prompt_lookup_max, (k, prompt_lookup_min, prompt_lookup_max)
        self.k, self.min_n, self.max_n = k, prompt_lookup_min, prompt_lookup_max

    def propose(
        self, ids: list[int] | np.ndarray, limit: int | None = None, hidden: object = None, cache: object = None
    ) -> list[int]:
        """Up to min(k, limit) drafted tokens to follow `ids` (`hidden` and `cache`, the MTP
        drafter's inputs, are not used)."""
        k = self.k if limit is None else min(self.k, limit)
        tokens = np.asarray(ids, dtype=np.int64)
        L = tokens.shape[0]
        if k <= 0 or L < self.min_n + 1:
            return []
        for n in range(min(self.max_n, L - 1), self.min_n - 1, -1):
            tail = tokens[L - n :]
            # windows[i] = tokens[i : i + n] for the starts i < L - n (an earlier occurrence)
            windows = np.lib.stride_tricks.sliding_window_view(tokens[: L - 1], n)
            hits = np.flatnonzero((windows == tail).all(axis=1))
            if hits.size:
                start = int(hits[-1]) + n  # the most recent occurrence's continuation
                return tokens[start : start + k].tolist()
        return []
