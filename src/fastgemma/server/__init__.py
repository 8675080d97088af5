"""An OpenAI-compatible HTTP server over `fastgemma.LLM` (`fastgemma serve`).

- `build_app(llm, ...)`: the FastAPI app (routes in `app.py`, schemas in `protocol.py`);
- `run_server(config, host, port, ...)`: load the model and serve it with uvicorn (`serve.py`);
- `ServerThread(llm, ...)`: the same app on a background thread (tests, benchmarks).

Requests run on job threads (up to the engine's `max_num_seqs` at once) over one engine loop
that steps them together (continuous batching, `worker.py`); a bounded queue of waiting
requests answers 429 when full.
"""

from fastgemma.server.app import build_app
from fastgemma.server.serve import ServerThread, run_server, settings_from_env

__all__ = ["build_app", "run_server", "settings_from_env", "ServerThread"]
