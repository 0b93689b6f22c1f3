"""``single``: the whole model on one chip, the reference every strategy equals bit for bit."""

from __future__ import annotations

from ..compiler.grid import Grid
from .base import Split, register
from .grid import GridStrategy
from .roles import whole

__all__ = ["SINGLE"]


class Single(GridStrategy, name="single", splits="nothing: the whole model on one chip",
             relieves="nothing (the reference)", parts=("single",), one_chip=True):
    def layout(self, chips, grid=None):
        self.check_options(chips=chips, grid=grid)
        return Grid()

    def split(self, chips, grid=None):
        return Split()

    def roles(self, npu, cfg, chips, grid, picks):
        return [whole(cfg, 0)]

    def search_limit(self, cfg, npu) -> int:
        return 1


SINGLE = register(Single())
