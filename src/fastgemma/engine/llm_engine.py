"""The engine loop: requests in, one token per step out, in FIFO order.

    def step(self):
        seq, is_prefill = self.schedule()
        logits = self.runner.prefill(...) if is_prefill else self.runner.decode(...)
        token_id = sample(logits, seq.params, seq.generator)   # greedy decode: decode_greedy(...)
        self.postprocess(seq, token_id, logits)

One sequence runs at a time (batch 1, the challenge's concurrency 1); the others wait.
The engine stops a sequence on max_tokens, an end-of-sequence id (unless ignore_eos), a
stop token id, or max_model_len. It knows no text: stop strings are the caller's
(`LLM`), which ends a sequence with `finish(seq, "stop")`.
"""

from __future__ import annotations

from collections import deque

import torch

from fastgemma.engine.model_runner import ModelRunner
from fastgemma.engine.sampler import sample
from fastgemma.engine.sampling_params import SamplingParams
from fastgemma.engine.sequence import Sequence, Status


class LLMEngine:
    def __init__(self, runner: ModelRunner, eos_token_ids: tuple[int, ...], vocab_size: int):
        self.runner, self.eos_token_ids, self.vocab_size = runner, set(eos_token_ids), vocab_size
        self.waiting: deque[Sequence] = deque()
        self.running: Sequence | None = None

    @property
    def max_model_len(self) -> int:
        return self.runner.max_model_len

    def add_request(self, prompt_token_ids: list[int], params: SamplingParams) -> Sequence:
        self.validate_prompt(prompt_token_ids)
        seq = Sequence(list(prompt_token_ids), params)
        if not params.greedy:
            seq.generator = torch.Generator(device=self.runner.device)
            seq.generator.manual_seed(params.seed if params.seed is not None else int(torch.randint(2**62, ())))
        self.waiting.append(seq)
        return seq

    def validate_prompt(self, ids: list[int]) -> None:
        if not ids:
            raise ValueError("the prompt is empty; give at least one token")
        bad = [i for i in ids if not isinstance(i, int) or not 0 <= i < self.vocab_size]
        if bad:
            raise ValueError(f"token id {bad[0]!r} is outside the vocabulary [0, {self.vocab_size})")
        if len(ids) > self.max_model_len:
            raise ValueError(
                f"the prompt has {len(ids)} tokens but max_model_len is {self.max_model_len}; "
                "shorten the prompt or raise --max-model-len"
            )

    def has_unfinished(self) -> bool:
        return self.running is not None or bool(self.waiting)

    def next_sequence(self) -> Sequence | None:
        """The sequence the next `step()` advances."""
        return self.running or (self.waiting[0] if self.waiting else None)

    def schedule(self) -> tuple[Sequence, bool]:
        if self.running is None:
            self.running = self.waiting.popleft()
            self.running.status = Status.RUNNING
            return self.running, True
        return self.running, False

    def step(self) -> Sequence:
        """Advance the running (or next waiting) sequence by one token; return it."""
        seq, is_prefill = self.schedule()
        if is_prefill:
            logits = self.runner.prefill(seq.prompt_token_ids)
        elif seq.params.greedy and seq.params.logprobs is None:
            logits = None  # only the argmax is wanted: the runner may screen the lm_head
            token_id = self.runner.decode_greedy(seq.last_token_id, seq.num_tokens - 1)
        else:
            logits = self.runner.decode(seq.last_token_id, seq.num_tokens - 1)
        if logits is not None:
            token_id = sample(logits, seq.params, seq.generator)
        self.postprocess(seq, token_id, logits)
        return seq

    def postprocess(self, seq: Sequence, token_id: int, logits: torch.Tensor | None) -> None:
        seq.output_token_ids.append(token_id)
        if seq.params.logprobs is not None:
            seq.output_logprobs.append(_token_logprobs(logits, token_id, seq.params.logprobs))
        p = seq.params
        if not p.ignore_eos and token_id in self.eos_token_ids:
            self.finish(seq, "stop")
        elif token_id in p.stop_token_ids:
            self.finish(seq, "stop")
        elif len(seq.output_token_ids) >= p.max_tokens or seq.num_tokens >= self.max_model_len:
            self.finish(seq, "length")

    def finish(self, seq: Sequence, reason: str) -> None:
        """End a sequence (also one still waiting, e.g. a cancelled request)."""
        if seq.is_finished:
            return
        seq.finish(reason)
        if self.running is seq:
            self.running = None
        elif seq in self.waiting:
            self.waiting.remove(seq)


def _token_logprobs(logits: torch.Tensor, token_id: int, top: int) -> dict[int, float]:
    """{token id: logprob} for the sampled token and the `top` most likely ones."""
    logp = torch.log_softmax(logits.float(), dim=-1)
    out = {token_id: float(logp[token_id])}
    if top:
        values, ids = torch.topk(logp, top)
        out.update(zip(ids.tolist(), values.tolist()))
    return out
