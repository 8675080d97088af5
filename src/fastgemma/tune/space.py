"""The search space: every `EngineConfig` option declared with a `Tunable` (config.py).

Nothing here lists options: `SearchSpace.build` reads the fields' metadata, keeps those that
have an effect on this device type, and `suggest` asks an optuna trial for each in field
order, skipping an option whose `when` condition is not met by the values chosen before it
(e.g. `num_speculative_tokens` only with a speculative method). The result is validated by
`EngineConfig`: a combination the engine refuses raises
`ValueError` before any server starts.

Two inputs are not choices: the model, and the draft model, which is what makes
`speculative=mtp` possible; without one, `mtp` is left out of the space. Likewise
`quantization=gguf` (a GGUF file's own blocks) is in it only for a GGUF model on the CPU.
"""

from __future__ import annotations

import hashlib
import json
import random
from collections.abc import Callable, Iterator
from dataclasses import dataclass, fields
from typing import Any

from fastgemma.config import EngineConfig, Tunable, spec_of


@dataclass(frozen=True)
class Dimension:
    name: str  # an EngineConfig field
    tunable: Tunable
    choices: tuple[Any, ...]  # categorical values (empty: an integer range)

    def values(self) -> tuple[Any, ...]:
        return self.choices or tuple(range(self.tunable.low, self.tunable.upper() + 1))

    def suggest(self, trial: Any) -> Any:
        if self.choices:
            return trial.suggest_categorical(self.name, list(self.choices))
        return trial.suggest_int(self.name, self.tunable.low, self.tunable.upper())

    def describe(self) -> str:
        values = ", ".join(str(c) for c in self.choices) if self.choices else f"{self.tunable.low}..{self.tunable.upper()}"
        cond = f" (when {self.tunable.when[0]} in {', '.join(map(str, self.tunable.when[1]))})" if self.tunable.when else ""
        return f"{self.name}: {values}{cond}"


def config_hash(options: EngineConfig) -> str:
    """A short stable id of a configuration (its options that differ from the defaults)."""
    blob = json.dumps({"model": options.model, **options.changed()}, sort_keys=True, default=str)
    return hashlib.sha256(blob.encode()).hexdigest()[:10]


@dataclass(frozen=True)
class SearchSpace:
    dimensions: tuple[Dimension, ...]
    model: str | None = None
    draft_model: str | None = None

    @classmethod
    def build(cls, device_type: str, model: str | None = None, draft_model: str | None = None) -> SearchSpace:
        """The tunable options that have an effect on `device_type` ("cpu", "cuda")."""
        dims = []
        for f in fields(EngineConfig):
            tunable = spec_of(f).tune
            if tunable is None or device_type not in tunable.devices or device_type not in spec_of(f).devices:
                continue
            choices = tuple(tunable.choices)
            if f.name == "speculative" and draft_model is None:
                choices = tuple(c for c in choices if c != "mtp")
            if f.name == "quantization" and not (device_type == "cpu" and (model is None or model.endswith(".gguf"))):
                choices = tuple(c for c in choices if c != "gguf")  # a GGUF file's blocks: GGUF models, CPU
            dims.append(Dimension(f.name, tunable, choices))
        return cls(tuple(dims), model, draft_model)

    def describe(self) -> list[str]:
        return [d.describe() for d in self.dimensions]

    def _walk(self, pick: Callable[[Dimension], Any]) -> dict[str, Any]:
        """Values for the dimensions in order, skipping one whose `when` the values so far fail."""
        values: dict[str, Any] = {}
        for dim in self.dimensions:
            if dim.tunable.when is not None:
                other, allowed = dim.tunable.when
                if values.get(other, _default(other)) not in allowed:
                    continue
            values[dim.name] = pick(dim)
        return values

    def suggest(self, trial: Any) -> EngineConfig:
        """One configuration from an optuna trial; ValueError if the engine refuses it."""
        return self.options(self._walk(lambda dim: dim.suggest(trial)))

    def neighbours(self, params: dict[str, Any], rng: random.Random) -> Iterator[dict[str, Any]]:
        """Configurations one option away from `params` in random order, then random ones:
        where the sampler proposes a configuration already measured, the search tries these."""
        moves = [(dim, v) for dim in self.dimensions if dim.name in params for v in dim.values() if v != params[dim.name]]
        rng.shuffle(moves)
        for dim, value in moves:
            yield self._walk(lambda d, dim=dim, value=value: value if d is dim else params.get(d.name, rng.choice(d.values())))
        while True:
            yield self._walk(lambda d: rng.choice(d.values()))

    def options(self, values: dict[str, Any]) -> EngineConfig:
        draft = self.draft_model if values.get("speculative") == "mtp" else None
        return EngineConfig(model=self.model, draft_model=draft, **values)

    def default_params(self) -> dict[str, Any]:
        """The engine's defaults as trial parameters (the study's first trial, its baseline);
        an "auto" or unset default is given as what it resolves to here."""
        resolved = EngineConfig(model=self.model)
        params: dict[str, Any] = {}
        for dim in self.dimensions:
            if dim.tunable.when is not None and params.get(dim.tunable.when[0], _default(dim.tunable.when[0])) not in dim.tunable.when[1]:
                continue
            value = _default(dim.name)
            if dim.name == "dtype" and value == "auto":
                value = str(resolved.torch_dtype()).removeprefix("torch.")
            if dim.name == "threads" and value is None:
                value = dim.tunable.upper()
            params[dim.name] = value
        return params


def _default(name: str) -> Any:
    return {f.name: f.default for f in fields(EngineConfig)}[name]
