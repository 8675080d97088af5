"""Multimodal inputs of Gemma 4: content parts and media decoding (`chat`, `media`) and the
preprocessing that turns media into tower inputs and placeholders into soft-token slots
(`processor`). The towers themselves are in `models/towers.py`."""
