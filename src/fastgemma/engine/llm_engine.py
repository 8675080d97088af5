"""The engine loop: requests in, tokens out, many sequences per step (continuous batching).

    def step(self):
        plan = self.scheduler.schedule()              # engine/scheduler.py: who runs, what
        for seq, stages in plan.prefills:             # some stages of a prompt chunk each (a
            self.prefill(seq, stages)                 #   chunk may pause); the last samples
                                                      #   (and its forks copy the prompt)
        self.decode(plan.decodes)                     # one forward over every decoding row:
            # per sequence [last token, *draft] -> runner.decode_batch -> accept -> postprocess
        return the sequences that got tokens

Structured outputs (engine/structured_output.py): a constrained sequence carries its grammar;
before each of its rows is picked the grammar gives the allowed ids (a bitmask per row, a
draft first cut to what the grammar accepts). Greedy rows take the best allowed token (the
lm_head screen ranks allowed ids only), sampled rows draw from the logits masked to -inf
outside the grammar; each emitted token advances the grammar, and a complete grammar ends
the sequence ("stop"). Logprobs stay the model's own (vLLM's raw logprobs).

Logits processing (penalties, logit_bias, min_tokens; engine/sampler.py `process_logits`):
such a row is picked from its logits processed for its sequence, row i of a verification as
if draft[:i] were already emitted. A greedy one (no logprobs) asks the runner only for what
that argmax needs (`DecodeRows.keep`: the ids the processing may change, `changed_ids`):
exact logits there, the lm_head screen's for the rest (kernels/lm_head_screen.py
`sparse_logits`), so it keeps the screen's speed and the full logits' pick.

Choices (SamplingParams.n, vLLM's parallel sampling): `add_choices` queues n sequences of one
prompt, choice i with `params.for_choice(i)`. The first computes the prompt; the others are
its forks, admitted with it (n slots at once) and given no work until its last prompt chunk
is done; then each gets a copy of its slot's K/V (`runner.copy_prompt`) and picks its first
token from the same final hidden row. The prompt runs once, and each choice's numbers are
the ones it gets as a request of its own: the copied K/V are the bits its own prefill would
write (same chunks, same ops). A source that ends before its prompt is computed (cancelled)
leaves its forks to compute their own (engine/scheduler.py).

Prefix caching (engine/prefix_cache.py, when given one): a sequence's first prompt chunk
starts after the kept chunks its prompt begins with, loaded into its slot; every whole chunk
it computes is kept (a prompt with images / audio: keyed by its media too, and its towers
skipped when the kept chunks hold every placeholder). Same bits as computing them, so the
tokens do not change.

Drafters: n-gram lookup (engine/ngram.py) or the Gemma 4 MTP assistant (engine/mtp.py),
which also reads `seq.target_hidden`: the target's hidden row behind the last emitted token.
Rows of a step: every decoding sequence gets one; the rest of `NATIVE_MAX_ROWS` (one
forward's rows, which read the weights once) go to drafts, in admission order. So a lone
sequence drafts as before and a full batch decodes without drafts: once the rows no longer
fit one forward, a draft costs what it might save.

Every row is its sequence's own one-token step bit for bit (engine/model_runner.py), and each
sampling sequence draws from its own generator: a request's tokens are the same alone or
batched, whoever joins or leaves. The engine stops a sequence on max_tokens, an
end-of-sequence id (unless ignore_eos), a stop token id, or max_model_len; a finished
sequence's cache slot is free at the next step. It knows no text: stop strings are the
caller's (`LLM`), which ends a sequence with `finish(seq, "stop")`.
"""

from __future__ import annotations

import torch

