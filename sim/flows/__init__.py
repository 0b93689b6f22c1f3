"""The ``npu`` commands as functions, under the typed API (:mod:`sim.api`): simulate,
collective, fpga, board, bench.
"""
