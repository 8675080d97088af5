"""The Python API, in vLLM's names: `LLM(model=...).generate(prompts, SamplingParams(...))`.

Owns text: prompts are encoded here, outputs decoded here, stop strings matched here. The
engine below sees token ids only. One request runs at a time, in submission order.

    llm = LLM()                                   # the embedded Gemma 3 270M
    out = llm.generate(["Hello"], SamplingParams(max_tokens=32, temperature=0.0))[0]
    out.text, out.token_ids
    llm.score(ids)                                # logprob of each token given its prefix
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence as Seq
from typing import Any

import torch

from fastgemma.config import EngineConfig, physical_cores
from fastgemma.engine.llm_engine import LLMEngine
from fastgemma.engine.model_runner import ModelRunner, PositionLogprob
from fastgemma.engine.ngram import NgramProposer
from fastgemma.engine.sampling_params import SamplingParams
from fastgemma.engine.sequence import Sequence
from fastgemma.kernels import native
from fastgemma.outputs import CompletionOutput, RequestOutput, StreamDelta
from fastgemma.tokenizer import IncrementalDecoder
from fastgemma.weights import load

Prompt = str | list[int]


class LLM:
    def __init__(
        self,
        model: str | None = None,
        dtype: str = "auto",
        max_model_len: int | None = None,
        device: str | None = None,
        prefill_chunk: int = 512,
        kernels: str = "auto",
        threads: int | None = None,
        quantization: str | None = None,
        lm_head_screen: bool = True,
        speculative: str | None = None,
        num_speculative_tokens: int = 4,
        prompt_lookup_min: int = 2,
        prompt_lookup_max: int = 4,
    ):
        self.config = EngineConfig(
            model=model, dtype=dtype, max_model_len=max_model_len, device=device, prefill_chunk=prefill_chunk,
            kernels=kernels, threads=threads, quantization=quantization or "none", lm_head_screen=lm_head_screen,
            speculative=speculative or "none", num_speculative_tokens=num_speculative_tokens,
            prompt_lookup_min=prompt_lookup_min, prompt_lookup_max=prompt_lookup_max,
        )
        if self.config.torch_device().type == "cpu":
            torch.set_num_threads(self.config.threads or physical_cores())
        loaded = load(self.config)
        loaded.model.set_native_kernels(
            self.config.kernels == "auto" and native.load() is not None, lm_head_screen=self.config.lm_head_screen
        )
        self.source, self.spec, self.tokenizer = loaded.source, loaded.spec, loaded.tokenizer
        self.model = loaded.model
        self.max_model_len = loaded.max_model_len
        self.quantization = loaded.quantization
        proposer, spare = None, 0
        if self.config.speculative == "ngram":
            _check_speculative(loaded.model)
            c = self.config
            proposer = NgramProposer(c.num_speculative_tokens, c.prompt_lookup_min, c.prompt_lookup_max)
            spare = c.num_speculative_tokens  # ring slots a K-token verification needs (engine/kv_cache.py)
        self.runner = ModelRunner(
            loaded.model, loaded.max_model_len, prefill_chunk=prefill_chunk, num_speculative_tokens=spare
        )
        self.engine = LLMEngine(self.runner, loaded.spec.eos_token_ids, loaded.spec.vocab_size, proposer)

    @property
    def model_name(self) -> str:
        return self.source.name

    # ---- prompts -------------------------------------------------------------------------

    def encode_prompt(self, prompt: Prompt, add_special_tokens: bool = True) -> list[int]:
        if isinstance(prompt, str):
            if not prompt:
                raise ValueError("the prompt is empty; give some text or token ids")
            return self.tokenizer.encode(prompt, add_special_tokens=add_special_tokens)
        if isinstance(prompt, (list, tuple)) and all(isinstance(t, int) and not isinstance(t, bool) for t in prompt):
            return list(prompt)
        raise ValueError("a prompt is a string or a list of integer token ids")

    def chat_prompt_ids(self, messages: list[dict[str, Any]]) -> list[int]:
        text = self.tokenizer.apply_chat_template(messages, add_generation_prompt=True)
        return self.tokenizer.encode(text, add_special_tokens=False)

    # ---- generation ----------------------------------------------------------------------

    def generate(
        self, prompts: Prompt | Seq[Prompt], sampling_params: SamplingParams | None = None
    ) -> list[RequestOutput]:
        params = sampling_params or SamplingParams()
        if isinstance(prompts, str) or (prompts and isinstance(prompts[0], int)):
            prompts = [prompts]  # type: ignore[list-item]
        encoded = [self.encode_prompt(p) for p in prompts]  # validate all before running any
        for ids in encoded:
            self.engine.validate_prompt(ids)
        outputs = []
        for i, (prompt, ids) in enumerate(zip(prompts, encoded)):
            text = ""
            for delta, seq in self.stream_ids(ids, params):
                text += delta.text
            logprobs = seq.output_logprobs if params.logprobs is not None else None
            completion = CompletionOutput(0, text, list(seq.output_token_ids), seq.finish_reason, logprobs)
            outputs.append(RequestOutput(str(i), prompt if isinstance(prompt, str) else None, ids, [completion]))
        return outputs

    def chat(self, messages: list[dict[str, Any]], sampling_params: SamplingParams | None = None) -> RequestOutput:
        return self.generate([self.chat_prompt_ids(messages)], sampling_params)[0]

    def stream(self, prompt: Prompt, sampling_params: SamplingParams | None = None) -> Iterator[StreamDelta]:
        """Yield text deltas as tokens are generated; closing the iterator cancels the request."""
        for delta, _ in self.stream_ids(self.encode_prompt(prompt), sampling_params or SamplingParams()):
            yield delta

    def stream_ids(self, ids: list[int], params: SamplingParams) -> Iterator[tuple[StreamDelta, Sequence]]:
        """Run one token-id prompt; yield each step's delta with the live `Sequence`
        (its `output_logprobs` when `params.logprobs` is set). Closing the iterator aborts it."""
        seq = self.engine.add_request(ids, params)
        decoder = IncrementalDecoder(self.tokenizer, params.skip_special_tokens)
        # Text that could be the start of a stop string is held back until it cannot be.
        hold = max((len(s) for s in params.stop), default=1) - 1
        text, emitted = "", 0
        done = 0  # output tokens yielded so far
        try:
            while not seq.is_finished:
                if self.engine.next_sequence() is not seq:
                    raise RuntimeError("another request is running on this LLM; consume one stream at a time")
                self.engine.step()  # one token, or several with speculative decoding
                new, ended = seq.output_token_ids[done:], seq.is_finished
                for i, token_id in enumerate(new):
                    done += 1
                    last = ended and i == len(new) - 1
                    text += decoder.push(token_id)
                    if last:
                        text += decoder.flush()
                    stopped = False
                    if params.stop and (cut := _find_stop(text, params.stop, max(0, emitted - hold))) >= 0:
                        text, stopped, last = text[:cut], True, True
                        self.engine.finish(seq, "stop", num_output_tokens=done)
                    end = len(text) if last else max(emitted, len(text) - hold)
                    delta, emitted = text[emitted:end], end
                    yield StreamDelta(delta, token_id, seq.finish_reason if last else None), seq
                    if stopped:
                        break
        finally:
            self.engine.finish(seq, "abort")  # no-op when already finished

    # ---- scoring -------------------------------------------------------------------------

    def score(self, token_ids: list[int]) -> list[float | None]:
        """log p(ids[i] | ids[:i]) for every position; the first entry is None."""
        return [None if e is None else e.logprob for e in self.prompt_logprobs(token_ids)]

    def prompt_logprobs(self, token_ids: list[int], top: int = 0) -> list[PositionLogprob | None]:
        self.engine.validate_prompt(token_ids)
        return self.runner.prompt_logprobs(list(token_ids), top)


def _check_speculative(model) -> None:
    """Verification is exact only where every row runs as its own decode step (row-invariant
    native kernels); say what to change elsewhere."""
    if not model.use_native:
        raise ValueError(
            "speculative decoding needs fastgemma's CPU kernels (a CPU with AVX2 + FMA, kernels=auto); "
            "on this configuration use speculative=none"
        )
    if model.spec.attn_softcap is not None:
        raise ValueError("speculative decoding does not support attention logit softcapping; use speculative=none")


def _find_stop(text: str, stops: list[str], start: int) -> int:
    """Index of the earliest stop string in text[start:], or -1."""
    hits = [i for s in stops if (i := text.find(s, start)) >= 0]
    return min(hits, default=-1)
