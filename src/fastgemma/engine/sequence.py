"""One request's state as the engine advances it: ids so far, settings, why it stopped.

A request with n choices is n sequences: the first computes the prompt; the others are its
`forks`, admitted with it, that wait (`fork_of`) until its prompt is computed and then start
from a copy of its cache slot (engine/llm_engine.py)."""

from __future__ import annotations

import itertools
from collections.abc import Callable
from dataclasses import dataclass, field
from enum import Enum

import torch

from fastgemma.engine.sampling_params import SamplingParams
from fastgemma.engine.structured_output import Grammar
from fastgemma.models.gemma import PartialForward
from fastgemma.models.towers import MultimodalInputs

_ids = itertools.count()


class Status(Enum):
    WAITING = "waiting"
    RUNNING = "running"
    FINISHED = "finished"


@dataclass(eq=False)  # a sequence is itself: compared by identity
class Sequence:
    prompt_token_ids: list[int]
    params: SamplingParams
    seq_id: int = field(default_factory=lambda: next(_ids))
    output_token_ids: list[int] = field(default_factory=list)
    output_logprobs: list[dict[int, float]] = field(default_factory=list)  # per token when params.logprobs
    status: Status = Status.WAITING
    finish_reason: str | None = None  # "stop" | "length" | "abort"
    slot: int | None = None  # its cache slot while running (engine/scheduler.py)
    num_computed_tokens: int = 0  # tokens whose K/V are in its cache slot
    prefill: PartialForward | None = None  # the prompt chunk in progress, paused between stages
    generator: torch.Generator | None = None
    multimodal: MultimodalInputs | None = None  # tower inputs, until prefill has merged them
    soft: tuple[torch.Tensor, ...] | None = None  # the towers' soft tokens while the prompt is prefilled
    media_key: Callable[[int], bytes] | None = None  # its media's part of its prefix-cache keys (engine/prefix_cache.py)
    target_hidden: torch.Tensor | None = None  # [D] the final hidden state that predicted the last token (MTP input)
    grammar: Grammar | None = None  # its structured output's matcher (engine/structured_output.py)
    fork_of: Sequence | None = field(default=None, repr=False)  # whose computed prompt it will copy
    forks: list[Sequence] = field(default_factory=list)  # unfinished sequences waiting to copy its prompt

    @property
    def num_prompt_tokens(self) -> int:
        return len(self.prompt_token_ids)

    @property
    def num_computed_stages(self) -> int:
        """Stages (a layer's attention or feed-forward) of the prompt chunk in progress already
        run (0 between chunks)."""
        return 0 if self.prefill is None else self.prefill.next_stage

    @property
    def num_tokens(self) -> int:
        return len(self.prompt_token_ids) + len(self.output_token_ids)

    @property
    def last_token_id(self) -> int:
        return (self.output_token_ids or self.prompt_token_ids)[-1]

    @property
    def is_finished(self) -> bool:
        return self.status is Status.FINISHED

    def finish(self, reason: str) -> None:
        self.status, self.finish_reason = Status.FINISHED, reason
        self.prefill = None  # a chunk paused between stages (a cancelled request) is dropped
