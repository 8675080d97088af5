"""What every route reads: the served `LLM` and the server's shared parts (`ServerState`)."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

from fastgemma.server.generation import Formatter
from fastgemma.server.metrics import Metrics
from fastgemma.server.worker import Worker


@dataclass
class ServerState:
    llm: Any
    served_model_name: str
    api_key: str | None
    worker: Worker  # request job threads and the engine loop
    metrics: Metrics
    formatter: Formatter
    preprocess: ThreadPoolExecutor  # tokenising and media decoding, off the event loop
    created: int
    allow_remote_media: bool = False  # fetch http(s) image URLs in chat content parts
    draining: bool = False  # set once on SIGTERM: new /v1 requests get 503, /health says so
    handling: int = 0  # /v1 requests inside their handler (parsing, pre-processing); event loop only

    @property
    def in_flight(self) -> int:
        """Accepted requests not yet finished: in a handler, waiting for the engine or running."""
        return self.handling + self.worker.num_waiting + self.worker.num_running
