"""The Python API, in vLLM's names: `LLM(model=...).generate(prompts, SamplingParams(...))`.

Owns text: prompts are encoded here, outputs decoded here, stop strings matched here
(`RequestStream`). The engine below sees token ids only and batches whatever is unfinished:
`generate` with many prompts runs them together (up to `max_num_seqs` at once), and streams
may be consumed interleaved (each one's loop steps the shared engine when it has nothing new).

    llm = LLM()                                   # the embedded Gemma 3 270M
    out = llm.generate(["Hello"], SamplingParams(max_tokens=32, temperature=0.0))[0]
    out.text, out.token_ids
    llm.generate("Hi", SamplingParams(n=4, temperature=0.8))[0].outputs  # 4 choices, one prompt computation
    llm.score(ids)                                # logprob of each token given its prefix

Multimodal Gemma 4 (vLLM's prompt dicts; the towers run at prefill, models/towers.py):

    llm.generate([{"prompt": "<|image|> What is this?", "multi_modal_data": {"image": [img]}}])
    llm.generate([{"prompt_token_ids": ids, "multi_modal_data": {"audio": [(wave, 16000)]}}])
    llm.chat([{"role": "user", "content": [{"type": "image_url", "image_url": {"url": data_url}},
                                           {"type": "text", "text": "Describe it."}]}])
"""

from __future__ import annotations

from collections.abc import Iterator
from collections.abc import Sequence as Seq
from dataclasses import fields
from typing import Any

from fastgemma.config import EngineConfig
from fastgemma.engine.llm_engine import LLMEngine
from fastgemma.engine.model_runner import ModelRunner, PositionLogprob
from fastgemma.engine.mtp import MtpProposer
from fastgemma.engine.ngram import NgramProposer
from fastgemma.engine.prefix_cache import PrefixCache
from fastgemma.engine.sampling_params import SamplingParams
from fastgemma.engine.sequence import Sequence
from fastgemma.engine.structured_output import GrammarCompiler
from fastgemma.kernels.cpu import set_cpu_threads
from fastgemma.models.towers import MultimodalInputs
from fastgemma.multimodal.chat import split_media
from fastgemma.multimodal.processor import MultimodalProcessor
from fastgemma.outputs import CompletionOutput, RequestOutput, StreamDelta
from fastgemma.tokenizer import IncrementalDecoder
from fastgemma.tools import tool_format
from fastgemma.weights import load
from fastgemma.weights.assistant import load_assistant

Prompt = str | list[int] | dict[str, Any]  # dict: {"prompt" | "prompt_token_ids", "multi_modal_data"}