from fastgemma.engine.model_runner import DecodeRows, ModelRunner, PositionLogprob
from fastgemma.engine.mtp import MtpProposer
from fastgemma.engine.ngram import NgramProposer
from fastgemma.engine.prefix_cache import PrefixCache, media_key
from fastgemma.engine.sampler import changed_ids, process_logits, sample
from fastgemma.engine.sampling_params import SamplingParams
from fastgemma.engine.scheduler import Scheduler
from fastgemma.engine.sequence import Sequence, Status
from fastgemma.engine.speculative import SpecStats, accept_greedy, accept_sampled
from fastgemma.engine.structured_output import GrammarCompiler
from fastgemma.kernels.linear import NATIVE_MAX_ROWS
from fastgemma.kernels.lm_head_screen import masked, unpack_bitmask
from fastgemma.models.towers import MultimodalInputs


class LLMEngine:
    def __init__(
        self,
        runner: ModelRunner,
        eos_token_ids: tuple[int, ...],
        vocab_size: int,
        proposer: NgramProposer | MtpProposer | None = None,
        max_num_batched_tokens: int | None = None,
        grammars: GrammarCompiler | None = None,
        prefix_cache: PrefixCache | None = None,
    ):
        self.runner, self.eos_token_ids, self.vocab_size = runner, set(eos_token_ids), vocab_size
        self.proposer, self.grammars, self.prefix_cache = proposer, grammars, prefix_cache
        assert prefix_cache is None or prefix_cache.chunk == runner.prefill_chunk
        self.spec_stats = SpecStats()
        # Unset: paced to the decode rows on a CPU (engine/scheduler.py `paced_budget`); on a GPU
        # a chunk costs a few decode steps, so one whole chunk beside a full batch.
        budget = max_num_batched_tokens
        if budget is None and runner.device.type != "cpu":
            budget = runner.prefill_chunk + runner.pool.num_seqs
        self.scheduler = Scheduler(runner.pool.num_seqs, budget, runner.prefill_chunk, runner.num_stages)

    @property
    def max_model_len(self) -> int:
        return self.runner.max_model_len

    def add_choices(
        self, prompt_token_ids: list[int], params: SamplingParams, multimodal: MultimodalInputs | None = None
    ) -> list[Sequence]:
        """The `params.n` choices of one prompt (module docstring), in choice order."""
        n, slots = params.n, self.runner.pool.num_seqs
        if n > slots:
            raise ValueError(
                f"n={n} choices run at once and need {n} cache slots, but max_num_seqs is {slots}; "
                "lower n or raise --max-num-seqs"
            )
        first = self.add_request(prompt_token_ids, params.for_choice(0), multimodal)
        return [first, *(self.add_request(prompt_token_ids, params.for_choice(i), multimodal, fork_of=first)
                         for i in range(1, n))]

    def add_request(
        self,
        prompt_token_ids: list[int],
        params: SamplingParams,
        multimodal: MultimodalInputs | None = None,
        fork_of: Sequence | None = None,
    ) -> Sequence:
        """One sequence (`params.n` must be 1: `add_choices` for more). `multimodal`: tower
        inputs for the prompt's soft-token slots (used at prefill only). `fork_of`: a waiting
        sequence of the same prompt whose computed prompt this one copies."""
        self.validate_prompt(prompt_token_ids)
        if params.logit_bias and (bad := [t for t in params.logit_bias if t >= self.vocab_size]):
            raise ValueError(f"logit_bias names token id {bad[0]}, outside the vocabulary [0, {self.vocab_size})")
        if params.n != 1:
            raise ValueError(f"add_request runs one choice (n={params.n}); use add_choices")
        seq = Sequence(list(prompt_token_ids), params, multimodal=multimodal)
        if fork_of is not None:
            assert fork_of.status is Status.WAITING and fork_of.prompt_token_ids == seq.prompt_token_ids
            seq.fork_of = fork_of
            fork_of.forks.append(seq)
        if params.structured_outputs is not None:
            if self.grammars is None:
                raise ValueError("structured outputs need the model's tokenizer, which this engine was built without")
            seq.grammar = self.grammars.compile(params.structured_outputs)
        if not params.greedy:
            seq.generator = torch.Generator(device=self.runner.device)
            seq.generator.manual_seed(params.seed if params.seed is not None else int(torch.randint(2**62, ())))
        if fork_of is None:
            self.scheduler.add(seq)  # a fork is admitted with its source
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

    def completion_budget(self, n_prompt: int, max_tokens: int | None) -> int:
        """The tokens a completion may have: `max_tokens`, or (None) the rest of the context,
        as vLLM; ValueError (in vLLM's words) when the prompt plus it exceed max_model_len."""
        limit = self.max_model_len
        if max_tokens is None:
            if limit - n_prompt < 1:
                raise ValueError(
                    f"This model's maximum context length is {limit} tokens and the prompt has {n_prompt}: "
                    "no room to generate. Please reduce the length of the prompt."
                )
            return limit - n_prompt
        if n_prompt + max_tokens > limit:
            raise ValueError(
                f"This model's maximum context length is {limit} tokens. However, you requested "
                f"{n_prompt + max_tokens} tokens ({n_prompt} in the prompt, {max_tokens} in the completion). "
                "Please reduce the length of the prompt or completion."
            )
        return max_tokens

    def has_unfinished(self) -> bool:
        return self.scheduler.has_unfinished()

    def step(self) -> list[Sequence]:
        """Advance every scheduled sequence (module docstring); return those that got tokens."""
        plan = self.scheduler.schedule()
        advanced = [s for seq, stages in plan.prefills for s in self.prefill(seq, stages)]
        if plan.decodes:
            self.decode(plan.decodes)
        return advanced + plan.decodes

    def prefill(self, seq: Sequence, stages: int | None = None) -> list[Sequence]:
        """Run the next `stages` stages (None: all; two a layer) of the sequence's prompt chunk
        in progress, starting the next chunk if none is; after the last chunk's last stage,
        its forks copy its slot and each samples its first token: returns them then (the
        sequence first), else []."""
        cache = self.prefix_cache
        if cache is not None and seq.prefill is None and seq.num_computed_tokens == 0:
            placeholders = self.runner.soft_positions(seq.prompt_token_ids) if seq.multimodal is not None else []
            if placeholders:  # keyed by the media too
                seq.media_key = media_key(placeholders[0], seq.multimodal.digest())
            if kept := cache.lookup(seq.prompt_token_ids, seq.media_key):
                self.runner.load_prefix(seq.slot, kept)  # the chunks' bits, as computing them would write
                seq.num_computed_tokens = kept[-1].end
                if placeholders and kept[-1].end > placeholders[-1]:
                    seq.multimodal = None  # every placeholder is in the kept chunks: no tower needs to run
        if seq.multimodal is not None:
            seq.soft = self.runner.media(seq.prompt_token_ids, seq.multimodal)
            seq.multimodal = None  # the towers ran; their soft tokens go in chunk by chunk
        if seq.prefill is None:
            seq.prefill = self.runner.start_prefill(seq.prompt_token_ids, seq.num_computed_tokens, seq.slot, seq.soft)
        hidden = self.runner.advance_prefill(seq.prefill, stages)  # [1, D] once the chunk is done
        if hidden is None:
            return []
        seq.prefill = None
        start = seq.num_computed_tokens
        seq.num_computed_tokens = end = min(start + self.runner.prefill_chunk, seq.num_prompt_tokens)
        if cache is not None and end - start == cache.chunk:  # a whole chunk: kept for prompts that begin the same
            cache.store(seq.prompt_token_ids, end, lambda: self.runner.save_chunk(seq.slot, start, end), seq.media_key)
        if seq.num_computed_tokens < seq.num_prompt_tokens:
            return []
        seq.soft = seq.media_key = None
        forks, seq.forks = seq.forks, []
        for fork in forks:  # before any token: the source may end at its first
            self.runner.copy_prompt(seq.slot, fork.slot, seq.num_prompt_tokens)
            fork.fork_of, fork.num_computed_tokens, fork.multimodal = None, fork.num_prompt_tokens, None
        greedy, first = None, None  # what the choices share: the greedy token (no grammar), the logits
        for s in (seq, *forks):
            s.target_hidden = hidden[-1]
            allowed = s.grammar.bitmask() if s.grammar is not None else None
            if s.params.greedy and s.params.logprobs is None and not s.params.processes_logits_at(0):  # token only
                if allowed is not None:
                    token = self.runner.first_token(hidden, "greedy", allowed)
                else:
                    token = greedy = self.runner.first_token(hidden, "greedy") if greedy is None else greedy
                self.postprocess(s, [token], None)
                continue
            if first is None:
                first = self.runner.first_token(hidden, "logits")
            if s.params.processes_logits_at(0):
                pick = process_logits(first[None], s.params, s.prompt_token_ids, [], (), self.stop_ids(s))[0]
            else:
                pick = first
            pick = pick if allowed is None else masked(pick, allowed)
            self.postprocess(s, [sample(pick, s.params, s.generator)], first[None])
        return [seq, *forks]

    def decode(self, seqs: list[Sequence]) -> None:
        """One decode-like step for every sequence: its last token and its drafts."""
        drafts, masks = [], []
        for seq, draft in zip(seqs, self.propose_all(seqs)):
            mask = None
            if seq.grammar is not None:  # the draft cut to what the grammar accepts; a mask per row
                draft, mask = seq.grammar.verification(draft)
            drafts.append(draft)
            masks.append(mask)
        batch = []
        for seq, draft, mask in zip(seqs, drafts, masks):
            p, processed = seq.params, seq.params.processes_logits_at(len(seq.output_token_ids))
            keep = None  # a processed greedy pick: only the ids the processing changes need exact logits
            if p.greedy and p.logprobs is None and processed:
                keep = torch.tensor(changed_ids(p, seq.prompt_token_ids, seq.output_token_ids, draft, self.stop_ids(seq)),
                                    dtype=torch.long)
            batch.append(DecodeRows(seq.slot, [seq.last_token_id, *draft], seq.num_tokens - 1,
                                    greedy=p.greedy and p.logprobs is None and not processed, allowed=mask, keep=keep))
        for seq, draft, rows, out in zip(seqs, drafts, batch, self.runner.decode_batch(batch)):
            logits = out.logits  # the model's own (None for greedy rows): logprobs report these
            if rows.greedy:
                tokens = accept_greedy(draft, out.tokens)
            elif rows.keep is not None:  # screened logits: the processed argmax over the ids computed
                tokens = accept_greedy(draft, self.screened_picks(seq, draft, logits, rows.allowed))
            else:
                pick = logits
                if seq.params.processes_logits_at(len(seq.output_token_ids)):  # row i follows the output and draft[:i]
                    pick = process_logits(logits, seq.params, seq.prompt_token_ids, seq.output_token_ids, draft,
                                          self.stop_ids(seq))
                pick = pick if rows.allowed is None else masked(pick, rows.allowed)
                if seq.params.greedy:  # greedy with logprobs
                    tokens = accept_greedy(draft, torch.argmax(pick, dim=-1).tolist())
                else:
                    tokens = accept_sampled(draft, pick, seq.params, seq.generator)
            if draft:
                self.spec_stats.record(len(draft), len(tokens) - 1)
            seq.target_hidden = out.hidden[len(tokens) - 1]
            self.postprocess(seq, tokens, logits)
            seq.num_computed_tokens = seq.num_tokens - 1

    def screened_picks(self, seq: Sequence, draft: list[int], logits: torch.Tensor,
                       allowed: torch.Tensor | None) -> list[int]:
        """The greedy picks of processed logits [R, V] that are exact where finite and -inf
        where the screen ruled an id out (runner: DecodeRows.keep): processed for the ids
        computed in some row only (the same numbers); a row whose processed maximum is -inf
        (nothing allowed is finite) is processed in full, as the plain path would."""
        V = logits.shape[1]
        cols = torch.isfinite(logits).any(0).nonzero()[:, 0]  # ascending
        args = (seq.params, seq.prompt_token_ids, seq.output_token_ids, draft, self.stop_ids(seq))
        sub = process_logits(logits[:, cols], *args, columns=cols)
        if allowed is not None:
            sub = sub.masked_fill(~unpack_bitmask(allowed, V)[:, cols], float("-inf"))
        best = sub.max(dim=1).values if cols.numel() else torch.full((logits.shape[0],), float("-inf"))
        picks = []
        for i in range(logits.shape[0]):
            if best[i] > float("-inf"):
                picks.append(int(cols[torch.argmax(sub[i])]))
                continue
            row = process_logits(logits, *args)[i]  # the plain path's pick over everything
            picks.append(int(torch.argmax(row if allowed is None else masked(row[None], allowed[i : i + 1])[0])))
        return picks

    def prompt_logprobs(self, ids: list[int], top: int = 0) -> list[PositionLogprob | None]:
        """Score a prompt (runner.prompt_logprobs) in a free cache slot, never a running
        sequence's: if every slot is held, the running sequences advance until one is free."""
        while (slot := self.scheduler.take_slot()) is None:
            self.step()
        try:
            return self.runner.prompt_logprobs(ids, top, slot)
        finally:
            self.scheduler.give_slot(slot)

    def propose_all(self, seqs: list[Sequence]) -> list[list[int]]:
        """Each sequence's drafts, within the rows one forward holds (module docstring)."""
        spare = NATIVE_MAX_ROWS - len(seqs)
        drafts = []
        for seq in seqs:
            draft = self.propose(seq, spare) if spare > 0 else []
            spare -= len(draft)
            drafts.append(draft)
        return drafts

    def propose(self, seq: Sequence, rows: int = NATIVE_MAX_ROWS - 1) -> list[int]:
        """The drafter's tokens for this step, at most `rows` and no more than can be kept:
        the last emitted token always comes from the target, and every position must fit the cache."""
        if self.proposer is None:
            return []
        limit = min(
            rows,
            seq.params.max_tokens - len(seq.output_token_ids) - 1,
            self.max_model_len - seq.num_tokens,
            self.runner.cache.max_decode_like_tokens - 1,
        )
        if limit <= 0:
            return []
        cache = self.runner.pool.seqs[seq.slot]
        return self.proposer.propose(seq.prompt_token_ids + seq.output_token_ids, limit, seq.target_hidden, cache)

    def stop_ids(self, seq: Sequence) -> list[int]:
        """The ids that end the sequence: end-of-sequence (unless ignored) and its stop_token_ids."""
        return sorted(set(seq.params.stop_token_ids) | (set() if seq.params.ignore_eos else self.eos_token_ids))

    def postprocess(self, seq: Sequence, tokens: list[int], rows: torch.Tensor | None) -> None:
        """Append tokens (rows[i]: the logits token i was picked from) until one ends the sequence."""
        for i, token_id in enumerate(tokens):
            seq.output_token_ids.append(token_id)
            if seq.params.logprobs is not None:
                seq.output_logprobs.append(_token_logprobs(rows[i], token_id, seq.params.logprobs))
            if seq.grammar is not None:
                seq.grammar.accept(token_id)
            p = seq.params
            if not p.ignore_eos and token_id in self.eos_token_ids:
                self.finish(seq, "stop")
            elif token_id in p.stop_token_ids or (seq.grammar is not None and seq.grammar.is_terminated):
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
        self.scheduler.finish(seq)


def _token_logprobs(logits: torch.Tensor, token_id: int, top: int) -> dict[int, float]:
    """{token id: logprob} for the sampled token and the `top` most likely ones."""
    logp = torch.log_softmax(logits.float(), dim=-1)
    out = {token_id: float(logp[token_id])}
    if top:
        values, ids = torch.topk(logp, top)
        out.update(zip(ids.tolist(), values.tolist()))
    return out
