"""The engine loop: requests in, tokens out (one per step, or more with a draft), in FIFO order.

    def step(self):
        seq, is_prefill = self.schedule()
        if is_prefill: token = sample(self.runner.prefill(...)); postprocess(seq, [token])
        draft = self.propose(seq)                                  # [] without a drafter
        rows = self.runner.verify([seq.last_token_id, *draft], ...)  # K + 1 rows; K = 0: a decode step
        tokens = accept_greedy(draft, rows) or accept_sampled(...)   # engine/speculative.py
        self.postprocess(seq, tokens, rows)

Drafters: n-gram lookup (engine/ngram.py) or the Gemma 4 MTP assistant (engine/mtp.py),
which also reads `seq.target_hidden`: the target's hidden row behind the last emitted token.

One sequence runs at a time (batch 1, the challenge's concurrency 1); the others wait.
The engine stops a sequence on max_tokens, an end-of-sequence id (unless ignore_eos), a
stop token id, or max_model_len. It knows no text: stop strings are the caller's
(`LLM`), which ends a sequence with `finish(seq, "stop")`.
"""

from __future__ import annotations

from collections import deque

import torch

from fastgemma.engine.model_runner import ModelRunner
from fastgemma.engine.mtp import MtpProposer
from fastgemma.engine.ngram import NgramProposer
from fastgemma.engine.sampler import sample
from fastgemma.engine.sampling_params import SamplingParams
from fastgemma.engine.sequence import Sequence, Status
from fastgemma.engine.speculative import SpecStats, accept_greedy, accept_sampled
from fastgemma.kernels.linear import NATIVE_MAX_ROWS
from fastgemma.models.towers import MultimodalInputs


class LLMEngine:
    def __init__(
        self,
        runner: ModelRunner,
        eos_token_ids: tuple[int, ...],
        vocab_size: int,
        proposer: NgramProposer | MtpProposer | None = None,
    ):
        self.runner, self.eos_token_ids, self.vocab_size = runner, set(eos_token_ids), vocab_size
        self.proposer = proposer
        self.spec_stats = SpecStats()
        self.waiting: deque[Sequence] = deque()
        self.running: Sequence | None = None

    @property
    def max_model_len(self) -> int:
        return self.runner.max_model_len

    def add_request(
        self, prompt_token_ids: list[int], params: SamplingParams, multimodal: MultimodalInputs | None = None
    ) -> Sequence:
        """`multimodal`: tower inputs for the prompt's soft-token slots (used at prefill only)."""
        self.validate_prompt(prompt_token_ids)
        seq = Sequence(list(prompt_token_ids), params, multimodal=multimodal)
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
        """Advance the running (or next waiting) sequence by one or more tokens; return it."""
        seq, is_prefill = self.schedule()
        if is_prefill:
            logits = self.runner.prefill(seq.prompt_token_ids, multimodal=seq.multimodal)
            seq.multimodal = None  # the media are in the cache now
            seq.target_hidden = self.runner.last_hidden[-1]
            self.postprocess(seq, [sample(logits, seq.params, seq.generator)], logits[None])
            return seq
        draft = self.propose(seq)
        ids, position = [seq.last_token_id, *draft], seq.num_tokens - 1
        if seq.params.greedy and seq.params.logprobs is None:
            rows = None  # only argmaxes are wanted: the runner may screen the lm_head
            tokens = accept_greedy(draft, self.runner.verify(ids, position, greedy=True))
        else:
            rows = self.runner.verify(ids, position, greedy=False)  # [K + 1, V]
            if seq.params.greedy:
                tokens = accept_greedy(draft, torch.argmax(rows, dim=-1).tolist())
            else:
                tokens = accept_sampled(draft, rows, seq.params, seq.generator)
        if draft:
            self.spec_stats.record(len(draft), len(tokens) - 1)
        seq.target_hidden = self.runner.last_hidden[len(tokens) - 1]
        self.postprocess(seq, tokens, rows)
        return seq

    def propose(self, seq: Sequence) -> list[int]:
        """The drafter's tokens for this step, no more than can be kept: the last emitted
        token always comes from the target, and every position must fit the cache."""
        if self.proposer is None:
            return []
        limit = min(
            seq.params.max_tokens - len(seq.output_token_ids) - 1,
            self.max_model_len - seq.num_tokens,
            self.runner.cache.max_decode_like_tokens - 1,
            NATIVE_MAX_ROWS - 1,
        )
        if limit <= 0:
            return []
        return self.proposer.propose(seq.prompt_token_ids + seq.output_token_ids, limit, seq.target_hidden)

    def postprocess(self, seq: Sequence, tokens: list[int], rows: torch.Tensor | None) -> None:
        """Append tokens (rows[i]: the logits token i was picked from) until one ends the sequence."""
        for i, token_id in enumerate(tokens):
            seq.output_token_ids.append(token_id)
            if seq.params.logprobs is not None:
                seq.output_logprobs.append(_token_logprobs(rows[i], token_id, seq.params.logprobs))
            p = seq.params
            if not p.ignore_eos and token_id in self.eos_token_ids:
                self.finish(seq, "stop")
            elif token_id in p.stop_token_ids:
                self.finish(seq, "stop")
            elif len(seq.output_token_ids) >= p.max_tokens or seq.num_tokens >= self.max_model_len:
                self.finish(seq, "length")
            if seq.is_finished:
                return

    def finish(self, seq: Sequence, reason: str, num_output_tokens: int | None = None) -> None:
        """End a sequence (also one still waiting, e.g. a cancelled request); with
        `num_output_tokens`, drop the outputs after that many (a stop string matched inside
        a step that emitted several tokens)."""
        if num_output_tokens is not None and num_output_tokens < len(seq.output_token_ids):
            del seq.output_token_ids[num_output_tokens:]
            del seq.output_logprobs[num_output_tokens:]
            if seq.is_finished:  # ended later in the same step (end-of-sequence, length): the stop came first
                seq.finish_reason = reason
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
