"""OpenAI-style chat content parts -> template messages plus the media they carry, in order.

Accepted parts (OpenAI's and vLLM's names):

    {"type": "text", "text": "..."}
    {"type": "image_url", "image_url": {"url": "data:image/png;base64,..."}}   (or the URL as a string)
    {"type": "image_pil", "image_pil": PIL.Image}  /  {"type": "image", "image": PIL.Image}
    {"type": "input_audio", "input_audio": {"data": "<base64>", "format": "wav" | "flac" | "mp3"}}
    {"type": "audio_url", "audio_url": {"url": "data:audio/wav;base64,..."}}
    {"type": "audio", "audio": (waveform, sample_rate)}

`split_media` decodes the media (multimodal/media.py) and returns the messages for the chat
template: a message whose parts are all text keeps a plain string (parts joined by
newlines, as before); one with media gets `{"type": "image"}` / `{"type": "audio"}` parts
for a template that renders them, or — for a tokenizer without its own template — a string
with the placeholder token written where each medium was. A bad part raises `MediaError`
naming it (`messages.0.content.1`).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from fastgemma.multimodal.media import MediaError, decode_audio, decode_image
from fastgemma.multimodal.processor import AudioClip


class ContentPartError(MediaError):
    """A content part that cannot be used; `param` names it (`messages.0.content.1`)."""

    def __init__(self, param: str, message: str):
        super().__init__(f"{param}: {message}")
        self.param = param


@dataclass
class ChatMedia:
    messages: list[dict[str, Any]]  # for the chat template
    images: list[Any] = field(default_factory=list)  # PIL images, in order of appearance
    audios: list[AudioClip] = field(default_factory=list)


def split_media(
    messages: list[dict[str, Any]], image_token: str, audio_token: str, structured: bool, allow_remote: bool = False
) -> ChatMedia:
    """`structured`: the template renders `{"type": "image"}` parts; else placeholders are
    written into the text."""
    out = ChatMedia([])
    for i, message in enumerate(messages):
        content = message.get("content")
        if not isinstance(content, list):
            out.messages.append(message)
            continue
        parts: list[dict[str, Any]] = []
        for j, part in enumerate(content):
            param = f"messages.{i}.content.{j}"
            try:
                parts.append(_part(part, out, allow_remote))
            except MediaError as e:
                raise ContentPartError(param, str(e)) from None
        if all(p["type"] == "text" for p in parts):
            rendered: Any = "\n".join(p["text"] for p in parts)
        elif structured:
            rendered = parts
        else:
            tokens = {"image": image_token, "audio": audio_token}
            rendered = "".join(p["text"] if p["type"] == "text" else tokens[p["type"]] for p in parts)
        out.messages.append({**message, "content": rendered})
    return out


def _part(part: Any, out: ChatMedia, allow_remote: bool) -> dict[str, Any]:
    if not isinstance(part, dict) or not isinstance(part.get("type"), str):
        raise MediaError('a content part is an object with a "type"')
    kind = part["type"]
    value = part.get(kind)
    if kind == "text":
        if not isinstance(part.get("text"), str):
            raise MediaError('a text part needs a "text" string')
        return {"type": "text", "text": part["text"]}
    if kind in ("image_url", "audio_url"):
        url = value.get("url") if isinstance(value, dict) else value
        if not isinstance(url, str):
            raise MediaError(f'an {kind} part needs {{"{kind}": {{"url": "..."}}}}')
        if kind == "image_url":
            out.images.append(decode_image(url, allow_remote))
            return {"type": "image"}
        if not url.startswith("data:"):
            raise MediaError("audio_url takes a base64 data URL (data:audio/...;base64,...)")
        out.audios.append(decode_audio(url))
        return {"type": "audio"}
    if kind in ("image_pil", "image"):
        from PIL import Image

        if not isinstance(value, Image.Image):
            raise MediaError(f"an {kind} part holds a PIL.Image")
        out.images.append(value)
        return {"type": "image"}
    if kind == "input_audio":
        if not isinstance(value, dict) or not isinstance(value.get("data"), str):
            raise MediaError('an input_audio part needs {"input_audio": {"data": "<base64>", "format": "wav"}}')
        out.audios.append(decode_audio(value["data"], value.get("format")))
        return {"type": "audio"}
    if kind == "audio":
        if not (isinstance(value, tuple) and len(value) == 2):
            raise MediaError("an audio part holds (waveform, sample_rate)")
        out.audios.append(value)
        return {"type": "audio"}
    if kind in ("video_url", "video"):
        raise MediaError(
            "video input is not supported: transformers' Gemma 4 video processor needs torchvision; "
            "send the frames as images instead"
        )
    raise MediaError(f"unknown content part type {kind!r}")
