"""Request and response schemas of the OpenAI-compatible API, in vLLM's names and shapes.

Requests are parsed strictly (a string where a number belongs is a 400, not a guess). A
field of OpenAI's or vLLM's request schemas that fastgemma does not honour is refused with
a 400 naming it (`UNSUPPORTED`), unless it has its neutral value; any other unknown field
is ignored and named once in the log, as vLLM does (clients and harnesses send many).
Value checks that need the model (vocabulary, context length, grammars) are done by the routes.
"""

from __future__ import annotations

import time
import uuid
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_serializer, model_validator

MAX_LOGPROBS = 20
SEED_MIN, SEED_MAX = -(2**63), 2**64 - 1

TokenIds = list[int]


class _Request(BaseModel):
    model_config = ConfigDict(strict=True, extra="allow")


class _Strict(BaseModel):
    """A nested object whose every field is ours: an unknown key is a 400 naming it."""

    model_config = ConfigDict(strict=True, extra="forbid", populate_by_name=True)


# Fields of OpenAI's / vLLM's request schemas that fastgemma does not honour, with the values
# that change nothing (accepted); any other value is a 400 naming the field.
UNSUPPORTED: dict[str, tuple[Any, ...]] = {
    "bad_words": (None, []),
    "allowed_token_ids": (None,),
    "logits_processors": (None, []),
    "use_beam_search": (None, False),
    "length_penalty": (None, 1, 1.0),
    "include_stop_str_in_output": (None, False),
    "truncate_prompt_tokens": (None,),
    "prompt_embeds": (None,),
    "functions": (None, []),  # OpenAI's deprecated function calling: use tools
    "function_call": (None,),
    "audio": (None,),
    "modalities": (None, ["text"]),
    "prediction": (None,),
    "web_search_options": (None,),
    "reasoning_effort": (None,),
    "guided_json": (None,),  # vLLM's older names: use structured_outputs / response_format
    "guided_regex": (None,),
    "guided_choice": (None,),
    "guided_grammar": (None,),
    "guided_decoding_backend": (None,),
    "guided_whitespace_pattern": (None,),
    "chat_template": (None,),
    "chat_template_kwargs": (None, {}),
    "continue_final_message": (None, False),
    "documents": (None,),
    "mm_processor_kwargs": (None, {}),
    "priority": (None, 0),
    "logprobs_mode": (None,),
    "vllm_xargs": (None, {}),
    "kv_transfer_params": (None,),
    "echo": (None, False),  # a field of /v1/completions, not of chat
    "prompt_logprobs": (None,),
    "add_generation_prompt": (None, True),
    "spaces_between_special_tokens": (None, True),
    "return_tokens_as_token_ids": (None, False),
}
# Fields that change nothing fastgemma computes, accepted as they come (OpenAI bookkeeping).
ACCEPTED = {"store", "metadata", "service_tier", "request_id", "safety_identifier", "prompt_cache_key", "cache_salt"}


class StreamOptions(_Request):
    include_usage: bool | None = False
    continuous_usage_stats: bool | None = False


class StructuredOutputs(_Strict):
    """vLLM's `structured_outputs` (engine/structured_output.py): exactly one constraint."""

    json_: dict[str, Any] | str | None = Field(default=None, alias="json")
    json_object: bool | None = None
    regex: str | None = None
    choice: list[str] | None = None
    grammar: str | None = None
    structural_tag: dict[str, Any] | str | None = None
    disable_any_whitespace: bool = False
    disable_additional_properties: bool = False
    disable_fallback: bool = False  # one grammar engine: nothing to fall back to
    backend: Literal["auto", "guidance"] | None = None  # llguidance (vLLM's name for it: "guidance")


class JsonSchemaSpec(_Strict):
    """OpenAI's `response_format.json_schema`."""

    name: str = Field(min_length=1, max_length=64, pattern=r"^[a-zA-Z0-9_-]+$")
    description: str | None = None
    schema_: dict[str, Any] | None = Field(default=None, alias="schema")
    strict: bool | None = None


