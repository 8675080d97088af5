"""Benchmarks: `fastgemma bench decode` (engines side by side, llama-bench style)."""
