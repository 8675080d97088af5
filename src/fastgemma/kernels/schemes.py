"""The weight quantisation schemes by name (kernels/quant.py holds the maths; kernels/gguf.py
that of `gguf`, a GGUF file's own blocks): what a configuration names and validates,
importable without torch."""

from __future__ import annotations

from dataclasses import dataclass

SCHEMES = ("none", "int8", "int4-g32", "int4-g128", "gguf")


@dataclass(frozen=True)
class QuantScheme:
    name: str  # one of SCHEMES, not "none"
    bits: int  # 0 for gguf: each matrix keeps its file's block types (kernels/gguf.py)
    group: int  # inputs per scale; 0 = the whole row

    @staticmethod
    def parse(name: str) -> QuantScheme | None:
        """None for "none"; ValueError naming the accepted schemes otherwise."""
        if name not in SCHEMES:
            raise ValueError(f"unknown quantization {name!r}; use one of: {', '.join(SCHEMES)}")
        if name == "none":
            return None
        if name == "int8":
            return QuantScheme("int8", 8, 0)
        if name == "gguf":
            return GGUF
        return QuantScheme(name, 4, int(name.removeprefix("int4-g")))


INT8 = QuantScheme("int8", 8, 0)
GGUF = QuantScheme("gguf", 0, 0)  # a GGUF file's own blocks, kept as the file stores them


def scheme_for(scheme: QuantScheme, in_features: int) -> QuantScheme:
    """The scheme a matrix with `in_features` inputs gets: int4 needs whole groups."""
    if scheme.bits == 4 and in_features % scheme.group:
        return INT8
    return scheme
