"""Chat content parts with images and audio, through the official `openai` client.

A tiny random multimodal Gemma 4 is served; generated PNG / WAV media go in as a data URL
and as `input_audio`. Bad media (corrupt, remote without --allow-remote-media, video) are
400s naming the part, and the server keeps serving. A text-only model refuses an image.
"""

from __future__ import annotations

import base64

import httpx
import pytest
from tests.media_samples import make_clip, make_image, png_bytes, wav_bytes

from fastgemma import SamplingParams
from fastgemma.server import ServerThread

CHAT = "/v1/chat/completions"


@pytest.fixture(scope="module")
def mm_server(mm_llm):
    with ServerThread(mm_llm, served_model_name="tiny-mm") as s:
        yield s


@pytest.fixture(scope="module")
def openai_client(mm_server):
    from openai import OpenAI

    return OpenAI(base_url=mm_server.url + "/v1", api_key="unused", max_retries=0)


def _image_part(data: bytes, mime: str = "image/png") -> dict:
    return {"type": "image_url", "image_url": {"url": f"data:{mime};base64,{base64.b64encode(data).decode()}"}}


def _audio_part(data: bytes, fmt: str = "wav") -> dict:
    return {"type": "input_audio", "input_audio": {"data": base64.b64encode(data).decode(), "format": fmt}}


def _chat(openai_client, parts: list[dict]):
    return openai_client.chat.completions.create(
        model="tiny-mm", messages=[{"role": "user", "content": parts}], max_tokens=4, temperature=0.0,
        extra_body={"ignore_eos": True, "return_token_ids": True},
    )


@pytest.mark.parametrize("kind", ["image", "audio"])
def test_media_chat_matches_python_api(kind, openai_client, mm_llm):
    part = _image_part(png_bytes(make_image())) if kind == "image" else _audio_part(wav_bytes(make_clip()))
    parts = [part, {"type": "text", "text": "What is this?"}]
    r = _chat(openai_client, parts)
    assert r.choices[0].finish_reason == "length"
    assert r.usage.completion_tokens == 4
    # the same conversation in-process: same prompt (soft-token slots included), same tokens
    ref = mm_llm.chat([{"role": "user", "content": parts}], SamplingParams(max_tokens=4, temperature=0.0, ignore_eos=True))
    slot = mm_llm.processor.image_token_id if kind == "image" else mm_llm.processor.audio_token_id
    assert ref.prompt_token_ids.count(slot) > 10
    assert r.usage.prompt_tokens == len(ref.prompt_token_ids)
    assert r.choices[0].token_ids == ref.outputs[0].token_ids


BAD_PARTS = [
    ("corrupt-png", _image_part(b"\x89PNG\r\n\x1a\n" + b"garbage" * 20), "cannot decode the image"),
    ("not-base64", {"type": "image_url", "image_url": {"url": "data:image/png;base64,@@@"}}, "base64"),
    ("corrupt-wav", _audio_part(b"RIFF" + b"\x00" * 64), "cannot decode the audio"),
    ("remote-url", {"type": "image_url", "image_url": {"url": "http://example.com/cat.png"}}, "--allow-remote-media"),
    ("video", {"type": "video_url", "video_url": {"url": "data:video/mp4;base64,AAAA"}}, "video"),
]


@pytest.mark.parametrize("name,part,needle", BAD_PARTS, ids=[b[0] for b in BAD_PARTS])
def test_bad_media_is_a_400_naming_the_part(name, part, needle, mm_server):
    body = {"messages": [{"role": "user", "content": [{"type": "text", "text": "Look:"}, part]}], "max_tokens": 2}
    with httpx.Client(base_url=mm_server.url, timeout=60) as c:
        r = c.post(CHAT, json=body)
        assert r.status_code == 400, r.text
        err = r.json()["error"]
        assert err["param"] == "messages.0.content.1"
        assert needle in err["message"]
        ok = c.post(CHAT, json={"messages": [{"role": "user", "content": "hi"}], "max_tokens": 2})
        assert ok.status_code == 200 and ok.json()["usage"]["completion_tokens"] >= 1


def test_oversized_audio_is_a_400(mm_server):
    part = _audio_part(wav_bytes(make_clip(seconds=31.0, rate=8000), rate=8000))
    with httpx.Client(base_url=mm_server.url, timeout=60) as c:
        r = c.post(CHAT, json={"messages": [{"role": "user", "content": [part]}], "max_tokens": 2})
    assert r.status_code == 400 and "30 s limit" in r.json()["error"]["message"]
    assert r.json()["error"]["param"] == "messages.0.content.0"


def test_text_only_model_refuses_an_image(client):
    """The main server fixture serves a text-only Gemma 3."""
    part = _image_part(png_bytes(make_image()))
    r = client.post(CHAT, json={"messages": [{"role": "user", "content": [part]}], "max_tokens": 2})
    assert r.status_code == 400
    assert "this model has no vision tower" in r.json()["error"]["message"]
