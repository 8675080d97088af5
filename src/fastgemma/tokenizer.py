"""Text <-> token ids and chat formatting, on top of the model folder's Hugging Face tokenizer.

Owns: encoding (with or without the model's special tokens), decoding, the chat template
(the folder's own; Gemma's turn format when it has none, as the embedded base model, said
once in the log), and UTF-8-safe incremental detokenisation for streaming. A model folder without tokenizer files
still loads: token-id prompts work, decoded text is empty, and a text prompt raises a
`ValueError` saying so. The engine never sees text.
"""

from __future__ import annotations

import functools
import logging
from pathlib import Path
from typing import Any

log = logging.getLogger(__name__)

GEMMA_TURN_TEMPLATE = (
    "{{ bos_token }}"
    "{%- set system = namespace(text='') -%}"
    "{%- for m in messages -%}"
    "{%- if m['role'] == 'system' -%}{%- set system.text = system.text + m['content'] + '\n\n' -%}"
    "{%- else -%}"
    "{%- set role = 'model' if m['role'] == 'assistant' else m['role'] -%}"
    "{{ '<start_of_turn>' + role + '\n' + (system.text if role == 'user' else '') + m['content'] | trim"
    " + '<end_of_turn>\n' }}"
    "{%- if role == 'user' -%}{%- set system.text = '' -%}{%- endif -%}"
    "{%- endif -%}"
    "{%- endfor -%}"
    "{%- if add_generation_prompt -%}{{ '<start_of_turn>model\n' }}{%- endif -%}"
)


class Tokenizer:
    def __init__(self, hf: Any | None):
        self.hf = hf
        template = getattr(hf, "chat_template", None) if hf is not None else None
        # The model's own template (not fastgemma's fallback, which a converted GGUF folder holds).
        self.has_chat_template = bool(template) and template != GEMMA_TURN_TEMPLATE
        self._fallback_logged = False

    @classmethod
    def from_folder(cls, folder: Path) -> Tokenizer:
        files = ("tokenizer.json", "tokenizer.model", "tokenizer_config.json")
        if not any((folder / f).is_file() for f in files):
            return cls(None)
        from transformers import AutoTokenizer

        return cls(AutoTokenizer.from_pretrained(folder))

    @property
    def available(self) -> bool:
        return self.hf is not None

    def _require(self) -> Any:
        if self.hf is None:
            raise ValueError("this model folder has no tokenizer files; pass token ids instead of text")
        return self.hf

    @functools.cached_property
    def max_token_bytes(self) -> int:
        """The most UTF-8 bytes one token stands for (an upper bound: byte-fallback pieces count
        their spelling): a text of more bytes than max_model_len x this cannot fit."""
        vocab = self._require().get_vocab()
        return max(len(piece.replace("\u2581", " ").encode("utf-8", "surrogatepass")) for piece in vocab)

    def encode(self, text: str, add_special_tokens: bool = True) -> list[int]:
        return list(self._require().encode(text, add_special_tokens=add_special_tokens))

    def decode(self, ids: list[int], skip_special_tokens: bool = True) -> str:
        if self.hf is None:
            return ""
        return self.hf.decode(ids, skip_special_tokens=skip_special_tokens)

    def token_text(self, token_id: int) -> str:
        """The piece of one token as text (for logprob listings)."""
        if self.hf is None:
            return ""
        return self.hf.decode([token_id], skip_special_tokens=False)

    def apply_chat_template(
        self, messages: list[dict[str, Any]], add_generation_prompt: bool = True, tools: list[dict] | None = None
    ) -> str:
        """The prompt text (it starts with <bos>; encode it with add_special_tokens=False).
        `tools`: OpenAI tool objects for a template that renders them (fastgemma/tools)."""
        hf = self._require()
        template = None if self.has_chat_template else GEMMA_TURN_TEMPLATE
        if template is not None and not self._fallback_logged:
            self._fallback_logged = True
            log.warning("this model ships no chat template (a base model?): chat prompts use Gemma's turn "
                        "format, fastgemma's fallback template")
        return hf.apply_chat_template(
            messages, tokenize=False, add_generation_prompt=add_generation_prompt, chat_template=template,
            tools=tools,
        )


class IncrementalDecoder:
    """Turns a growing list of ids into text deltas that never split a UTF-8 character.

    vLLM's scheme: decode a short window `ids[prefix_offset:]` and subtract the text of
    `ids[prefix_offset:read_offset]` (already returned). Both start at the same token, so
    SentencePiece's leading-space rule cancels out; text ending in U+FFFD (an incomplete byte
    sequence) is held back until the next token completes it. Cost per token: O(window).
    """

    def __init__(self, tokenizer: Tokenizer, skip_special_tokens: bool = True):
        self.tokenizer, self.skip = tokenizer, skip_special_tokens
        self.ids: list[int] = []
        self.prefix_offset = 0  # window start
        self.read_offset = 0  # ids[:read_offset] have been returned as text

    def _delta(self, final: bool) -> str:
        decode = self.tokenizer.decode
        prefix = decode(self.ids[self.prefix_offset : self.read_offset], skip_special_tokens=self.skip)
        full = decode(self.ids[self.prefix_offset :], skip_special_tokens=self.skip)
        if len(full) <= len(prefix) or (full.endswith("\ufffd") and not final):
            return ""
        self.prefix_offset, self.read_offset = self.read_offset, len(self.ids)
        return full[len(prefix) :]

    def push(self, token_id: int) -> str:
        self.ids.append(token_id)
        return self._delta(final=False)

    def flush(self) -> str:
        """Whatever is still held back (at the end of generation)."""
        return self._delta(final=True)