class ResponseFormat(_Strict):
    type: Literal["text", "json_object", "json_schema"]
    json_schema: JsonSchemaSpec | None = None

    @model_validator(mode="after")
    def _schema_given(self) -> Any:
        if self.type == "json_schema" and self.json_schema is None:
            raise ValueError('type "json_schema" needs a json_schema object with a name and a schema')
        return self


class _SamplingFields(_Request):
    """Fields shared by /v1/completions and /v1/chat/completions."""

    model: str | None = None
    temperature: float | None = Field(default=None, ge=0.0, le=100.0)
    top_p: float | None = Field(default=None, gt=0.0, le=1.0)
    top_k: int | None = Field(default=None, ge=-1)
    min_p: float | None = Field(default=None, ge=0.0, le=1.0)
    min_tokens: int | None = Field(default=None, ge=0)
    seed: int | None = Field(default=None, ge=SEED_MIN, le=SEED_MAX)
    stop: str | list[str] | None = None
    stop_token_ids: list[int] | None = None
    ignore_eos: bool = False
    skip_special_tokens: bool = True
    n: int = Field(default=1, ge=1)  # choices; at most the server's --max-num-seqs (they run at once)
    stream: bool | None = False
    stream_options: StreamOptions | None = None
    return_token_ids: bool | None = False
    user: str | None = None
    presence_penalty: float | None = Field(default=None, ge=-2.0, le=2.0)
    frequency_penalty: float | None = Field(default=None, ge=-2.0, le=2.0)
    repetition_penalty: float | None = Field(default=None, ge=0.01, le=100.0)  # tinier ones overflow fp32
    logit_bias: dict[str, float] | None = None  # token id (as JSON keys are strings) -> bias in [-100, 100]
    response_format: ResponseFormat | None = None
    structured_outputs: StructuredOutputs | None = None

    @classmethod
    def unsupported_field(cls, body: dict[str, Any]) -> str | None:
        """The first field of `body` that fastgemma does not honour at the value given."""
        for name, neutral in UNSUPPORTED.items():
            if name in body and name not in cls.model_fields:
                value = body[name]
                if not any(value == v and type(value) is type(v) for v in neutral):
                    return name
        return None

    def ignored_fields(self) -> list[str]:
        """Unknown fields of this request (ignored; the route logs them once)."""
        return sorted(set(self.model_extra or {}) - set(UNSUPPORTED) - ACCEPTED)

    @field_validator("stop")
    @classmethod
    def _stop_strings(cls, v: str | list[str] | None) -> str | list[str] | None:
        items = [v] if isinstance(v, str) else (v or [])
        if any(not s for s in items):
            raise ValueError("stop strings must be non-empty")
        if len(items) > 16:
            raise ValueError("at most 16 stop strings")
        return v

    def logit_bias_ids(self) -> dict[int, float] | None:
        """`logit_bias` with integer token ids; ValueError naming a key that is not one."""
        if not self.logit_bias:
            return None
        out = {}
        for key, bias in self.logit_bias.items():
            if not key.isdigit():
                raise ValueError(f"logit_bias keys must be token ids (got {key!r})")
            out[int(key)] = bias
        return out

    @property
    def stop_list(self) -> list[str]:
        return [self.stop] if isinstance(self.stop, str) else list(self.stop or [])


class CompletionRequest(_SamplingFields):
    prompt: str | list[int] | list[str] | list[list[int]]
    max_tokens: int | None = Field(default=16, ge=0)
    logprobs: int | None = Field(default=None, ge=0, le=MAX_LOGPROBS)
    prompt_logprobs: int | None = Field(default=None, ge=0, le=MAX_LOGPROBS)
    echo: bool | None = False
    add_special_tokens: bool = True
    best_of: int | None = Field(default=None, ge=1, le=1)
    suffix: str | None = None

    @field_validator("suffix")
    @classmethod
    def _no_suffix(cls, v: str | None) -> str | None:
        if v:
            raise ValueError("suffix is not supported")
        return v

    def prompts(self) -> list[str | list[int]]:
        """The prompt field as a list of prompts (one string or one id list each)."""
        p = self.prompt
        if isinstance(p, str):
            return [p]
        if not p:
            return [[]]  # an empty id list: rejected as an empty prompt later
        if isinstance(p[0], int):
            return [p]  # type: ignore[list-item]
        return list(p)  # type: ignore[arg-type]


