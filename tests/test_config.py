"""`EngineConfig`: each option declared once; everything that takes engine options is derived.

The dummy-option test adds a field to `EngineConfig` in a fresh interpreter (before the
command line is built from the declarations) and checks that the one declaration reaches
every place: the serve / generate / bench decode / verify / tune command lines and their
--help, `LLM(**options)`, presets, the tuner's search space, the submission export, the
server command line the verifier starts, and validation.
"""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from dataclasses import fields

import pytest

from fastgemma.config import KEEP, EngineConfig, spec_of

DUMMY = textwrap.dedent('''
    import json, sys
    from dataclasses import dataclass, fields
    from pathlib import Path

    import fastgemma.config as C

    @dataclass(frozen=True)
    class WithDummy(C.EngineConfig):
        warp_factor: int = C.option(3, "How fast the dummy goes.", flag="--warp-factor", low=1,
                                    tune=C.Tunable(choices=(1, 2)))

    # Every module that names EngineConfig sees the one with the dummy (as if it were declared
    # there); the command line is built from it afterwards, when fastgemma.cli.main is imported.
    import fastgemma.bench.decode, fastgemma.server, fastgemma.submission, fastgemma.tune.run, fastgemma.verify.run
    original = C.EngineConfig
    for module in list(sys.modules.values()):
        if getattr(module, "__name__", "").startswith("fastgemma") and getattr(module, "EngineConfig", None) is original:
            module.EngineConfig = WithDummy
    C.FIELDS = {f.name: f for f in fields(WithDummy)}

    from typer.testing import CliRunner

    from fastgemma import LLM
    from fastgemma.cli.main import app
    from fastgemma.preset import Preset, load_preset
    from fastgemma.submission import export_submission
    from fastgemma.tune.space import SearchSpace

    model, out = sys.argv[1], Path(sys.argv[2])
    runner, seen, found = CliRunner(), {}, {}

    for command in (["serve"], ["generate"], ["bench", "decode"], ["verify"]):
        text = runner.invoke(app, [*command, "--help"]).output
        found[" ".join(command) + " --help"] = "--warp-factor" in text and "How fast the dummy goes." in text
    found["tune --help"] = "warp_factor" in runner.invoke(app, ["tune", "--help"]).output

    class Seen(Exception):
        pass

    def capture(name):
        def record(config, *args, **kwargs):
            seen[name] = config
            raise Seen
        return record

    fastgemma.server.run_server = capture("serve")
    from_config = LLM.__dict__["from_config"]
    LLM.from_config = classmethod(lambda cls, config: capture("generate")(config))
    fastgemma.bench.decode.run_decode_bench = capture("bench")
    fastgemma.verify.run_verify = capture("verify")
    runner.invoke(app, ["serve", "--warp-factor", "5"])
    runner.invoke(app, ["generate", "hi", "--warp-factor", "6"])
    runner.invoke(app, ["bench", "decode", "--warp-factor", "7", "-q", "none,int8"])
    runner.invoke(app, ["verify", "--warp-factor", "8", "--out", str(out / "v")])
    found["serve flag"] = seen["serve"].warp_factor == 5
    found["generate flag"] = seen["generate"].warp_factor == 6
    found["bench flag"] = [e.warp_factor for e in seen["bench"].engines] == [7, 7]
    found["verify flag"] = seen["verify"].serve.warp_factor == 8
    found["serve_args"] = seen["verify"].serve.serve_args() == ["--warp-factor", "8"]
    LLM.from_config = from_config

    llm = LLM(model, dtype="float32", warp_factor=2)
    found["LLM(**options)"] = llm.config.warp_factor == 2

    (out / "p.json").write_text(json.dumps({"fastgemma_preset": 1, "options": {"warp_factor": 4}}))
    found["preset"] = load_preset(out / "p.json").options == {"warp_factor": 4}
    runner.invoke(app, ["serve", "--preset", str(out / "p.json")])
    found["serve --preset"] = seen["serve"].warp_factor == 4

    space = SearchSpace.build("cpu")
    found["search space"] = "warp_factor" in [d.name for d in space.dimensions]

    folder = export_submission(out / "sub", Preset(model, {"warp_factor": 4}), "m")
    found["submission"] = json.loads((folder / "preset.json").read_text())["options"] == {"warp_factor": 4}

    try:
        WithDummy(warp_factor=0)
        found["validation"] = False
    except ValueError as e:
        found["validation"] = "--warp-factor" in str(e) and "(got 0)" in str(e)
    print(json.dumps(found))
''')


def test_a_dummy_option_reaches_every_place(tiny_text_model, tmp_path):
    run = subprocess.run([sys.executable, "-c", DUMMY, str(tiny_text_model), str(tmp_path)],
                         capture_output=True, text=True, timeout=600)
    assert run.returncode == 0, run.stderr[-3000:]
    found = json.loads(run.stdout.strip().splitlines()[-1])
    assert found and all(found.values()), {k: v for k, v in found.items() if not v}


def test_every_option_is_declared_with_help():
    for f in fields(EngineConfig):
        spec = spec_of(f)
        assert spec.help.strip(), f.name
        assert not (spec.numerics and spec.plain is not KEEP), f"{f.name}: a numerics option keeps its value"


def test_plain_keeps_the_numbers_and_drops_the_speed_options():
    fast = EngineConfig(dtype="bfloat16", quantization="int8", prefill_chunk=64, speculative="ngram",
                        num_speculative_tokens=7, lm_head_screen=True, threads=1)
    plain = fast.plain()
    assert (plain.dtype, plain.quantization, plain.prefill_chunk, plain.kernels) == ("bfloat16", "int8", 64, "auto")
    assert (plain.speculative, plain.lm_head_screen, plain.fused_decode, plain.enforce_eager) == ("none", False, False, True)
    assert plain.threads is None and plain.num_speculative_tokens == 4
    assert plain.plain() == plain and fast.unquantized().quantization == "none"


@pytest.mark.parametrize("options, words", [
    ({"dtype": "fp16"}, "unknown dtype 'fp16' for --dtype"),
    ({"max_model_len": 1}, r"--max-model-len \(max_model_len=\) must be >= 2 \(got 1\)"),
    ({"num_speculative_tokens": 99}, r"must be in 1..15 \(got 99\)"),
    ({"threads": "4"}, r"--threads \(threads=\) must be an integer \(got '4'\)"),
    ({"lm_head_screen": 1}, "must be true or false"),
    ({"prompt_lookup_min": 5}, r"prompt_lookup_min <= prompt_lookup_max \(got 5 > 4\)"),
])
def test_errors_name_the_one_bad_value(options, words):
    with pytest.raises(ValueError, match=words) as e:
        EngineConfig(**options)
    assert "EngineConfig(" not in str(e.value)


def test_serve_args_round_trip_through_the_flags():
    config = EngineConfig(model="m", quantization="int8", lm_head_screen=False, speculative="ngram", threads=2)
    assert config.serve_args() == ["m", "--threads", "2", "--quantization", "int8", "--no-lm-head-screen",
                                   "--speculative", "ngram"]
