"""Incremental detokenisation: the concatenated deltas equal a one-shot decode, never half a character."""

from __future__ import annotations

from fastgemma.tokenizer import IncrementalDecoder, Tokenizer
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


def test_chat_template_fallback_is_gemma_turns():
    tok = Tokenizer.from_folder(gguf_meta_folder(embedded_model_path()))
    assert not tok.has_chat_template  # the embedded GGUF carries none
    text = tok.apply_chat_template([{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi"}])
    assert text == "<bos><start_of_turn>user\nBe brief.\n\nHi<end_of_turn>\n<start_of_turn>model\n"
