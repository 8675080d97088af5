"""Media decoding for chat content parts: image URLs and base64 audio -> PIL images / waveforms.

Owns the limits and the error messages a client sees; knows nothing of the model. Every
failure is a `MediaError` (a `ValueError`) whose message names what was wrong, so the server
turns it into a 400 naming the content part and keeps serving.

- Images: `data:image/png|jpeg|webp;base64,...` URLs. A remote (http/https) URL is fetched
  only when the caller allows it (`fastgemma serve --allow-remote-media`); otherwise it is
  refused with a message saying so. Decoded with Pillow, fully loaded (a truncated file
  fails here, not later), at most `MAX_IMAGE_PIXELS` pixels and `MAX_IMAGE_SIDE` per side,
  checked from the header before the pixels are decoded.
- Audio: base64 `wav`, `flac` or `mp3` (libsndfile via `soundfile`), or a `data:audio/...`
  URL; at most `MAX_AUDIO_SECONDS` long (the processor's own limit), read from the
  container's header before decoding, and no more than that decoded.
"""

from __future__ import annotations

import base64
import binascii
import io
import re

import numpy as np

from fastgemma.multimodal.processor import MAX_AUDIO_SECONDS

MAX_MEDIA_BYTES = 20 * 1024 * 1024  # one decoded image or audio file
MAX_IMAGE_PIXELS = 40_000_000
MAX_IMAGE_SIDE = 16_384  # pixels per side: a 1 x 39,000,000 strip is refused before it is decoded
IMAGE_FORMATS = {"PNG", "JPEG", "WEBP"}
AUDIO_FORMATS = ("wav", "flac", "mp3")
REMOTE_TIMEOUT_S = 10.0

_DATA_URL = re.compile(r"data:(?P<mime>[\w.+-]+/[\w.+-]+)?(?:;[\w-]+=[\w.-]+)*;base64,(?P<data>.*)", re.S)


class MediaError(ValueError):
    """Media that cannot be used; the message says why."""


def _b64(data: str) -> bytes:
    if len(data) > MAX_MEDIA_BYTES * 4 // 3 + 4:
        raise MediaError(f"the media is larger than the {MAX_MEDIA_BYTES // (1024 * 1024)} MiB limit")
    try:
        return base64.b64decode(data, validate=True)
    except (binascii.Error, ValueError):
        raise MediaError("the data is not valid base64") from None


def _url_bytes(url: str, allow_remote: bool) -> tuple[bytes, str | None]:
    """(bytes, mime type or None) of a data URL, or of a remote URL when allowed."""
    if url.startswith("data:"):
        m = _DATA_URL.fullmatch(url)
        if m is None:
            raise MediaError("a data URL must look like data:<mime type>;base64,<data>")
        return _b64(m.group("data")), m.group("mime")
    if url.startswith(("http://", "https://")):
        if not allow_remote:
            raise MediaError(
                "fetching remote media is disabled; send the media inline as a base64 data URL, "
                "or start the server with --allow-remote-media"
            )
        return _fetch(url)
    raise MediaError("the URL must be a base64 data URL (data:...;base64,...) or an http(s) URL")


def _fetch(url: str) -> tuple[bytes, str | None]:
    import httpx

    try:
        with httpx.stream("GET", url, timeout=REMOTE_TIMEOUT_S, follow_redirects=True) as r:
            r.raise_for_status()
            chunks, size = [], 0
            for chunk in r.iter_bytes():
                size += len(chunk)
                if size > MAX_MEDIA_BYTES:
                    raise MediaError(f"the media is larger than the {MAX_MEDIA_BYTES // (1024 * 1024)} MiB limit")
                chunks.append(chunk)
            return b"".join(chunks), r.headers.get("content-type")
    except httpx.HTTPError as e:
        raise MediaError(f"cannot fetch {url}: {e}") from None


def decode_image(url: str, allow_remote: bool = False):
    """An image URL (data URL, or http(s) when allowed) -> a loaded RGB `PIL.Image`."""
    from PIL import Image

    data, _ = _url_bytes(url, allow_remote)
    try:
        with Image.open(io.BytesIO(data)) as img:
            if img.format not in IMAGE_FORMATS:
                raise MediaError(f"image format {img.format} is not supported (PNG, JPEG or WebP)")
            if img.width * img.height > MAX_IMAGE_PIXELS or max(img.width, img.height) > MAX_IMAGE_SIDE:
                raise MediaError(
                    f"the image has {img.width}x{img.height} pixels, over the limits "
                    f"({MAX_IMAGE_PIXELS} pixels, {MAX_IMAGE_SIDE} per side)"
                )
            return img.convert("RGB")  # decodes every pixel: a truncated file fails here
    except MediaError:
        raise
    except Image.UnidentifiedImageError:
        raise MediaError("cannot decode the image: it is not a PNG, JPEG or WebP file") from None
    except (OSError, ValueError, SyntaxError, Image.DecompressionBombError) as e:
        raise MediaError(f"cannot decode the image: {_plain(e)}") from None


def decode_audio(data: str, fmt: str | None = None) -> tuple[np.ndarray, int]:
    """Base64 audio (or a data:audio/... URL) -> (float32 waveform [samples] or [samples, ch], rate)."""
    import soundfile

    if data.startswith("data:"):
        raw, _ = _url_bytes(data, allow_remote=False)
    else:
        if fmt is not None and fmt not in AUDIO_FORMATS:
            raise MediaError(f"audio format {fmt!r} is not supported ({', '.join(AUDIO_FORMATS)})")
        raw = _b64(data)
    try:
        with soundfile.SoundFile(io.BytesIO(raw)) as f:
            # The container's header says how long the clip is: refuse before decoding, and
            # decode no more than the limit allows (a header may understate its length).
            rate, allowed = f.samplerate, int(MAX_AUDIO_SECONDS * f.samplerate)
            if f.frames > allowed:
                raise MediaError(f"the audio clip is {f.frames / rate:.1f} s long, over the {MAX_AUDIO_SECONDS:.0f} s limit")
            wave = f.read(frames=allowed + 1, dtype="float32", always_2d=False)
    except MediaError:
        raise
    except Exception as e:  # libsndfile raises its own error types for every malformed file
        raise MediaError(f"cannot decode the audio: {_plain(e)}") from None
    if wave.size == 0:
        raise MediaError("the audio clip is empty")
    if wave.shape[0] > allowed:
        raise MediaError(f"the audio clip is over the {MAX_AUDIO_SECONDS:.0f} s limit")
    return wave, int(rate)


def _plain(e: Exception) -> str:
    """An exception's message without the repr of an in-memory object (`<_io.BytesIO ... at 0x...>`)."""
    return re.sub(r"<[\w.]+ object at 0x[0-9a-f]+>", "the data", str(e))
