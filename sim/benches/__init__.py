"""Benchmark modules: each defines `run(quick: bool) -> list[dict]` (see sim.flows.bench)."""
