"""Exact prefix caching: computed prompt chunks kept for later prompts that begin the same.

A prompt is computed in chunks of `prefill_chunk` tokens at absolute boundaries (multiples of
the chunk size; engine/model_runner.py). A chunk's K/V depend only on the tokens up to its
end, and any prompt that begins with those tokens computes that chunk with the same shape
and the same ops. So a copy of a kept chunk is, bit for bit, what computing it would write:
a cache hit gives the same numbers as a miss, and a request's tokens do not depend on what
ran before it.

    lookup(ids, media)     the kept chunks that begin the prompt: [0, C), [C, 2C), ... as
                           long as they are consecutive, never reaching its last token (its
                           hidden row picks the first output token, so the chunk holding it
                           always runs); the engine loads them into the sequence's slot and
                           computes the rest
    store(ids, end, save, media)
                           keep the whole chunk ending at `end` that a sequence has just
                           computed (`save` copies it out of its slot: the full layers' K/V
                           of its positions and every sliding ring as it stood after it,
                           models/kv_cache.py `SavedChunk`)

Only whole chunks are kept (a prompt's shorter last chunk runs with another shape). A chunk
is keyed by all the token ids up to its end and the key is compared in full, so no hash
collision can hand a prompt another's K/V (media, below, go in as a SHA-256). Memory is
bounded by `capacity_bytes`; the least recently used chunk goes first, and a chunk is always
used more recently than the chunks after it (a lookup touches the last found first), so what
goes is the end of a prefix, never a middle that would strand what follows.

Prompts with images or audio: their placeholder ids do not say what the towers computed, so
a chunk with placeholders before its end is keyed by the ids and `media(end)`, the SHA-256 of
all the prompt's media inputs (`MultimodalInputs.digest`; the towers' rows are a function of
them and of the ids); a chunk before the first placeholder has the ids alone (b""), so it is
shared with text-only prompts (`media_key`). When the kept chunks reach past the last
placeholder, the rest of the prompt is text and the towers need not run at all (the engine
skips them).

Why chunks rather than vLLM's 16-token blocks: a finer reuse would split a chunk, and a bf16
prefill's rounding depends on the chunk's shape; a smaller `--prefill-chunk` gives finer reuse
at the cost of prefill speed. Why copies rather than shared blocks: a sequence's cache is a
static slot (models/kv_cache.py says why), and copying a chunk costs far less than computing it.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable

from fastgemma.models.kv_cache import SavedChunk

Key = tuple[tuple[int, ...], bytes]  # the ids up to a chunk's end, its media's digest (b"": none before it)
Media = Callable[[int], bytes]  # chunk end -> that digest (`media_key`)


def media_key(first_placeholder: int, digest: bytes) -> Media:
    """`media` for a prompt whose first media placeholder sits at `first_placeholder` and
    whose media inputs have `digest`: end -> digest for chunks that hold a placeholder, else b""."""
    return lambda end: digest if end > first_placeholder else b""


class PrefixCache:
    def __init__(self, chunk: int, capacity_bytes: int):
        assert chunk >= 1 and capacity_bytes >= 0
        self.chunk, self.capacity_bytes = chunk, capacity_bytes
        self.entries: OrderedDict[Key, SavedChunk] = OrderedDict()  # a chunk's key -> it; LRU first
        self.nbytes = 0
        self.queries = 0  # prompt tokens looked up (vLLM's prefix_cache_queries)
        self.hits = 0  # of them, found kept (vLLM's prefix_cache_hits)

    @staticmethod
    def _key(ids: list[int], end: int, media: Media | None) -> Key:
        return tuple(ids[:end]), (media(end) if media is not None else b"")

    def lookup(self, ids: list[int], media: Media | None = None) -> list[SavedChunk]:
        """The kept chunks that begin `ids` (with `media`: a prompt with images / audio), in
        order (module docstring); [] when none."""
        found: list[tuple[Key, SavedChunk]] = []
        for end in range(self.chunk, len(ids), self.chunk):  # chunk ends strictly before the last token
            key = self._key(ids, end, media)
            if (entry := self.entries.get(key)) is None:
                break
            found.append((key, entry))
        for key, _ in reversed(found):  # the first chunk ends up most recent
            self.entries.move_to_end(key)
        self.queries += len(ids)
        self.hits += len(found) * self.chunk
        return [entry for _, entry in found]

    def store(self, ids: list[int], end: int, save: Callable[[], SavedChunk], media: Media | None = None) -> None:
        """Keep the whole chunk of `ids` ending at `end` (a multiple of the chunk size), just
        computed; `save()` copies it out of the sequence's slot, called only if it is new."""
        assert end % self.chunk == 0 and end <= len(ids), (end, self.chunk, len(ids))
        key = self._key(ids, end, media)
        if key not in self.entries:
            entry = save()
            if entry.nbytes > self.capacity_bytes:
                return
            self.entries[key] = entry
            self.nbytes += entry.nbytes
        for e in range(end, 0, -self.chunk):  # the chunks before it: more recent than it
            if (k := self._key(ids, e, media)) in self.entries:
                self.entries.move_to_end(k)
        while self.nbytes > self.capacity_bytes:
            _, old = self.entries.popitem(last=False)
            self.nbytes -= old.nbytes

    def clear(self) -> None:
        self.entries.clear()
        self.nbytes = 0
