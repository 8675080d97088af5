"""The search space is read from `EngineConfig`'s option metadata: every tunable option, on the
devices it applies to, with its conditions; suggestions are validated by the engine's rules."""

from __future__ import annotations

from dataclasses import fields

import optuna
import pytest

from fastgemma.config import EngineConfig, spec_of
from fastgemma.kernels.cpu import physical_cores
from fastgemma.tune.space import SearchSpace, config_hash


def _fixed(params: dict) -> optuna.trial.FixedTrial:
    return optuna.trial.FixedTrial(params)


def test_space_is_every_tunable_option_for_the_device():
    tunable = [f.name for f in fields(EngineConfig) if spec_of(f).tune is not None]
    cpu = SearchSpace.build("cpu")
    assert [d.name for d in cpu.dimensions] == tunable  # no second list: the metadata is the space
    cuda = SearchSpace.build("cuda")
    assert {d.name for d in cuda.dimensions} == {"dtype", "quantization", "speculative", "num_speculative_tokens",
                                                "prompt_lookup_min", "prompt_lookup_max"}
    threads = next(d for d in cpu.dimensions if d.name == "threads")
    assert (threads.tunable.low, threads.tunable.upper()) == (1, physical_cores())


def test_mtp_only_with_a_draft_model():
    spec = lambda space: next(d for d in space.dimensions if d.name == "speculative").choices  # noqa: E731
    assert "mtp" not in spec(SearchSpace.build("cpu"))
    space = SearchSpace.build("cpu", model="m", draft_model="assistant")
    assert "mtp" in spec(space)
    assert space.options({"speculative": "mtp"}).draft_model == "assistant"
    assert space.options({"speculative": "ngram"}).draft_model is None


def test_gguf_blocks_only_for_a_gguf_model_on_the_cpu():
    choices = lambda space: next(d for d in space.dimensions if d.name == "quantization").choices  # noqa: E731
    assert "gguf" in choices(SearchSpace.build("cpu"))  # the embedded default is a GGUF
    assert "gguf" in choices(SearchSpace.build("cpu", model="models/gemma-3-1b-q4_k_m.gguf"))
    assert "gguf" not in choices(SearchSpace.build("cpu", model="google/gemma-4-E4B-it"))
    assert "gguf" not in choices(SearchSpace.build("cuda"))
    assert "int8" in choices(SearchSpace.build("cuda"))


def test_conditional_options_are_asked_only_when_they_apply():
    space = SearchSpace.build("cpu")
    base = {"dtype": "bfloat16", "threads": 1, "quantization": "int8"}
    torch_kernels = space.suggest(_fixed({**base, "kernels": "torch"}))  # screen and speculation need kernels=auto
    assert (torch_kernels.kernels, torch_kernels.speculative, torch_kernels.lm_head_screen) == ("torch", "none", True)
    plain = space.suggest(_fixed({**base, "kernels": "auto", "lm_head_screen": False, "speculative": "none"}))
    assert plain.num_speculative_tokens == 4 and not plain.lm_head_screen  # K not asked without speculation
    ngram = space.suggest(_fixed({**base, "kernels": "auto", "lm_head_screen": True, "speculative": "ngram",
                                  "num_speculative_tokens": 8, "prompt_lookup_min": 2, "prompt_lookup_max": 5}))
    assert (ngram.speculative, ngram.num_speculative_tokens, ngram.prompt_lookup_max) == ("ngram", 8, 5)
    assert ngram.serve_args()[ngram.serve_args().index("--num-speculative-tokens") + 1] == "8"


def test_a_combination_the_engine_refuses_is_invalid():
    space = SearchSpace.build("cpu")
    params = {"dtype": "bfloat16", "threads": 1, "quantization": "none", "kernels": "auto",
              "lm_head_screen": True, "speculative": "ngram", "num_speculative_tokens": 4,
              "prompt_lookup_min": 4, "prompt_lookup_max": 2}
    with pytest.raises(ValueError, match="prompt_lookup_min <= prompt_lookup_max"):
        space.suggest(_fixed(params))


def test_default_params_are_the_engine_defaults():
    space = SearchSpace.build("cpu")
    params = space.default_params()
    assert "num_speculative_tokens" not in params  # speculation is off by default
    options = space.options(params)
    assert options.quantization == "none" and options.speculative == "none" and options.lm_head_screen
    assert options.dtype == str(EngineConfig().torch_dtype()).removeprefix("torch.")
    assert options.threads == physical_cores()


def test_config_hash_names_the_configuration():
    a = EngineConfig(quantization="int8", speculative="ngram", num_speculative_tokens=8)
    b = EngineConfig(speculative="ngram", num_speculative_tokens=8, quantization="int8")
    assert config_hash(a) == config_hash(b) != config_hash(EngineConfig(quantization="int8"))