class TextPart(_Request):
    type: Literal["text"]
    text: str


class MediaURL(_Request):
    url: str
    detail: str | None = None  # OpenAI's image detail hint; Gemma 4's soft-token budget is the checkpoint's


class ImageURLPart(_Request):
    type: Literal["image_url"]
    image_url: MediaURL


class InputAudio(_Request):
    data: str  # base64
    format: Literal["wav", "mp3", "flac"]


class InputAudioPart(_Request):
    type: Literal["input_audio"]
    input_audio: InputAudio


class AudioURLPart(_Request):
    type: Literal["audio_url"]
    audio_url: MediaURL


class VideoURLPart(_Request):
    """Parsed so that the refusal names the part (video needs transformers' torchvision processor)."""

    type: Literal["video_url"]
    video_url: MediaURL


ContentPart = Annotated[
    TextPart | ImageURLPart | InputAudioPart | AudioURLPart | VideoURLPart, Field(discriminator="type")
]


class FunctionCallIn(_Request):
    name: str
    arguments: str  # a JSON object, as text


class ToolCallIn(_Request):
    """A call an assistant message made earlier in the conversation."""

    id: str
    type: Literal["function"] = "function"
    function: FunctionCallIn


class ChatMessage(_Request):
    role: Literal["system", "developer", "user", "assistant", "tool"]
    content: str | list[ContentPart] | None = None
    name: str | None = None
    tool_calls: list[ToolCallIn] | None = None  # assistant
    tool_call_id: str | None = None  # tool: the call this message answers

    @model_validator(mode="after")
    def _tool_fields(self) -> Any:
        if self.tool_calls and self.role != "assistant":
            raise ValueError("tool_calls belong to assistant messages")
        if self.role == "tool" and not self.tool_call_id:
            raise ValueError("a tool message needs the tool_call_id of the call it answers")
        return self

    def text(self) -> str:
        """The text parts joined by newlines (media parts left out)."""
        if self.content is None:
            return ""
        if isinstance(self.content, str):
            return self.content
        return "\n".join(part.text for part in self.content if isinstance(part, TextPart))

    def template_content(self) -> str | list[dict[str, Any]]:
        """A string, or the parts as plain dicts (media are decoded by multimodal/chat.py)."""
        if self.content is None:
            return ""
        if isinstance(self.content, str):
            return self.content
        return [part.model_dump(exclude_none=True) for part in self.content]


class FunctionDefinition(_Strict):
    name: str = Field(min_length=1, max_length=64, pattern=r"^[a-zA-Z0-9_-]+$")
    description: str | None = None
    parameters: dict[str, Any] | None = None  # a JSON schema of the arguments object
    strict: bool | None = None  # arguments always follow `parameters` under "required" / a named choice


class ChatTool(_Strict):
    type: Literal["function"]
    function: FunctionDefinition


class FunctionName(_Strict):
    name: str


class NamedToolChoice(_Strict):
    type: Literal["function"]
    function: FunctionName


class ChatCompletionRequest(_SamplingFields):
    messages: list[ChatMessage] = Field(min_length=1)
    tools: list[ChatTool] | None = None
    tool_choice: Literal["none", "auto", "required"] | NamedToolChoice | None = None
    parallel_tool_calls: bool | None = True
    max_tokens: int | None = Field(default=None, ge=1)
    max_completion_tokens: int | None = Field(default=None, ge=1)
    logprobs: bool | None = False
    top_logprobs: int | None = Field(default=None, ge=0, le=MAX_LOGPROBS)

    @property
    def requested_max_tokens(self) -> int | None:
        return self.max_completion_tokens if self.max_completion_tokens is not None else self.max_tokens


# ---- responses ---------------------------------------------------------------------------


def random_id(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex}"


def now() -> int:
    return int(time.time())


class _Response(BaseModel):
    model_config = ConfigDict(extra="forbid")


class UsageInfo(_Response):
    prompt_tokens: int = 0
    completion_tokens: int = 0
    total_tokens: int = 0


class Logprob(_Response):
    logprob: float
    rank: int | None = None
    decoded_token: str | None = None


