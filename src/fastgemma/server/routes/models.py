"""GET /v1/models: the one served model, vLLM's model card (with `max_model_len`)."""

from __future__ import annotations

from typing import Any

from fastapi.responses import Response

from fastgemma.server import protocol as P
from fastgemma.server.handling import json_response
from fastgemma.server.state import ServerState


async def models(state: ServerState, _body: Any = None) -> Response:
    llm = state.llm
    card = P.ModelCard(
        id=state.served_model_name, created=state.created, root=str(getattr(llm, "model_name", state.served_model_name)),
        max_model_len=llm.max_model_len,
    )
    return json_response(P.ModelList(data=[card]))
