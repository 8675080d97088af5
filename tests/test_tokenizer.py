"""Incremental detokenisation: the concatenated deltas equal a one-shot decode, never half a character."""

from __future__ import annotations

import json
import logging

from fastgemma.tokenizer import GEMMA_TURN_TEMPLATE, IncrementalDecoder, Tokenizer
from fastgemma.weights.checkpoint import gguf_meta_folder
from fastgemma.weights.source import embedded_model_path


def test_deltas_concatenate_to_full_decode():
    tok = Tokenizer.from_folder(gguf_meta_folder(embedded_model_path()))
    text = "Héllo wörld — 日本語のテキスト 🙂🙂 and  double  spaces\nnew line"
    ids = tok.encode(text, add_special_tokens=False)
    dec = IncrementalDecoder(tok)
    deltas = [dec.push(i) for i in ids] + [dec.flush()]
    assert "".join(deltas) == tok.decode(ids)
    assert not any("\ufffd" in d for d in deltas)


def test_chat_template_fallback_is_gemma_turns(caplog):
    tok = Tokenizer.from_folder(gguf_meta_folder(embedded_model_path()))
    assert not tok.has_chat_template  # the embedded GGUF carries none; its folder holds the fallback
    messages = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi"}]
    with caplog.at_level(logging.WARNING, logger="fastgemma.tokenizer"):
        text = tok.apply_chat_template(messages)
        tok.apply_chat_template(messages)
    assert text == "<bos><start_of_turn>user\nBe brief.\n\nHi<end_of_turn>\n<start_of_turn>model\n"
    assert len([r for r in caplog.records if "no chat template" in r.message]) == 1  # said once


def test_converted_folder_carries_the_template_for_other_tools():
    """transformers alone, reading the folder, builds the prompt the server builds."""
    from transformers import AutoTokenizer

    folder = gguf_meta_folder(embedded_model_path())
    assert json.loads((folder / "tokenizer_config.json").read_text())["chat_template"] == GEMMA_TURN_TEMPLATE
    hf = AutoTokenizer.from_pretrained(folder)
    messages = [{"role": "user", "content": "Hi"}]
    ours = Tokenizer.from_folder(folder)
    assert hf.apply_chat_template(messages, tokenize=False, add_generation_prompt=True) == ours.apply_chat_template(messages)
