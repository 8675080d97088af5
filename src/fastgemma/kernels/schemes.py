"""The weight quantisation schemes by name (kernels/quant.py holds the maths): what a
configuration names and validates, importable without torch."""

from __future__ import annotations

from dataclasses import dataclass

SCHEMES = ("none", "int8", "int4-g32", "int4-g128")


@dataclass(frozen=True)
class QuantScheme:
    name: str  # one of SCHEMES, not "none"
    bits: int
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
        return QuantScheme(name, 4, int(name.removeprefix("int4-g")))

    def bytes_per_weight(self) -> float:
        return self.bits / 8 + (4 / self.group if self.group else 0.0)


INT8 = QuantScheme("int8", 8, 0)


def scheme_for(scheme: QuantScheme, in_features: int) -> QuantScheme:
    """The scheme a matrix with `in_features` inputs gets: int4 needs whole groups."""
    if scheme.bits == 4 and in_features % scheme.group:
        return INT8
    return scheme