class LLM:
    """`LLM(model=None, **options)`: the options are `EngineConfig`'s fields (config.py), by
    name (dtype, max_model_len, quantization, speculative, ...); an option given as None
    takes its default. `LLM.from_config(config)` takes a built `EngineConfig`."""

    def __init__(self, model: str | None = None, **options: Any):
        config = options.pop("config", None)
        if config is None:
            unknown = sorted(set(options) - {f.name for f in fields(EngineConfig)})
            if unknown:
                raise ValueError(f"unknown LLM option {unknown[0]!r}; the options are EngineConfig's fields")
            config = EngineConfig(model=model, **{k: v for k, v in options.items() if v is not None})
        c = self.config = config
        if c.threads is not None and c.torch_device().type == "cpu":  # asked for: this process's threads
            set_cpu_threads(c.threads)
        loaded = load(c)
        self.source, self.spec, self.tokenizer = loaded.source, loaded.spec, loaded.tokenizer
        self.tool_format = tool_format(loaded.tokenizer)  # how tools reach the prompt and calls come back
        self.model = loaded.model
        self.max_model_len = loaded.max_model_len
        self.quantization = loaded.quantization
        self.processor = None  # Gemma 4 image / audio preprocessing, when the checkpoint has towers
        if (towers := loaded.towers) is not None:
            self.processor = MultimodalProcessor(loaded.source.path, loaded.hf_config, towers.has_vision, towers.has_audio)
        # CUDA: every decode and verification through one fixed-shape step (a CUDA graph)
        static_steps = c.torch_device().type == "cuda" and c.kernels == "auto"
        if c.speculative != "none":
            _check_speculative(loaded.model, static_steps)
        # Spare ring slots: a K-token verification needs K (models/kv_cache.py); the MTP
        # assistant also reads one position further back than a sliding query (models/assistant.py).
        spare = {"none": 0, "ngram": c.num_speculative_tokens, "mtp": c.num_speculative_tokens + 1}[c.speculative]
        self.runner = ModelRunner(
            loaded.model, loaded.max_model_len, prefill_chunk=c.prefill_chunk, num_speculative_tokens=spare,
            towers=loaded.towers, static_steps=static_steps, enforce_eager=c.enforce_eager,
            max_num_seqs=c.max_num_seqs,
        )
        proposer: NgramProposer | MtpProposer | None = None
        if c.speculative == "ngram":
            proposer = NgramProposer(c.num_speculative_tokens, c.prompt_lookup_min, c.prompt_lookup_max)
        elif c.speculative == "mtp":
            assistant = load_assistant(
                c.draft_model, loaded.spec, loaded.model.dtype, self.runner.device, loaded.max_model_len,
                loaded.model.kernels,
            )
            proposer = MtpProposer(assistant, loaded.model, self.runner.cache, c.num_speculative_tokens)
        grammars = GrammarCompiler(self.tokenizer.hf, loaded.spec.vocab_size, loaded.spec.eos_token_ids)
        prefix_cache = None
        if c.enable_prefix_caching and c.cache_ram > 0:
            prefix_cache = PrefixCache(c.prefill_chunk, c.cache_ram << 20)
        self.engine = LLMEngine(
            self.runner, loaded.spec.eos_token_ids, loaded.spec.vocab_size, proposer, c.max_num_batched_tokens,
            grammars, prefix_cache,
        )

    @classmethod
    def from_config(cls, config: EngineConfig) -> LLM:
        return cls(config=config)

    @property
    def model_name(self) -> str:
        return self.source.name

    # ---- prompts -------------------------------------------------------------------------

    def encode_prompt(self, prompt: str | list[int], add_special_tokens: bool = True) -> list[int]:
        if isinstance(prompt, str):
            if not prompt:
                raise ValueError("the prompt is empty; give some text or token ids")
            self.check_text_fits(prompt)
            return self.tokenizer.encode(prompt, add_special_tokens=add_special_tokens)
        if isinstance(prompt, (list, tuple)) and all(isinstance(t, int) and not isinstance(t, bool) for t in prompt):
            return list(prompt)
        raise ValueError("a prompt is a string or a list of integer token ids")

    def chat_prompt_ids(self, messages: list[dict[str, Any]], tools: list[dict[str, Any]] | None = None) -> list[int]:
        """The templated conversation's ids; `tools` offered in the model's tool format
        (fastgemma/tools: Gemma 4's own, or the Hermes default)."""
        messages, template_tools = self.tool_format.prompt(messages, tools or None)
        text = self.tokenizer.apply_chat_template(messages, add_generation_prompt=True, tools=template_tools)
        self.check_text_fits(text)
        return self.tokenizer.encode(text, add_special_tokens=False)

    def check_text_fits(self, text: str) -> None:
        """ValueError, before tokenising, for a text longer in bytes than max_model_len tokens
        can hold: a 50 MB prompt is refused at once, not after a minute of tokenising."""
        limit = self.max_model_len * self.tokenizer.max_token_bytes
        if len(text) > limit or len(text.encode("utf-8", "surrogatepass")) > limit:
            raise ValueError(
                f"the prompt is {len(text.encode('utf-8', 'surrogatepass'))} bytes, more than max_model_len "
                f"{self.max_model_len} tokens can hold (at most {self.tokenizer.max_token_bytes} bytes each); shorten it"
            )

    def encode_inputs(self, prompt: Prompt) -> tuple[list[int], MultimodalInputs | None]:
        """A prompt (text, ids, or vLLM's dict with `multi_modal_data`) -> (ids with soft-token
        slots, tower inputs or None)."""
        if not isinstance(prompt, dict):
            return self.encode_prompt(prompt), None
        text, ids = prompt.get("prompt"), prompt.get("prompt_token_ids")
        if (text is None) == (ids is None):
            raise ValueError('a prompt dict has exactly one of "prompt" and "prompt_token_ids"')
        data = prompt.get("multi_modal_data") or {}
        if unknown := set(data) - {"image", "audio"}:
            raise ValueError(f"multi_modal_data takes image and audio; got {sorted(unknown)}")
        images, audios = _as_list(data.get("image")), _as_list(data.get("audio"), tuple)
        return self.process_media(self.encode_prompt(text if ids is None else ids), images, audios)

    def process_media(
        self, ids: list[int], images: list[Any], audios: list[tuple[Any, int]]
    ) -> tuple[list[int], MultimodalInputs | None]:
        if not images and not audios:
            return ids, None
        if self.processor is None:
            kind = "vision" if images else "audio"
            raise ValueError(f"this model has no {kind} tower; it cannot take {'images' if images else 'audio'}")
        if images and self.runner.towers.bidirectional_vision:
            raise ValueError("this model attends bidirectionally within images, which fastgemma does not; no images")
        return self.processor.process(ids, images, audios)

    def chat_inputs(
        self, messages: list[dict[str, Any]], allow_remote_media: bool = False, tools: list[dict[str, Any]] | None = None
    ) -> tuple[list[int], MultimodalInputs | None]:
        """Chat messages with OpenAI-style content parts (multimodal/chat.py) and OpenAI tool
        objects offered to the model (fastgemma/tools/) -> (ids, tower inputs)."""
        hf, p = self.tokenizer.hf, self.processor
        image_token = hf.convert_ids_to_tokens(p.image_token_id) if p is not None and hf is not None else ""
        audio_token = hf.convert_ids_to_tokens(p.audio_token_id) if p is not None and hf is not None else ""
        media = split_media(messages, image_token, audio_token, self.tokenizer.has_chat_template, allow_remote_media)
        return self.process_media(self.chat_prompt_ids(media.messages, tools), media.images, media.audios)

    # ---- generation ----------------------------------------------------------------------

    def generate(
        self, prompts: Prompt | Seq[Prompt], sampling_params: SamplingParams | None = None
    ) -> list[RequestOutput]:
        params = sampling_params or SamplingParams()
        if isinstance(prompts, (str, dict)) or (prompts and isinstance(prompts[0], int)):
            prompts = [prompts]  # type: ignore[list-item]
        encoded = [self.encode_inputs(p) for p in prompts]  # validate all before running any
        for ids, _ in encoded:
            self.engine.validate_prompt(ids)
        outputs = []
        for i, (prompt, (ids, _), choices) in enumerate(zip(prompts, encoded, self._run_all(encoded, params))):
            prompt_text = prompt.get("prompt") if isinstance(prompt, dict) else prompt
            outputs.append(RequestOutput(str(i), prompt_text if isinstance(prompt_text, str) else None, ids, choices))
        return outputs

    def _run_all(
        self, encoded: list[tuple[list[int], MultimodalInputs | None]], params: SamplingParams
    ) -> list[list[CompletionOutput]]:
        """Every prompt's `params.n` choices, run together to the end: [prompt][choice]."""
        groups = [self.add_choices(ids, params, mm) for ids, mm in encoded]
        streams = [s for group in groups for s in group]
        texts = {id(s): "" for s in streams}
        try:
            while not all(s.closed for s in streams):
                self.engine.step()
                for s in streams:
                    texts[id(s)] += "".join(d.text for d in s.pull())
        finally:
            for s in streams:
                self.engine.finish(s.seq, "abort")  # no-op when finished
        return [[_completion(s.seq, texts[id(s)], j) for j, s in enumerate(group)] for group in groups]

    def chat(
        self,
        messages: list[dict[str, Any]],
        sampling_params: SamplingParams | None = None,
        allow_remote_media: bool = False,
        tools: list[dict[str, Any]] | None = None,
    ) -> RequestOutput:
        """One chat turn; content parts may carry images and audio (multimodal/chat.py).
        Remote image URLs are fetched only with `allow_remote_media`. `tools`: OpenAI tool
        objects offered to the model (calls come back as text: `llm.tool_format.parse`)."""
        ids, mm = self.chat_inputs(messages, allow_remote_media, tools)
        self.engine.validate_prompt(ids)
        return RequestOutput("0", None, ids, self._run_all([(ids, mm)], sampling_params or SamplingParams())[0])

    def stream(self, prompt: Prompt, sampling_params: SamplingParams | None = None) -> Iterator[StreamDelta]:
        """Yield text deltas as tokens are generated; closing the iterator cancels the request."""
        ids, mm = self.encode_inputs(prompt)
        for delta, _ in self.stream_ids(ids, sampling_params or SamplingParams(), mm):
            yield delta

    def add_request(
        self, ids: list[int], params: SamplingParams, multimodal: MultimodalInputs | None = None
    ) -> RequestStream:
        """Queue one token-id prompt in the engine (`params.n` 1); its text comes from the
        returned stream's `pull()` as the engine steps."""
        return RequestStream(self.engine, self.tokenizer, self.engine.add_request(ids, params, multimodal))

    def add_choices(
        self, ids: list[int], params: SamplingParams, multimodal: MultimodalInputs | None = None
    ) -> list[RequestStream]:
        """`add_request` for the `params.n` choices of one prompt (the prompt computed once;
        engine/llm_engine.py): a stream per choice."""
        return [RequestStream(self.engine, self.tokenizer, seq) for seq in self.engine.add_choices(ids, params, multimodal)]

    def stream_ids(
        self, ids: list[int], params: SamplingParams, multimodal: MultimodalInputs | None = None
    ) -> Iterator[tuple[StreamDelta, Sequence]]:
        """Run one token-id prompt (with its tower inputs, if any); yield each token's delta with
        the live `Sequence` (its `output_logprobs` when `params.logprobs` is set). The engine
        steps whenever this stream has nothing new, advancing every unfinished request.
        Closing the iterator aborts it."""
        if params.n != 1:
            raise ValueError(f"a stream yields one choice (n={params.n}); use generate() for n > 1")
        stream = self.add_request(ids, params, multimodal)
        try:
            while not stream.closed:
                deltas = stream.pull()
                if not deltas and not stream.closed:
                    self.engine.step()
                for delta in deltas:
                    yield delta, stream.seq
        finally:
            self.engine.finish(stream.seq, "abort")  # no-op when already finished

    # ---- scoring -------------------------------------------------------------------------

    def score(self, token_ids: list[int]) -> list[float | None]:
        """log p(ids[i] | ids[:i]) for every position; the first entry is None."""
        return [None if e is None else e.logprob for e in self.prompt_logprobs(token_ids)]

    def prompt_logprobs(self, token_ids: list[int], top: int = 0) -> list[PositionLogprob | None]:
        """Teacher-forced scores of every position, in a cache slot of its own: running
        requests are not disturbed (engine/llm_engine.py)."""
        self.engine.validate_prompt(token_ids)
        return self.engine.prompt_logprobs(list(token_ids), top)


