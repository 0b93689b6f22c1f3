"""What each chip of a strategy holds besides its compiled share (:class:`Role`): the layers it
holds and its share of the tables the compiler does not place (embeddings, LM head, final
norm), built by each strategy's :meth:`~sim.strategies.base.Strategy.roles` with the
compilers' splits (``numpy.array_split`` everywhere). What a chip's scratchpad holds is the
compiler's own layout (:meth:`~sim.strategies.base.Strategy.compile_shapes`)."""

from __future__ import annotations

from dataclasses import dataclass

from hw.spec import ModelConfig

__all__ = ["Role", "part", "cut_points", "whole", "stage_roles"]


@dataclass(frozen=True)
class Role:
    """One chip's share of a strategy, as far as the compiler does not lay it out."""

    chip: int
    layers: int                  # transformer blocks it holds
    embeddings: float            # share of the token embedding table (and positions)
    lm_head: float               # share of the LM head (0 when tied and elsewhere)
    final_norm: bool


def part(total: int, parts: int, k: int) -> int:
    """Size of part ``k`` of ``numpy.array_split(range(total), parts)``."""
    q, r = divmod(total, parts)
    return q + (k < r)


def cut_points(total: int, parts: int) -> set:
    """Parts at which :func:`part` changes (and the ends): every distinct share is among
    them."""
    r = total % parts
    return {0, max(0, r - 1), min(parts - 1, r), parts - 1}


def whole(cfg: ModelConfig, chip: int, share: float = 1.0) -> Role:
    """A chip that holds every layer whole (one chip, a data replica, a sequence chunk, a
    head or hidden shard), with ``share`` of the tables."""
    return Role(chip, cfg.n_layers, share, 0.0 if cfg.tie_embeddings else share, True)


def stage_roles(cfg: ModelConfig, count: int, group: int, picks) -> list[Role]:
    """Pipeline stages (``count`` of them), each ``group`` chips splitting heads; the roles of
    the chips ``picks`` (stage ``c // group``, member ``c % group``)."""
    tied = cfg.tie_embeddings
    share = 1.0 / group
    out = []
    for c in picks:
        s = c // group
        last = s == count - 1
        out.append(Role(c, max(1, part(cfg.n_layers, count, s)), share if s == 0 else 0.0,
                        share if last and (not tied or count > 1) else 0.0, last))
    return out
