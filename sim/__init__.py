"""npu-scale simulation: golden models, compiler, simulators, CLI."""
