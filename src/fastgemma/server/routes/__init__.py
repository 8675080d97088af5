"""The routes, one module each: `models` (GET /v1/models, /health, /metrics), `completions`
(POST /v1/completions) and `chat` (POST /v1/chat/completions). Each handler takes the
`ServerState`, the request and its JSON body, and returns the response; app.py wires them."""
