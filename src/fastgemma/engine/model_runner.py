"""Runs the decoder over the static cache: prefill chunks, batched decode steps, prompt scoring.

Owns the device-side state of the running sequences (a `KVCachePool`: one cache slot per
sequence, handed out by the engine's scheduler) and turns token ids into logits. Knows
nothing of sampling, stopping or text. Every method takes the cache slot it works on
(default 0: the one-sequence API that tests and tools use).

- `prefill_from(ids, start, slot, soft, out, allowed)`: ids[start : start + prefill_chunk]
  into the slot; its last row's logits (`out="logits"`), greedy token (`"greedy"`: the model
  may pick it through the exact lm_head screen, without reading the full lm_head; among the
  ids the grammar bitmask `allowed` lets through, when given) or nothing (None: a chunk
  before the prompt's last). Chunks start at multiples of `prefill_chunk` (absolute positions),
  so a prompt's numbers do not depend on when its chunks run or what runs beside them.
  In parts: `start_prefill(ids, start, slot, soft)` makes the chunk's forward,
  `advance_prefill(work, stages)` runs its next stages (a layer's attention or feed-forward;
  None: the rest) and returns the last row's hidden state once done, `first_token(hidden,
  out, allowed)` picks from it: the engine spreads a chunk over steps so, with the same bits.
  `media(ids, multimodal)`: the towers' soft tokens for a multimodal prompt, run once, first
  (`soft_positions(ids)`: where they go).
- `prefill(ids, multimodal, slot)`: a whole prompt, chunk after chunk; last logits.
- `copy_prompt(src, dst, num_tokens)`: a computed prompt's K/V from one slot into another
  (n choices of one prompt, engine/llm_engine.py); `save_chunk(slot, start, end)` /
  `load_prefix(slot, chunks)`: computed prompt chunks out of a slot and back into one
  (engine/prefix_cache.py).
- `decode_batch(rows)`: one decode-like forward over rows of many sequences, each
  `DecodeRows(slot, ids, position, greedy, allowed)` (the last token and any drafted ones at
  positions position..; greedy rows pick among the ids of their grammar bitmask, if any);
  per sequence the greedy tokens or the logits [K + 1, V] and its hidden rows. Every row is
  bit for bit its sequence's one-token step (models/kv_cache.py), so a sequence's output
  does not depend on its neighbours. With the row-invariant native
  kernels (`batched`) all rows share one forward (at most `NATIVE_MAX_ROWS`, split into
  several forwards beyond); otherwise each sequence runs its own.
- `decode(id, position)`, `decode_greedy(...)`, `verify(ids, position, greedy)`: one
  sequence's step (greedy: the model may pick through the exact lm_head screen).
- `last_hidden`: the final (normed) hidden rows behind the last prefill's, decode's or
  verification's logits, for drafters that read the target's state (engine/mtp.py).
- `prompt_logprobs(ids, top, slot)`: every position's log-softmax (teacher forcing), computed
  in slices so that no [T, V] tensor larger than `logits_chunk` rows exists at once; it
  writes only its own slot, never a running sequence's.

With `static_steps` (CUDA with kernels=auto), decode and verify run the fixed-shape step of
engine/static_step.py (a CUDA graph unless `enforce_eager`), one per slot (a graph's buffers
are fixed); prefill and scoring stay as above. The cache then has a scratch slot per buffer.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from fastgemma.engine.static_step import StaticStep
from fastgemma.kernels.linear import NATIVE_MAX_ROWS
from fastgemma.kernels.lm_head_screen import masked
from fastgemma.models.gemma import GemmaForCausalLM, PartialForward
from fastgemma.models.kv_cache import KVCache, KVCachePool, SavedChunk, decode_metadata
from fastgemma.models.towers import MultimodalInputs, MultimodalTowers

Soft = tuple[torch.Tensor, torch.Tensor, torch.Tensor]  # soft_embeds [N, D], soft_mask [T], soft rows before each position [T]


@dataclass
class DecodeRows:
    """One sequence's rows of a decode-like step: its last token and drafted ones."""

    slot: int  # its cache slot
    ids: list[int]  # [K + 1]
    position: int  # of ids[0]
    greedy: bool  # only argmaxes wanted (the lm_head screen may pick them)
    allowed: torch.Tensor | None = None  # [K + 1, W] int32 grammar bitmasks of greedy rows (engine/structured_output.py)
    # not greedy, but only the argmax of processed logits wanted (penalties, bias, min_tokens;
    # engine/sampler.py): the ids the processing may change; the logits returned are then
    # exact there and where the lm_head screen cannot rule out the argmax, -inf elsewhere
    keep: torch.Tensor | None = None