class CompletionLogProbs(_Response):
    text_offset: list[int] = Field(default_factory=list)
    token_logprobs: list[float | None] = Field(default_factory=list)
    tokens: list[str] = Field(default_factory=list)
    top_logprobs: list[dict[str, float] | None] = Field(default_factory=list)


class CompletionResponseChoice(_Response):
    index: int
    text: str
    logprobs: CompletionLogProbs | None = None
    finish_reason: str | None = None
    stop_reason: int | str | None = None
    prompt_logprobs: list[dict[str, Logprob] | None] | None = None
    token_ids: list[int] | None = None
    prompt_token_ids: list[int] | None = None


class CompletionResponse(_Response):
    id: str
    object: Literal["text_completion"] = "text_completion"
    created: int
    model: str
    choices: list[CompletionResponseChoice]
    usage: UsageInfo


class CompletionStreamChoice(_Response):
    index: int
    text: str
    logprobs: CompletionLogProbs | None = None
    finish_reason: str | None = None
    stop_reason: int | str | None = None
    token_ids: list[int] | None = None


class CompletionStreamResponse(_Response):
    id: str
    object: Literal["text_completion"] = "text_completion"
    created: int
    model: str
    choices: list[CompletionStreamChoice]
    usage: UsageInfo | None = None


class TopLogprob(_Response):
    token: str
    logprob: float
    bytes: list[int] | None = None


class ChatTokenLogprob(TopLogprob):
    top_logprobs: list[TopLogprob] = Field(default_factory=list)


class ChatLogprobs(_Response):
    content: list[ChatTokenLogprob] | None = None


class FunctionCall(_Response):
    name: str
    arguments: str


class ToolCall(_Response):
    id: str
    type: Literal["function"] = "function"
    function: FunctionCall


class ChatResponseMessage(_Response):
    role: Literal["assistant"] = "assistant"
    content: str | None = None
    tool_calls: list[ToolCall] | None = None  # left out when the model called none (as OpenAI)

    @model_serializer(mode="wrap")
    def _drop_no_calls(self, handler: Any) -> dict[str, Any]:
        return {k: v for k, v in handler(self).items() if k != "tool_calls" or v is not None}


class DeltaFunctionCall(_Response):
    name: str | None = None
    arguments: str | None = None


class DeltaToolCall(_Response):
    index: int
    id: str | None = None
    type: Literal["function"] | None = None
    function: DeltaFunctionCall | None = None


class ChatCompletionResponseChoice(_Response):
    index: int
    message: ChatResponseMessage
    logprobs: ChatLogprobs | None = None
    finish_reason: str | None = None
    stop_reason: int | str | None = None
    token_ids: list[int] | None = None


class ChatCompletionResponse(_Response):
    id: str
    object: Literal["chat.completion"] = "chat.completion"
    created: int
    model: str
    choices: list[ChatCompletionResponseChoice]
    usage: UsageInfo
    prompt_token_ids: list[int] | None = None


class DeltaMessage(_Response):
    role: Literal["assistant"] | None = None
    content: str | None = None
    tool_calls: list[DeltaToolCall] | None = None

    @model_serializer(mode="wrap")
    def _drop_unset(self, handler: Any) -> dict[str, Any]:
        return {k: v for k, v in handler(self).items() if v is not None}  # `{}` for the final chunk


class ChatStreamChoice(_Response):
    index: int
    delta: DeltaMessage
    logprobs: ChatLogprobs | None = None
    finish_reason: str | None = None
    stop_reason: int | str | None = None
    token_ids: list[int] | None = None


class ChatCompletionStreamResponse(_Response):
    id: str
    object: Literal["chat.completion.chunk"] = "chat.completion.chunk"
    created: int
    model: str
    choices: list[ChatStreamChoice]
    usage: UsageInfo | None = None


class ModelCard(_Response):
    id: str
    object: Literal["model"] = "model"
    created: int
    owned_by: str = "fastgemma"
    root: str | None = None
    parent: str | None = None
    max_model_len: int | None = None


class ModelList(_Response):
    object: Literal["list"] = "list"
    data: list[ModelCard]
