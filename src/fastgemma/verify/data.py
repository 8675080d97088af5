"""The verifier's inputs: sharegpt prompt files, PPL token records, reference outputs.

Owns reading and validating files and choosing the prompt samples; it knows nothing about
HTTP or models. Every problem with a file raises `ValueError` naming the file, the item or
line and what to fix, before any request is sent.

Prompt sampling follows sglang `bench_serving` (v0.5.2) for `--dataset-name sharegpt`:
items with at least two conversation turns, the first turn's text as the prompt,
`random.seed(seed); random.shuffle(items)`, then the first N. The private held-out split
(used when no private prompt file is given) is the last M of that same shuffled order, so
it never shares a prompt with the public sample.
"""

from __future__ import annotations

import json
import random
from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class Prompt:
    key: str  # the item's "id" when it has one, else "index:<position in the file>"
    text: str  # the first conversation turn, sent as one user message


@dataclass(frozen=True)
class PplRecord:
    key: str  # the record's "id"
    context_token_ids: list[int]  # conditioning tokens (their logprobs are not scored)
    target_token_ids: list[int]  # scored tokens: PPL = exp(mean NLL over these)


def _read_text(path: Path, what: str) -> str:
    try:
        return Path(path).read_text(encoding="utf-8")
    except OSError as e:
        raise ValueError(f"cannot read the {what} file {path}: {e.strerror or e}") from None
    except UnicodeDecodeError:
        raise ValueError(f"the {what} file {path} is not UTF-8 text") from None


def load_prompts(path: Path) -> list[Prompt]:
    """sharegpt JSON: a list of {"id"?, "conversations": [{"from", "value"}, ...]}.

    Keeps the items with two or more turns (as bench_serving does); each item's first turn
    must be a non-empty string. Raises ValueError for anything else, or when none remain.
    """
    try:
        items = json.loads(_read_text(path, "prompts"))
    except json.JSONDecodeError as e:
        raise ValueError(f"the prompts file {path} is not JSON ({e.msg} at line {e.lineno})") from None
    if not isinstance(items, list):
        raise ValueError(f"the prompts file {path} must hold a JSON list of sharegpt items")
    prompts = []
    for i, item in enumerate(items):
        turns = item.get("conversations", item.get("conversation")) if isinstance(item, dict) else None
        if not isinstance(turns, list):
            raise ValueError(f"{path}: item {i} has no \"conversations\" list")
        if len(turns) < 2:
            continue
        first = turns[0]
        text = first.get("value") if isinstance(first, dict) else None
        if not isinstance(text, str) or not text:
            raise ValueError(f"{path}: item {i}: conversations[0] needs a non-empty string \"value\"")
        key = item.get("id")
        prompts.append(Prompt(str(key) if key is not None else f"index:{i}", text))
    if not prompts:
        raise ValueError(f"the prompts file {path} holds no item with two or more conversation turns")
    return prompts


def _token_ids(value: object, where: str, name: str, allow_empty: bool = False) -> list[int]:
    if not isinstance(value, list) or not all(isinstance(t, int) and not isinstance(t, bool) for t in value):
        raise ValueError(f"{where}: \"{name}\" must be a list of integer token ids")
    if not value and not allow_empty:
        raise ValueError(f"{where}: \"{name}\" is empty")
    if any(t < 0 for t in value):
        raise ValueError(f"{where}: \"{name}\" holds a negative token id")
    return value


def load_ppl_records(path: Path) -> list[PplRecord]:
    """JSONL, one {"id", "context_token_ids", "target_token_ids"} per line (blank lines skipped).

    Both lists must be non-empty integer ids: the first position of a prompt has no logprob,
    so a record needs at least one context token before its targets.
    """
    records = []
    for n, line in enumerate(_read_text(path, "PPL data").splitlines(), start=1):
        if not line.strip():
            continue
        where = f"{path} line {n}"
        try:
            obj = json.loads(line)
        except json.JSONDecodeError as e:
            raise ValueError(f"{where} is not JSON ({e.msg})") from None
        if not isinstance(obj, dict):
            raise ValueError(f"{where} must be a JSON object")
        missing = [k for k in ("id", "context_token_ids", "target_token_ids") if k not in obj]
        if missing:
            raise ValueError(f"{where} lacks {', '.join(repr(k) for k in missing)}")
        context = _token_ids(obj["context_token_ids"], where, "context_token_ids")
        target = _token_ids(obj["target_token_ids"], where, "target_token_ids")
        records.append(PplRecord(str(obj["id"]), context, target))
    if not records:
        raise ValueError(f"the PPL data file {path} holds no records")
    return records


def load_reference_outputs(path: Path) -> dict[str, list[int]]:
    """JSONL of {"id" or "index", "token_ids"}: plain greedy outputs, keyed by prompt key.

    "id" matches a PPL record's / prompt's id; "index" (an integer) becomes "index:<n>".
    """
    refs: dict[str, list[int]] = {}
    for n, line in enumerate(_read_text(path, "reference outputs").splitlines(), start=1):
        if not line.strip():
            continue
        where = f"{path} line {n}"
        try:
            obj = json.loads(line)
        except json.JSONDecodeError as e:
            raise ValueError(f"{where} is not JSON ({e.msg})") from None
        if not isinstance(obj, dict) or ("id" not in obj and "index" not in obj) or "token_ids" not in obj:
            raise ValueError(f"{where} must be an object with \"id\" (or \"index\") and \"token_ids\"")
        key = str(obj["id"]) if "id" in obj else f"index:{obj['index']}"
        refs[key] = _token_ids(obj["token_ids"], where, "token_ids")
    if not refs:
        raise ValueError(f"the reference outputs file {path} holds no outputs")
    return refs


def shuffled(prompts: list[Prompt], seed: int) -> list[Prompt]:
    """bench_serving's order: `random.seed(seed); random.shuffle(dataset)`."""
    order = list(prompts)
    random.Random(seed).shuffle(order)
    return order


def public_and_held_out(prompts: list[Prompt], num_public: int, num_private: int, seed: int) -> tuple[list[Prompt], list[Prompt]]:
    """The first `num_public` of the seeded order and, disjoint from them, its last `num_private`."""
    if num_public + num_private > len(prompts):
        raise ValueError(
            f"the prompts file has {len(prompts)} usable prompts: a held-out private split of "
            f"{num_private} beside {num_public} public ones does not fit; lower --num-prompts or "
            f"give --private-prompts FILE"
        )
    order = shuffled(prompts, seed)
    return order[:num_public], order[len(order) - num_private:]


def take(prompts: list[Prompt], n: int, seed: int, what: str) -> list[Prompt]:
    """The first n of the seeded order; ValueError when the file has fewer."""
    if n > len(prompts):
        raise ValueError(f"{what} has {len(prompts)} usable prompts, fewer than the {n} asked for")
    return shuffled(prompts, seed)[:n]
