"""`run_tps(stop_below_tps=...)`: the tuner's pruning stops a timed run only once its TPS is
certain to end below the threshold (a stub client with a fixed time per request)."""

from __future__ import annotations

import time

import pytest

from fastgemma.verify.client import ChatReply
from fastgemma.verify.data import Prompt
from fastgemma.verify.tps import TooSlow, run_tps


class SlowClient:
    def __init__(self, seconds: float):
        self.seconds, self.calls = seconds, 0

    def chat(self, stage: str, model: str, text: str, max_tokens: int) -> ChatReply:
        self.calls += 1
        time.sleep(self.seconds)
        return ChatReply(self.seconds, 5, max_tokens)


PROMPTS = [Prompt(f"p{i}", f"prompt {i}") for i in range(6)]


def test_stops_once_the_threshold_is_out_of_reach():
    client = SlowClient(0.05)  # 10 tokens / 0.05 s: about 200 tok/s at best
    with pytest.raises(TooSlow) as info:
        run_tps(client, "m", PROMPTS, output_len=10, warmup=0, progress=False, stop_below_tps=400.0)
    # 60 tokens at 400 tok/s take 0.15 s: certain after the 4th request (0.2 s), not before the 3rd
    assert 3 <= client.calls <= 4
    assert info.value.rate < 400.0 and info.value.rate == pytest.approx(200.0, rel=0.3)


def test_a_run_that_can_still_win_is_not_stopped():
    client = SlowClient(0.02)  # about 500 tok/s
    result = run_tps(client, "m", PROMPTS, output_len=10, warmup=0, progress=False, stop_below_tps=100.0)
    assert len(result.requests) == 6 and result.output_tps > 100.0
    assert client.calls == 12  # the timed run and the TTFT requests
