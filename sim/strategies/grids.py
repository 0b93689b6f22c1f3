"""The grid strategies: ``head+pipeline``, ``data+head`` and ``data+pipeline`` with ``--grid
AxB`` (the first part A chips, the second B), and ``data+pipeline+head`` with ``--grid AxBxC``
(A replicas of B stages of C head shards), each part's communication inside its own group."""

from __future__ import annotations

from .base import register
from .data import DATA
from .grid import Composite
from .head import HEAD
from .pipeline import PIPELINE

__all__ = ["HEAD_PIPELINE", "DATA_HEAD", "DATA_PIPELINE", "DATA_PIPELINE_HEAD"]

HEAD_PIPELINE = register(Composite(HEAD, PIPELINE))
DATA_HEAD = register(Composite(DATA, HEAD))
DATA_PIPELINE = register(Composite(DATA, PIPELINE))
DATA_PIPELINE_HEAD = register(Composite(DATA, PIPELINE, HEAD))
