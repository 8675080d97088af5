"""The most memory one request can take at the server's limits (README "Serving", the budget).

    python benchmarks/request_memory.py [image-L | image-RGB | body-ids | body-strings | body-text] ...
                                                                      (default: all)

Each case runs in a fresh process and prints one JSON line: the peak resident memory it
added (MiB: the peak resident size, `VmHWM`, reset once the input is built, less the size
then) and the seconds it took.
- image-L / image-RGB: the largest image the limits accept (40 Mpx, `MAX_IMAGE_PIXELS`), as a
  PNG data URL, decoded (`decode_image`) and preprocessed (Gemma 4's image processor);
  grayscale costs the most, being widened to RGB;
- body-*: the costliest bodies the server parses (`parse_json_body`) and validates as a
  completion request, on its event loop, holding the GIL: the seconds are the stall every
  stream feels. body-ids: `MAX_JSON_VALUES` token ids (the most values); body-strings: as
  many short strings (the most objects validation builds); body-text: one string just under
  `MAX_BODY_BYTES` of 4-byte characters (the most memory: Python stores it at 4 bytes a
  character).
tests/multimodal/test_media.py and tests/server/test_hostile_input.py run the image-L and
body cases and hold them under 640 MiB.
"""

from __future__ import annotations

import json
import subprocess
import sys

CASES = {
    "image-L": "image", "image-RGB": "image", "body-ids": "body", "body-strings": "body", "body-text": "body",
}


def measure(case: str) -> None:
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
        base, start = _reset_peak(), time.perf_counter()
        processor([decode_image(url)], return_tensors="pt")
    else:
        from fastgemma.server import protocol as P
        from fastgemma.server.errors import APIError
        from fastgemma.server.handling import MAX_BODY_BYTES, MAX_JSON_VALUES, parse_json_body

        n = MAX_JSON_VALUES - 8
        prompt = {
            "body-ids": "[" + ",".join(["100000"] * n) + "]",
            "body-strings": "[" + ",".join(['"ab"'] * n) + "]",
            "body-text": '"' + "\U0001F600" * ((MAX_BODY_BYTES - 64) // 4) + '"',
        }[case]
        body = ('{"prompt": ' + prompt + ', "max_tokens": 1}').encode()
        del prompt
        assert len(body) <= MAX_BODY_BYTES
        base, start = _reset_peak(), time.perf_counter()
        try:
            P.CompletionRequest.model_validate(parse_json_body(body))
        except APIError as e:
            raise SystemExit(f"{case}: refused: {e.message}") from None
    seconds = time.perf_counter() - start
    added = (_status_kib("VmHWM") - base) // 1024
    print(json.dumps({"case": case, "peak_mib": added, "seconds": round(seconds, 2)}))


def _status_kib(field: str) -> int:
    with open("/proc/self/status") as f:
        return next(int(line.split()[1]) for line in f if line.startswith(field + ":"))


def _reset_peak() -> int:
    """Resets the process's peak resident size to its current size (Linux); that size, KiB."""
    with open("/proc/self/clear_refs", "w") as f:
        f.write("5")
    return _status_kib("VmRSS")


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