class RequestStream:
    """One request's text as the engine advances its sequence: `pull()` turns the tokens it
    got since the last pull into `StreamDelta`s (one per token), UTF-8 safe, holding back
    text that could begin a stop string; a matched stop string ends the sequence there (one
    that ends before the `min_tokens`-th token's text does not count).
    `closed` once the last delta was given."""

    def __init__(self, engine: LLMEngine, tokenizer: Any, seq: Sequence):
        self.engine, self.seq, params = engine, seq, seq.params
        self.decoder = IncrementalDecoder(tokenizer, params.skip_special_tokens)
        self.hold = max((len(s) for s in params.stop), default=1) - 1  # chars held back
        self.text, self.emitted, self.done = "", 0, 0  # all text, text given out, tokens seen
        self.stop_floor = 0  # a stop string counts only if it ends after text[:stop_floor] (min_tokens)
        self.closed = False

    def pull(self) -> list[StreamDelta]:
        seq, params, out = self.seq, self.seq.params, []
        new, ended = seq.output_token_ids[self.done :], seq.is_finished
        if ended and not new:
            self.closed = True  # finished without a new token (aborted)
        for i, token_id in enumerate(new):
            self.done += 1
            last = ended and i == len(new) - 1
            if self.done == params.min_tokens:  # vLLM's min_tokens: a stop string must end in this token or later
                self.stop_floor = len(self.text)
            self.text += self.decoder.push(token_id)
            if last:
                self.text += self.decoder.flush()
            if params.stop and self.done >= params.min_tokens and (
                cut := _find_stop(self.text, params.stop, max(0, self.emitted - self.hold), self.stop_floor)
            ) >= 0:
                self.text, last = self.text[:cut], True
                self.engine.finish(seq, "stop", num_output_tokens=self.done)
            end = len(self.text) if last else max(self.emitted, len(self.text) - self.hold)
            delta, self.emitted = self.text[self.emitted : end], end
            out.append(StreamDelta(delta, token_id, seq.finish_reason if last else None))
            if last:
                self.closed = True
                break
        return out


