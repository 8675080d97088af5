"""Media limits are checked before the expensive work (#25): an audio clip's length from its
container header, an image's size from its header; adjacent placeholders are one medium each."""

from __future__ import annotations

import base64
import io
import json
import time
import tracemalloc

import numpy as np
import pytest

from fastgemma.multimodal.media import MAX_IMAGE_SIDE, MediaError, decode_audio, decode_image
from fastgemma.multimodal.processor import _expand


def _flac(seconds: float, rate: int) -> str:
    import soundfile

    buf = io.BytesIO()
    soundfile.write(buf, np.zeros(int(seconds * rate), np.float32), rate, format="FLAC")
    return base64.b64encode(buf.getvalue()).decode()


def test_a_long_clip_is_refused_from_its_header_before_decoding():
    clip = _flac(600, 8000)  # 10 minutes of silence: a few KB, 19 MB once decoded
    assert len(clip) < 200_000
    tracemalloc.start()
    start = time.monotonic()
    with pytest.raises(MediaError, match=r"600.0 s long, over the 30 s limit"):
        decode_audio(clip, "flac")
    _, peak = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    assert peak < 4_000_000 and time.monotonic() - start < 2  # nothing like the 19 MB of samples
    wave, rate = decode_audio(_flac(2, 8000), "flac")
    assert rate == 8000 and wave.shape == (16000,)


def test_an_image_over_the_side_limit_is_refused_before_its_pixels():
    from PIL import Image

    buf = io.BytesIO()
    Image.new("L", (MAX_IMAGE_SIDE + 1, 1)).save(buf, format="PNG")
    url = "data:image/png;base64," + base64.b64encode(buf.getvalue()).decode()
    with pytest.raises(MediaError, match="per side"):
        decode_image(url)


def test_an_undecodable_image_says_so_plainly():
    url = "data:image/gif;base64," + base64.b64encode(b"GIF89a" + b"\x00" * 7).decode()
    with pytest.raises(MediaError) as e:
        decode_image(url)
    assert "0x" not in str(e.value) and "BytesIO" not in str(e.value)


T, B, E = 9, 8, 10  # placeholder, begin, end


def test_adjacent_placeholders_are_one_medium_each():
    assert _expand([5, T, T, 6], T, B, E, [2, 3], "image") == [5, B, T, T, E, B, T, T, T, E, 6]
    assert _expand([B, T, T, E, T], T, B, E, [2, 1], "image") == [B, T, T, E, B, T, E]  # pre-expanded kept
    with pytest.raises(ValueError, match="3 image placeholder"):
        _expand([T, T, T], T, B, E, [1, 1], "image")
    with pytest.raises(ValueError, match="a run of 2 image placeholders does not fit"):
        _expand([B, T, T, E], T, B, E, [3], "image")


def test_the_largest_accepted_image_stays_within_the_memory_budget():
    """README's budget: the largest image the limits accept (40 Mpx; grayscale, which costs the
    most once widened to RGB) takes at most 640 MiB while it is decoded and preprocessed.
    Peak resident memory of a fresh process (benchmarks/request_memory.py)."""
    import subprocess
    import sys
    from pathlib import Path

    script = Path(__file__).resolve().parents[2] / "benchmarks" / "request_memory.py"
    out = subprocess.run([sys.executable, str(script), "image-L"], capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    assert 0 < json.loads(out.stdout.strip().splitlines()[-1])["peak_mib"] < 640
