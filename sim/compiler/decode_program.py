"""A compiled generation: every chip's program and where its inputs and outputs live
(:class:`DecodeProgram`, built by :mod:`sim.compiler.decode` and
:mod:`sim.compiler.decode_hidden`)."""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from hw.spec import NpuConfig
from hw.spec.memory import unpack_rows
from hw.spec.vector import argmax_words, pack_argmax, unpack_argmax

from .quantize import QModel

__all__ = ["DecodeProgram"]


@dataclass
class DecodeProgram:
    """Every chip's generation program and where the inputs and outputs live."""

    npu: NpuConfig
    qm: QModel
    chips: list          #: :class:`~sim.compiler.program.ChipProgram` per chip
    prompt_len: int
    generate: int
    batch: int
    #: Per chip: the global indices of the sequences whose prompts it holds (loaded into
    #: ``prompts``) and of those whose ids and logits are read back from it (``outputs``).
    holds: list
    outputs: list
    #: Per chip: its sequences' prompts as argmax records, sequence-major (loaded; None on a
    #: chip that embeds no prompt).
    prompts: list
    #: Per chip: its sequences' generated ids as argmax records, step-major (None on a
    #: pipeline's middle stages).
    ids: list
    #: Per chip: its int16 logits, step-major rows of its block of the padded vocabulary (and
    #: the rows of a fold's padding; None but on the chips that hold a vocabulary block).
    logits: list
    caches: list         #: per chip, per block: its ``[Q | K | V]`` rows (module docstring)
    #: Per chip: bytes of K and V its caches hold for the whole context (``P + n - 1``
    #: positions of each of its sequences).
    kv_bytes: list = field(default_factory=list)
    #: Per chip: the collectives of the prefill and of one decode step (``{"prefill", "step"}``).
    comms: list = field(default_factory=list)
    strategy: str = "single"
    #: The chips form pipelines: each stage picks one sequence's token at a time.
    pipelined: bool = False
    #: Per chip: the global indices of the sequences whose logits it holds (its vocabulary
    #: block's: read back from every chip of a split vocabulary), and the block's columns
    #: ``(v0, v1)`` of the vocabulary (None on a chip without logits).
    logit_seqs: list = field(default_factory=list)
    vocab: list = field(default_factory=list)
    #: Split-KV decode (``sim.compiler.decode_split``): the positions each chip caches.
    kv_chunks: list | None = None

    @property
    def context(self) -> int:
        return self.prompt_len + self.generate - 1

    @property
    def picker(self) -> int:
        """The chip whose ARGMAX launches pick the tokens that are read back first (the
        first chip with outputs: the last stage of a pipeline)."""
        return next(c for c, seqs in enumerate(self.outputs) if seqs)

    @property
    def picks_per_step(self) -> int:
        """The picker's ARGMAX launches per step: one for all its sequences, or in a pipeline
        one per sequence."""
        return len(self.outputs[self.picker]) if self.pipelined else 1

    @property
    def programs(self) -> list[list[int]]:
        return [c.program for c in self.chips]

    def images(self, prompts) -> list[dict[int, np.ndarray]]:
        """Every chip's initial memory: its weights and tables, and its sequences' prompts
        (``prompts``: ``[B, P]`` ids)."""
        n = self.npu.array_size
        prompts = np.asarray(prompts, np.int64).reshape(self.batch, self.prompt_len)
        out = []
        for c, t, seqs in zip(self.chips, self.prompts, self.holds, strict=True):
            image = dict(c.images)
            if seqs:
                ids = prompts[seqs].reshape(-1)
                image[t.base] = pack_argmax(ids, np.zeros_like(ids), n).reshape(-1, n)
            out.append(image)
        return out

    def reads(self) -> list[list[tuple[int, int]]]:
        """Per chip, the ``(base, words)`` regions to read back: its ids (if it has outputs),
        then its block of the logits (if it holds one)."""
        out = []
        for seqs, lseqs, ids, logits in zip(self.outputs, self.logit_seqs, self.ids,
                                            self.logits, strict=True):
            regions = [(ids.base, ids.words)] if seqs else []
            if lseqs:
                regions.append((logits.base, self.generate * len(lseqs) * logits.row_words))
            out.append(regions)
        return out

    def read(self, regions) -> dict:
        """``ids`` [B, n] (the generated) and ``logits`` [B, n, vocab] from each chip's words
        :meth:`reads` asked for (the logits from the blocks of every chip that holds one)."""
        n, cfg = self.npu.array_size, self.qm.cfg
        ids = np.zeros((self.batch, self.generate), np.int64)
        logits = np.zeros((self.batch, self.generate, cfg.vocab_size), np.int64)
        for c, words in enumerate(regions):
            seqs, lseqs, rec, t = self.outputs[c], self.logit_seqs[c], self.ids[c], \
                self.logits[c]
            if seqs:
                records = np.asarray(words[0], np.uint8).reshape(-1, rec.row_words,
                                                                 n)[:, :argmax_words(n)]
                got, _ = unpack_argmax(records)
                ids[seqs] = got.reshape(self.generate, len(seqs)).T
            if lseqs:
                v0, v1 = self.vocab[c]
                rows = unpack_rows(words[-1], self.generate * len(lseqs), t.cols, 2)
                logits[lseqs, :, v0:v1] = rows[:, :v1 - v0].reshape(
                    self.generate, len(lseqs), -1).transpose(1, 0, 2)
        return {"ids": ids, "logits": logits}
