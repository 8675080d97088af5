"""HTTP client for the OpenAI-compatible routes the challenge harness uses.

Owns request payloads and response parsing; knows nothing about stages' statistics. Every
failure — a refused connection, a timeout, an HTTP error, a body that is not JSON, a missing
or mistyped field — raises `StageError` naming the stage and, for responses, the field:
`stage ppl: response has no choices[0].prompt_logprobs`.

Payloads are the harness's: chat as sglang bench_serving's `vllm-chat` backend sends it
(non-streaming, temperature 0, `ignore_eos` as its `--extra-request-body`), completions with
integer prompts, `add_special_tokens: false` and `return_token_ids: true`.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass
from typing import Any

import httpx


class StageError(ValueError):
    """A stage could not complete; the message starts with `stage <name>:`."""

    def __init__(self, stage: str, message: str):
        super().__init__(f"stage {stage}: {message}")
        self.stage = stage


@dataclass(frozen=True)
class ChatReply:
    latency_s: float  # request sent -> full response read
    prompt_tokens: int  # usage.prompt_tokens (chat-formatted prompt, as the server counts it)
    completion_tokens: int  # usage.completion_tokens: what bench_serving counts as output


@dataclass(frozen=True)
class CompletionReply:
    latency_s: float
    token_ids: list[int]  # choices[0].token_ids: the generated ids


def api_base(url: str) -> str:
    """`http://h:p`, `http://h:p/` and `http://h:p/v1` all name the same server."""
    base = url.rstrip("/")
    return base[: -len("/v1")] if base.endswith("/v1") else base


SPEC_COUNTERS = ("num_drafts", "num_draft_tokens", "num_accepted_tokens")


def parse_spec_decode_counters(text: str) -> dict[str, float] | None:
    """{num_drafts, num_draft_tokens, num_accepted_tokens} from Prometheus text, or None."""
    found: dict[str, float] = {}
    for line in text.splitlines():
        if line.startswith("#") or "spec_decode_" not in line:
            continue
        name, _, value = line.rpartition(" ")
        metric = name.split("{", 1)[0].split(":", 1)[-1].removeprefix("spec_decode_").removesuffix("_total")
        if metric in SPEC_COUNTERS:
            try:
                found[metric] = found.get(metric, 0.0) + float(value)
            except ValueError:
                continue
    return found if len(found) == len(SPEC_COUNTERS) else None


def field(obj: Any, path: str, stage: str) -> Any:
    """obj at `a.b[0].c`; StageError `response has no a.b[0].c` when any step is absent or null."""
    cur = obj
    for part in path.replace("[", ".[").split("."):
        if part.startswith("["):
            index = int(part[1:-1])
            ok = isinstance(cur, list) and len(cur) > index
            cur = cur[index] if ok else None
        else:
            cur = cur.get(part) if isinstance(cur, dict) else None
        if cur is None:
            raise StageError(stage, f"response has no {path}")
    return cur


def _int_list(value: Any, path: str, stage: str) -> list[int]:
    if not isinstance(value, list) or not all(isinstance(t, int) and not isinstance(t, bool) for t in value):
        raise StageError(stage, f"response field {path} is not a list of integer token ids")
    return value


def _count(value: Any, path: str, stage: str) -> int:
    if not isinstance(value, int) or isinstance(value, bool) or value < 0:
        raise StageError(stage, f"response field {path} is not a non-negative integer")
    return value


class Client:
    def __init__(self, url: str, api_key: str | None = None, timeout_s: float = 3600.0,
                 transport: httpx.BaseTransport | None = None):
        headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
        self.base_url = api_base(url)
        self.http = httpx.Client(base_url=self.base_url, headers=headers, timeout=timeout_s, transport=transport)

    def __enter__(self) -> Client:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.http.close()

    def _request(self, stage: str, method: str, path: str, payload: dict[str, Any] | None = None) -> tuple[Any, float]:
        start = time.perf_counter()
        try:
            response = self.http.request(method, path, json=payload)
        except httpx.TimeoutException:
            raise StageError(stage, f"{method} {path} timed out after {self.http.timeout.read} s") from None
        except httpx.HTTPError as e:
            raise StageError(stage, f"{method} {path} failed: {e or type(e).__name__}") from None
        latency = time.perf_counter() - start
        if response.status_code != 200:
            body = " ".join(response.text.split())[:300]
            raise StageError(stage, f"HTTP {response.status_code} from {method} {path}: {body or '(empty body)'}")
        try:
            return response.json(), latency
        except ValueError:
            raise StageError(stage, f"{method} {path} returned a body that is not JSON") from None

    def spec_decode_counters(self) -> dict[str, float] | None:
        """The endpoint's speculative-decoding counters from GET /metrics (fastgemma's or
        vLLM's `spec_decode_*` names, summed over labels), or None where there are none."""
        try:
            response = self.http.get("/metrics")
        except httpx.HTTPError:
            return None
        if response.status_code != 200:
            return None
        return parse_spec_decode_counters(response.text)

    def resident_memory_bytes(self) -> int | None:
        """The server process's resident memory (`process_resident_memory_bytes` from
        GET /metrics, prometheus-client's process collector), or None where not exported."""
        try:
            response = self.http.get("/metrics")
        except httpx.HTTPError:
            return None
        if response.status_code != 200:
            return None
        for line in response.text.splitlines():
            if line.startswith("process_resident_memory_bytes "):
                try:
                    return int(float(line.split()[1]))
                except (IndexError, ValueError):
                    return None
        return None

    def model_ids(self, stage: str = "connect") -> list[str]:
        body, _ = self._request(stage, "GET", "/v1/models")
        data = field(body, "data", stage)
        ids = [m.get("id") for m in data if isinstance(m, dict)] if isinstance(data, list) else []
        if not ids or not all(isinstance(i, str) for i in ids):
            raise StageError(stage, "response has no data[0].id")
        return ids

    def chat(self, stage: str, model: str, text: str, max_tokens: int) -> ChatReply:
        payload = {
            "model": model, "messages": [{"role": "user", "content": text}], "temperature": 0.0,
            "max_tokens": max_tokens, "stream": False, "ignore_eos": True,
        }
        body, latency = self._request(stage, "POST", "/v1/chat/completions", payload)
        field(body, "choices[0].message", stage)
        prompt_tokens = _count(field(body, "usage.prompt_tokens", stage), "usage.prompt_tokens", stage)
        completion = _count(field(body, "usage.completion_tokens", stage), "usage.completion_tokens", stage)
        return ChatReply(latency, prompt_tokens, completion)

    def complete_ids(self, stage: str, model: str, prompt_ids: list[int], max_tokens: int) -> CompletionReply:
        payload = {
            "model": model, "prompt": prompt_ids, "max_tokens": max_tokens, "temperature": 0.0,
            "ignore_eos": True, "stream": False, "add_special_tokens": False, "return_token_ids": True,
        }
        body, latency = self._request(stage, "POST", "/v1/completions", payload)
        ids = _int_list(field(body, "choices[0].token_ids", stage), "choices[0].token_ids", stage)
        return CompletionReply(latency, ids)

    def prompt_token_logprobs(self, stage: str, model: str, prompt_ids: list[int]) -> tuple[list[float | None], float]:
        """log p(prompt_ids[i] | prompt_ids[:i]) read from `choices[0].prompt_logprobs` (vLLM's
        shape: one entry per prompt position, None first, else {str(token id): {"logprob"}});
        the entry must hold the actual prompt token. Returns (logprobs, latency)."""
        payload = {
            "model": model, "prompt": prompt_ids, "max_tokens": 1, "temperature": 0.0, "stream": False,
            "prompt_logprobs": 1, "add_special_tokens": False, "return_token_ids": True,
        }
        body, latency = self._request(stage, "POST", "/v1/completions", payload)
        path = "choices[0].prompt_logprobs"
        entries = field(body, path, stage)
        if not isinstance(entries, list):
            raise StageError(stage, f"response field {path} is not a list")
        if len(entries) != len(prompt_ids):
            raise StageError(stage, f"response field {path} has {len(entries)} entries for a {len(prompt_ids)}-token prompt")
        out: list[float | None] = [None]
        for pos in range(1, len(prompt_ids)):
            entry, token = entries[pos], str(prompt_ids[pos])
            value = entry.get(token) if isinstance(entry, dict) else None
            logprob = value.get("logprob") if isinstance(value, dict) else None
            if not isinstance(logprob, (int, float)) or isinstance(logprob, bool) or math.isnan(logprob) or logprob > 1e-6:
                raise StageError(stage, f"response field {path}[{pos}] has no logprob for the prompt token {token}")
            out.append(float(logprob))
        return out, latency
