"""The planner (``npu plan``): will a model fit N chips, with which strategy, how fast
(:mod:`sim.planner.plan`).
"""
