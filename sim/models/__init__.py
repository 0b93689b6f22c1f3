"""Models from outside: Hugging Face checkpoints as the simulator's files
(:mod:`sim.models.checkpoint`) and the integer model's accuracy against float64
(:mod:`sim.models.accuracy`).
"""