@dataclass
class DecodeResult:
    tokens: list[int] | None  # greedy: [K + 1] argmaxes
    logits: torch.Tensor | None  # otherwise: [K + 1, V]
    hidden: torch.Tensor  # [K + 1, D] final normed hidden rows


@dataclass
class PositionLogprob:
    """The log-probability of the actual token at one prompt position, its rank and the top list."""

    logprob: float
    rank: int  # 1 = the most likely token
    top: list[tuple[int, float]]  # (token id, logprob), most likely first


class ModelRunner:
    def __init__(
        self,
        model: GemmaForCausalLM,
        max_model_len: int,
        prefill_chunk: int = 512,
        logits_chunk: int = 128,
        num_speculative_tokens: int = 0,
        towers: MultimodalTowers | None = None,
        static_steps: bool = False,
        enforce_eager: bool = False,
        max_num_seqs: int = 1,
    ):
        self.model, self.max_model_len = model, max_model_len
        self.towers = towers  # Gemma 4 vision / audio towers: run at prefill only
        self.device = model.embed_tokens.weight.device
        self.prefill_chunk, self.logits_chunk = prefill_chunk, logits_chunk
        self.pool = KVCachePool(
            model.spec, max_model_len, model.dtype, self.device, max_num_seqs, num_speculative_tokens,
            scratch_slot=static_steps,
        )
        self.static_steps, self.enforce_eager = static_steps, enforce_eager
        self.static: dict[int, StaticStep] = {}  # slot -> its fixed-shape step, made on first use
        # Rows of many sequences in one forward: the native kernels attend row by row
        # (models/attention.py); elsewhere each sequence runs its own forward.
        self.batched = model.use_native and model.spec.attn_softcap is None and not static_steps
        self.last_hidden: torch.Tensor | None = None  # [T, D] normed hidden rows of the last prefill / decode / verify

    @property
    def num_stages(self) -> int:
        """Stages of a forward (a layer's attention, its feed-forward): what a chunk pauses between."""
        return self.model.num_stages

    @property
    def cache(self) -> KVCache:
        """Slot 0's cache (the one-sequence API)."""
        return self.pool.seqs[0]

    def _ids(self, ids: list[int]) -> torch.Tensor:
        return torch.tensor(ids, dtype=torch.long, device=self.device)

    def _begin(
        self,
        ids: list[int],
        start: int,
        keep: torch.Tensor | None,
        slot: int = 0,
        soft: tuple[torch.Tensor, torch.Tensor] | None = None,  # this chunk's (soft_embeds [N, D], soft_mask [T])
    ) -> PartialForward:
        """The chunk's forward, no stage run yet (`model.advance` runs them)."""
        cache = self.pool.seqs[slot]
        meta = cache.metadata(start, len(ids))
        embeds, ple_ids = self.model.embed(self._ids(ids), *(soft or ()))
        return self.model.begin(embeds, ple_ids, meta, cache, keep)

    def _forward(
        self, ids: list[int], start: int, keep: torch.Tensor | None, slot: int = 0,
        soft: tuple[torch.Tensor, torch.Tensor] | None = None,
    ) -> torch.Tensor:
        """The chunk's whole forward: its final normed hidden states [len(keep) or T, D]."""
        return self.model.advance(self._begin(ids, start, keep, slot, soft=soft))

    def soft_positions(self, ids: list[int]) -> list[int]:
        """The positions of a prompt's media placeholders (where the towers' rows go)."""
        assert self.towers is not None, "multimodal inputs for a model without towers"
        return torch.nonzero(self.towers.placeholders(torch.tensor(ids))).flatten().tolist()

    @torch.inference_mode()
    def media(self, ids: list[int], multimodal: MultimodalInputs) -> Soft:
        """The towers' soft tokens for a prompt's placeholder slots (models/towers.py)."""
        assert self.towers is not None, "multimodal inputs for a model without towers"
        soft_embeds, soft_mask = self.towers.soft_embeddings(self._ids(ids), multimodal)  # [N, D], [T]
        return soft_embeds, soft_mask, torch.cumsum(soft_mask, 0) - soft_mask.long()

    @torch.inference_mode()
    def start_prefill(self, ids: list[int], start: int, slot: int = 0, soft: Soft | None = None) -> PartialForward:
        """The forward of ids[start : start + prefill_chunk] (positions start..; start a
        multiple of prefill_chunk) into the slot, keeping the chunk's last row; no stage run
        yet (`advance_prefill`)."""
        assert start % self.prefill_chunk == 0, (start, self.prefill_chunk)
        chunk = ids[start : start + self.prefill_chunk]
        last = torch.tensor([len(chunk) - 1], device=self.device)
        part = None
        if soft is not None and (mask := soft[1][start : start + len(chunk)]).any():
            first = int(soft[2][start])
            part = (soft[0][first : first + int(mask.sum())], mask)
        return self._begin(chunk, start, last, slot, soft=part)

    @torch.inference_mode()
    def advance_prefill(self, work: PartialForward, stages: int | None = None) -> torch.Tensor | None:
        """Run a chunk's next `stages` stages (None: the rest); once done, its last row's final
        hidden state [1, D] (also `last_hidden`), else None."""
        hidden = self.model.advance(work, stages)
        if hidden is not None:
            self.last_hidden = hidden
        return hidden

    @torch.inference_mode()
    def first_token(
        self, hidden: torch.Tensor, out: str = "logits", allowed: torch.Tensor | None = None
    ) -> torch.Tensor | int:
        """From a finished chunk's hidden row [1, D]: its logits [V] (`out` "logits") or its
        greedy token ("greedy"; among the ids of the bitmask `allowed` [W] when given)."""
        if out == "greedy":
            return self.model.greedy_tokens(hidden, None if allowed is None else [allowed])[0]
        return self.model.compute_logits(hidden)[0]

    @torch.inference_mode()
    def prefill_from(
        self,
        ids: list[int],
        start: int,
        slot: int = 0,
        soft: Soft | None = None,
        out: str | None = "logits",
        allowed: torch.Tensor | None = None,
    ) -> torch.Tensor | int | None:
        """One whole chunk (start_prefill, every stage): `first_token(..., out, allowed)`, or
        None when `out` is None."""
        hidden = self.advance_prefill(self.start_prefill(ids, start, slot, soft))
        return None if out is None else self.first_token(hidden, out, allowed)

    @torch.inference_mode()
    def prefill(self, ids: list[int], multimodal: MultimodalInputs | None = None, slot: int = 0) -> torch.Tensor:
        """Write a whole prompt into the slot's cache, chunk after chunk; return the last
        position's logits [V]. With `multimodal`, the towers run first and their soft tokens
        replace the placeholders' embeddings."""
        assert ids, "prefill of an empty prompt"
        soft = None if multimodal is None else self.media(ids, multimodal)
        for start in range(0, len(ids), self.prefill_chunk):
            logits = self.prefill_from(ids, start, slot, soft)
        return logits

    @torch.inference_mode()
    def save_chunk(self, slot: int, start: int, end: int) -> SavedChunk:
        """A copy of the prompt chunk the slot just computed at positions start..end-1."""
        return self.pool.save_chunk(slot, start, end)

    @torch.inference_mode()
    def load_prefix(self, slot: int, chunks: list[SavedChunk]) -> None:
        """The slot's cache := a sequence's that computed these chunks from position 0."""
        self.pool.load_prefix(slot, chunks)

    @torch.inference_mode()
    def copy_prompt(self, src: int, dst: int, num_tokens: int) -> None:
        """Slot dst's cache := what slot src holds for its first `num_tokens` positions (a
        fork of a computed prompt: the bits dst's own prefill would write)."""
        self.pool.copy(src, dst, num_tokens)

    @torch.inference_mode()
    def decode(self, token_id: int, position: int, slot: int = 0) -> torch.Tensor:
        return self.verify([token_id], position, greedy=False, slot=slot)[0]

    @torch.inference_mode()
    def decode_greedy(self, token_id: int, position: int, slot: int = 0) -> int:
        return self.verify([token_id], position, greedy=True, slot=slot)[0]

    @torch.inference_mode()
    def verify(self, ids: list[int], position: int, greedy: bool, slot: int = 0) -> list[int] | torch.Tensor:
        """Greedy tokens [len(ids)] or logits [len(ids), V] after each of ids at position.."""
        out = self.decode_batch([DecodeRows(slot, ids, position, greedy)])[0]
        return out.tokens if greedy else out.logits

    @torch.inference_mode()
    def decode_batch(self, batch: list[DecodeRows]) -> list[DecodeResult]:
        """One decode-like step for each entry (module docstring); results in batch order."""
        if not self.batched:
            out = [self._decode_one(rows) for rows in batch]
        else:
            out, group, n = [], [], 0
            for rows in batch:
                if group and n + len(rows.ids) > NATIVE_MAX_ROWS:
                    out += self._decode_rows(group)
                    group, n = [], 0
                group.append(rows)
                n += len(rows.ids)
            out += self._decode_rows(group)
        self.last_hidden = out[-1].hidden
        return out

    def _decode_one(self, rows: DecodeRows) -> DecodeResult:
        if self.static_steps:
            if rows.slot not in self.static:
                self.static[rows.slot] = StaticStep(self.model, self.pool.seqs[rows.slot], use_graph=not self.enforce_eager)
            constrained = rows.greedy and rows.allowed is not None  # the graph's argmax knows no grammar
            step = self.static[rows.slot].run(rows.ids, rows.position, want_logits=not rows.greedy or constrained)
            if constrained:
                tokens = torch.argmax(masked(step.logits, rows.allowed), dim=-1).tolist()
                return DecodeResult(tokens, None, step.hidden)
            return DecodeResult(step.tokens if rows.greedy else None, step.logits, step.hidden)
        return self._decode_rows([rows])[0]

    def _decode_rows(self, batch: list[DecodeRows]) -> list[DecodeResult]:
        """All rows in one forward; each row attends over its own sequence's cache."""
        caches = self.pool.seqs
        if len(batch) == 1:  # one sequence: also what the per-op torch path runs (contiguous positions)
            meta = caches[batch[0].slot].metadata(batch[0].position, len(batch[0].ids), decode_like=True)
        else:
            meta = decode_metadata([(caches[r.slot], r.position + i) for r in batch for i in range(len(r.ids))])
        embeds, ple_ids = self.model.embed(self._ids([t for r in batch for t in r.ids]))
        hidden = self.model(embeds, ple_ids, meta, caches[batch[0].slot])  # [rows, D]
        row_of = [(i, k) for i, r in enumerate(batch) for k in range(len(r.ids))]  # [rows] (entry, its k-th row)
        greedy = [j for j, (i, _) in enumerate(row_of) if batch[i].greedy]
        sampled = [j for j, (i, _) in enumerate(row_of) if not batch[i].greedy]
        masks = [None if batch[i].allowed is None else batch[i].allowed[k] for i, k in (row_of[j] for j in greedy)]
        allowed = masks if any(m is not None for m in masks) else None
        tokens = iter(self.model.greedy_tokens(hidden if not sampled else hidden[greedy], allowed) if greedy else [])
        logits = self._logits(batch, row_of, hidden, sampled, bool(greedy)) if sampled else None  # [len(sampled), V]
        out, start, done = [], 0, 0
        for r in batch:
            n = len(r.ids)
            h, start = hidden[start : start + n], start + n
            if r.greedy:
                out.append(DecodeResult([next(tokens) for _ in range(n)], None, h))
            else:
                out.append(DecodeResult(None, logits[done : done + n], h))
                done += n
        return out

    def _logits(self, batch: list[DecodeRows], row_of: list[tuple[int, int]], hidden: torch.Tensor, sampled: list[int],
                any_greedy: bool) -> torch.Tensor:
        """The logits of the rows `sampled` (indices into hidden [rows, D]) -> [len(sampled), V]:
        full, or screened where the rows' entries ask only for a processed argmax (`keep`)."""
        entries = [batch[i] for i, _ in (row_of[j] for j in sampled)]
        kept = [n for n, e in enumerate(entries) if e.keep is not None]
        if not kept:
            return self.model.compute_logits(hidden if not any_greedy else hidden[sampled])
        full = [n for n, e in enumerate(entries) if e.keep is None]
        grammar = [None if e.allowed is None else e.allowed[row_of[sampled[n]][1]] for n, e in ((n, entries[n]) for n in kept)]
        screened = self.model.screened_logits(hidden[[sampled[n] for n in kept]], [entries[n].keep for n in kept], grammar)
        if not full:
            return screened
        logits = torch.empty(len(sampled), screened.shape[1], dtype=screened.dtype)
        logits[kept] = screened
        logits[full] = self.model.compute_logits(hidden[[sampled[n] for n in full]])
        return logits

    @torch.inference_mode()
    def prompt_logprobs(self, ids: list[int], top: int = 0, slot: int = 0) -> list[PositionLogprob | None]:
        """Entry i scores ids[i] given ids[:i]; entry 0 is None (nothing to condition on).
        Writes the slot's cache (the engine lends a free one)."""
        out: list[PositionLogprob | None] = [None]
        for s in range(0, len(ids), self.prefill_chunk):
            chunk = ids[s : s + self.prefill_chunk]
            hidden = self._forward(chunk, s, None, slot)  # [T, D]
            for h0 in range(0, hidden.shape[0], self.logits_chunk):
                rows = hidden[h0 : h0 + self.logits_chunk]
                targets = ids[s + h0 + 1 : s + h0 + 1 + rows.shape[0]]
                if not targets:
                    break
                rows = rows[: len(targets)]
                logp = torch.log_softmax(self.model.compute_logits(rows).float(), dim=-1)  # [n, V]
                tgt = self._ids(targets)
                chosen = logp.gather(1, tgt[:, None])[:, 0]  # [n]
                ranks = (logp > chosen[:, None]).sum(-1) + 1
                tops = torch.topk(logp, top, dim=-1) if top > 0 else None
                for j in range(len(targets)):
                    top_list = (
                        list(zip(tops.indices[j].tolist(), tops.values[j].tolist())) if tops is not None else []
                    )
                    out.append(PositionLogprob(float(chosen[j]), int(ranks[j]), top_list))
        return out
