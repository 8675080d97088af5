"""What generation returns, in vLLM's shapes (`RequestOutput.outputs[0].text`, ...)."""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass
class CompletionOutput:
    index: int
    text: str
    token_ids: list[int]
    finish_reason: str | None  # "stop" | "length" | "abort"; None while running
    logprobs: list[dict[int, float]] | None = None  # per generated token, when requested


@dataclass
class RequestOutput:
    request_id: str
    prompt: str | None
    prompt_token_ids: list[int]
    outputs: list[CompletionOutput] = field(default_factory=list)
    finished: bool = True

    @property
    def text(self) -> str:
        return self.outputs[0].text

    @property
    def token_ids(self) -> list[int]:
        return self.outputs[0].token_ids


@dataclass
class StreamDelta:
    """One step of a streamed generation: the new text (UTF-8 safe) and the new token id."""

    text: str
    token_id: int | None
    finish_reason: str | None = None