def _completion(seq: Sequence, text: str, index: int = 0) -> CompletionOutput:
    logprobs = seq.output_logprobs if seq.params.logprobs is not None else None
    return CompletionOutput(index, text, list(seq.output_token_ids), seq.finish_reason, logprobs)


def _check_speculative(model, static_steps: bool) -> None:
    """Verification is exact only where every row runs as its own decode step: the
    row-invariant native CPU kernels, or CUDA's fixed-shape step (engine/static_step.py);
    say what to change elsewhere."""
    if not (model.kernels.native or static_steps):
        raise ValueError(
            "speculative decoding needs fastgemma's kernels (a CPU with AVX2 + FMA, or CUDA; kernels=auto); "
            "on this configuration use speculative=none"
        )
    if model.spec.attn_softcap is not None:
        raise ValueError("speculative decoding does not support attention logit softcapping; use speculative=none")


def _as_list(value: Any, item: type | None = None) -> list[Any]:
    """One item or a list of them (`item`: the type a single item has, e.g. an audio tuple)."""
    if value is None:
        return []
    if isinstance(value, list):
        return value
    if item is not None and not isinstance(value, item):
        raise ValueError(f"expected a {item.__name__} or a list of them, got {type(value).__name__}")
    return [value]


def _find_stop(text: str, stops: list[str], start: int, floor: int = 0) -> int:
    """Index of the earliest stop string in text[start:] that ends after text[:floor], or -1."""
    hits = [i for s in stops if (i := text.find(s, max(start, floor - len(s) + 1))) >= 0]
    return min(hits, default=-1)
