"""Teacher-forced perplexity of a loaded `LLM` over challenge-style PPL records, in process.

A record is `{"context_token_ids": [...], "target_token_ids": [...]}`; the prompt is
context + target and only the target positions are scored. PPL = exp(sum NLL / number of
target tokens), token-weighted over all records (the challenge's definition).
"""

from __future__ import annotations

import json
import math
from pathlib import Path


def load_ppl_records(path: Path, n: int | None = None) -> list[dict]:
    """The first `n` records (all when None); errors name the file and the line."""
    try:
        lines = path.read_text().splitlines()
    except (OSError, ValueError) as e:
        raise ValueError(f"cannot read PPL records from {path}: {e}") from e
    records = []
    for number, line in enumerate(lines, start=1):
        if not line.strip():
            continue
        try:
            r = json.loads(line)
            if not (isinstance(r["context_token_ids"], list) and isinstance(r["target_token_ids"], list)):
                raise TypeError
        except (ValueError, KeyError, TypeError):
            raise ValueError(f"cannot read PPL records from {path}: line {number} must be a JSON object with "
                             "\"context_token_ids\" and \"target_token_ids\" lists") from None
        records.append(r)
    if not records:
        raise ValueError(f"{path} holds no PPL records")
    return records[:n] if n is not None else records


def perplexity(llm, records: list[dict]) -> tuple[float, int]:
    """(PPL, number of target tokens scored)."""
    nll, count = 0.0, 0
    for r in records:
        ctx, tgt = list(r["context_token_ids"]), list(r["target_token_ids"])
        scores = llm.prompt_logprobs(ctx + tgt)
        for entry in scores[len(ctx) :]:
            nll -= entry.logprob
            count += 1
    return math.exp(nll / max(count, 1)), count
