"""Generated media for the multimodal tests: a random RGB image, a tone with noise, their files."""

from __future__ import annotations

import io

import numpy as np


def make_image(width: int = 60, height: int = 40, seed: int = 0):
    from PIL import Image

    rng = np.random.default_rng(seed)
    return Image.fromarray(rng.integers(0, 256, (height, width, 3), dtype=np.uint8))


def make_clip(seconds: float = 1.0, rate: int = 16000, seed: int = 0) -> np.ndarray:
    rng = np.random.default_rng(seed)
    t = np.arange(int(seconds * rate)) / rate
    return (0.4 * np.sin(2 * np.pi * 440 * t) + 0.05 * rng.standard_normal(t.size)).astype(np.float32)


def png_bytes(image) -> bytes:
    buf = io.BytesIO()
    image.save(buf, format="PNG")
    return buf.getvalue()


def wav_bytes(wave: np.ndarray, rate: int = 16000) -> bytes:
    import soundfile

    buf = io.BytesIO()
    soundfile.write(buf, wave, rate, format="WAV")
    return buf.getvalue()
