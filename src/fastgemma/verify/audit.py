"""Stage audit: capture the served greedy token ids for token-id prompts.

Each audit prompt goes to `/v1/completions` as an integer list with `max_tokens` = output len,
temperature 0, `ignore_eos`, `add_special_tokens: false`, `return_token_ids: true`; the
generated ids are read from `choices[0].token_ids` (the challenge's audit request).

The prompts are token ids from the PPL data, so no tokenizer is needed on this side: the
challenge's prompt and PPL files share ids, and each record's `context_token_ids` is that
prompt's chat-formatted first turn. `audit_prompts` takes the records whose ids match the
public sample, in its order, and fills up with the remaining records in file order when the
files do not match.
"""

from __future__ import annotations

from dataclasses import dataclass

from tqdm import tqdm

from fastgemma.verify.client import Client
from fastgemma.verify.data import PplRecord, Prompt


@dataclass(frozen=True)
class AuditPrompt:
    key: str
    prompt_token_ids: list[int]


@dataclass(frozen=True)
class Captured:
    key: str
    prompt_token_ids: list[int]
    token_ids: list[int]  # what the server generated
    latency_s: float


def audit_prompts(public: list[Prompt], records: list[PplRecord], n: int) -> list[AuditPrompt]:
    by_key = {r.key: r for r in records}
    chosen = [by_key[p.key] for p in public if p.key in by_key][:n]
    taken = {r.key for r in chosen}
    chosen += [r for r in records if r.key not in taken][: n - len(chosen)]
    return [AuditPrompt(r.key, r.context_token_ids) for r in chosen]


def run_audit(client: Client, model: str, prompts: list[AuditPrompt], output_len: int,
              progress: bool = True) -> list[Captured]:
    out = []
    for p in tqdm(prompts, desc="audit: capture greedy ids", unit="req", disable=not progress, leave=False):
        reply = client.complete_ids("audit", model, p.prompt_token_ids, output_len)
        out.append(Captured(p.key, p.prompt_token_ids, reply.token_ids, reply.latency_s))
    return out
