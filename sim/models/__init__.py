"""Models from outside: Hugging Face checkpoint folders and llama.cpp GGUF files as the
simulator's files (:mod:`sim.models.checkpoint`, GGUF reading in :mod:`sim.models.gguf_file`)
and the integer model's accuracy against float64 (:mod:`sim.models.accuracy`).
"""
