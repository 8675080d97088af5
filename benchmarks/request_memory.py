"""The most memory one request can take at the server's limits (README "Serving", the budget).

    python benchmarks/request_memory.py [image-L | image-RGB | body] ...   (default: all three)

Each case runs in a fresh process and prints one JSON line: the peak resident memory it
added (MiB, from `ru_maxrss`) and the seconds it took.
- image-L / image-RGB: the largest image the limits accept (40 Mpx, `MAX_IMAGE_PIXELS`), as a
  PNG data URL, decoded (`decode_image`) and preprocessed (Gemma 4's image processor);
  grayscale costs the most, being widened to RGB;
- body: a body just under `MAX_BODY_BYTES`, all token ids (the most Python objects per byte),
  parsed and validated as a completion request (then refused as too long); the seconds are
  the time the event loop holds the GIL for it.
tests/multimodal/test_media.py and tests/server/test_hostile_input.py run the image-L and body
cases and hold them under 640 MiB.
"""

from __future__ import annotations

import json
import subprocess
import sys

CASES = {
    "image-L": "image", "image-RGB": "image", "body": "body",
}


def measure(case: str) -> None:
    import resource
    import time

    if CASES[case] == "image":
        import base64
        import io

        from PIL import Image
        from transformers import Gemma4ImageProcessorPil

        from fastgemma.multimodal.media import MAX_IMAGE_PIXELS, decode_image

        mode, w = case.split("-")[1], 6000
        buf = io.BytesIO()
        Image.new(mode, (w, MAX_IMAGE_PIXELS // w), (7, 8, 9)[: len(mode)] if len(mode) > 1 else 7).save(buf, format="PNG")
        url = "data:image/png;base64," + base64.b64encode(buf.getvalue()).decode()
        del buf
        processor = Gemma4ImageProcessorPil()
        base, start = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss, time.perf_counter()
        processor([decode_image(url)], return_tensors="pt")
    else:
        from fastgemma.server import protocol as P
        from fastgemma.server.handling import MAX_BODY_BYTES

        body = ('{"prompt": [' + ",".join(["100000"] * (MAX_BODY_BYTES // 7 - 10)) + "]}").encode()
        assert len(body) <= MAX_BODY_BYTES
        base, start = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss, time.perf_counter()
        P.CompletionRequest.model_validate(json.loads(body))
    seconds = time.perf_counter() - start
    added = (resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - base) // 1024
    print(json.dumps({"case": case, "peak_mib": added, "seconds": round(seconds, 2)}))


def run(case: str) -> dict:
    """The case in a fresh process; its JSON line."""
    out = subprocess.run([sys.executable, __file__, "--one", case], capture_output=True, text=True, timeout=300)
    if out.returncode != 0:
        raise RuntimeError(out.stderr[-2000:])
    return json.loads(out.stdout.strip().splitlines()[-1])


if __name__ == "__main__":
    if sys.argv[1:2] == ["--one"]:
        measure(sys.argv[2])
    else:
        for case in sys.argv[1:] or list(CASES):
            print(json.dumps(run(case)), flush=True)
