"""What each chip of a strategy holds and runs (:class:`Role`): the planner's unit of a chip's
share, built by each strategy's :meth:`~sim.strategies.base.Strategy.roles` with the
compilers' splits (``numpy.array_split`` everywhere)."""

from __future__ import annotations

from dataclasses import dataclass

from hw.spec import ModelConfig

__all__ = ["Role", "part", "cut_points", "whole", "stage_roles"]


@dataclass(frozen=True)
class Role:
    """One chip's share of a strategy: what it holds and runs."""

    chip: int
    layers: int                  # transformer blocks it holds
    heads: int                   # attention heads of each (whole or, for hidden, pieces)
    head_width: int              # lanes of each head it runs (d_head, or a hidden slice)
    d_model: int                 # residual columns it holds (hidden: its slice)
    ffn: int                     # d_ff columns it holds
    group: int                   # chips that reduce its partial sums (1: none)
    tokens: int                  # sequence tokens it runs (sequence: its chunk)
    samples: tuple               # samples per residual buffer (pipeline: one per microbatch)
    embeddings: float            # share of the token embedding table (and positions)
    lm_head: float               # share of the LM head (0 when tied and elsewhere)
    final_norm: bool
    transfer: bool = False       # residual buffers in the transfer bank (pipeline stages)
    hidden: bool = False         # a hidden-dimension share (columns of the residual)
    halo: int = 0                # K/V rows from neighbours (sequence chunks)


def part(total: int, parts: int, k: int) -> int:
    """Size of part ``k`` of ``numpy.array_split(range(total), parts)``."""
    q, r = divmod(total, parts)
    return q + (k < r)


def cut_points(total: int, parts: int) -> set:
    """Parts at which :func:`part` changes (and the ends): every distinct share is among
    them."""
    r = total % parts
    return {0, max(0, r - 1), min(parts - 1, r), parts - 1}


def whole(cfg: ModelConfig, chip: int, samples) -> Role:
    """A chip that holds every layer whole (one chip, a data replica, a sequence chunk)."""
    return Role(chip, cfg.n_layers, cfg.n_heads, cfg.d_head, cfg.d_model, cfg.d_ff, 1,
                cfg.seq_len, tuple(samples), 1.0, 0.0 if cfg.tie_embeddings else 1.0, True)


def stage_roles(cfg: ModelConfig, count: int, group: int, batch: int, picks) -> list[Role]:
    """Pipeline stages (``count`` of them), each ``group`` chips splitting heads; the roles of
    the chips ``picks`` (stage ``c // group``, member ``c % group``)."""
    micro = min(batch, count)
    samples = tuple(part(batch, micro, m) for m in range(micro))
    tied = cfg.tie_embeddings
    share = 1.0 / group
    out = []
    for c in picks:
        s, g = divmod(c, group)
        last = s == count - 1
        out.append(Role(c, max(1, part(cfg.n_layers, count, s)),
                        max(1, part(cfg.n_heads, group, g)), cfg.d_head, cfg.d_model,
                        max(1, part(cfg.d_ff, group, g)), group, cfg.seq_len, samples,
                        share if s == 0 else 0.0,
                        share if last and (not tied or count > 1) else 0.0, last,
                        transfer=count > 1))
    return out
