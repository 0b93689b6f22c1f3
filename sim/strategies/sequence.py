"""``sequence``: the tokens in chunks over the chips (``sim.compiler.sequence``): K/V halos
from the neighbours for windowed attention, K/V chunks around the ring for full attention;
on one chip, a sequence beyond ``max_seq_len`` in passes."""

from __future__ import annotations

import math

from hw.spec import ConfigError

from ..compiler.compat import check_ring_size
from ..compiler.program import SystemProgram
from ..compiler.sequence import check_sequence, compile_sequence
from ..report.timeline import COMM_UNITS, COMPUTE_UNITS, busy_union
from .base import REGISTRY, Split, Strategy, register
from .roles import whole

__all__ = ["SEQUENCE", "sequence_stats"]


def sequence_stats(prog: SystemProgram, comms, spans, cycles=None) -> dict:
    """The chunking and the K/V transfers: bytes (``kv_bytes_sent`` per chip), and on a timed
    backend their cycles (each send's busy interval, summed), per chip the cycles in which it
    only moved K/V rows (``halo_exposed_cycles``) and those in which its transfers ran beside
    compute (``transfer_hidden_cycles``). Ring attention (``merge_cycles``: the cycles its
    state rows add to each chip's launches): their share of each chip's ``cycles``
    (``merge_share``), and the attention unit's busy cycles per chip with their imbalance
    (the busiest over the mean: causal attention gives the last chunk the most keys)."""
    info = dict(prog.meta)
    info.pop("kv_order", None)         # the golden's merge order, not a figure
    info["kv_bytes_sent"] = [sum(c["bytes"] for c in comms
                                 if c["kind"] == "send" and c["from"] == chip)
                             for chip in range(len(prog.chips))]
    info["halo_cycles"] = None
    info["halo_exposed_cycles"] = None
    info["transfer_hidden_cycles"] = None
    if spans is not None:
        info["halo_cycles"] = sum(c.get("cycles", 0) for c in comms if c["kind"] == "send")
        info["halo_exposed_cycles"] = [
            busy_union(span, COMPUTE_UNITS + COMM_UNITS) - busy_union(span, COMPUTE_UNITS)
            for span in spans]
        info["transfer_hidden_cycles"] = [
            busy_union(span, COMM_UNITS) - exposed
            for span, exposed in zip(spans, info["halo_exposed_cycles"], strict=True)]
        if "merge_cycles" in info and cycles:
            info["merge_share"] = [round(m / c, 4) for m, c in
                                   zip(info["merge_cycles"], cycles, strict=True)]
            attn = [busy_union(span, ("attention",)) for span in spans]
            info["attention_cycles"] = attn
            info["attention_imbalance"] = round(max(attn) / (sum(attn) / len(attn)), 3) \
                if sum(attn) else None
    return info


class Sequence(Strategy, name="sequence",
               splits="tokens, in chunks (one chip: passes over a sequence beyond max_seq_len)",
               relieves="max sequence length", parts=("sequence",), quants=("int8",),
               planned="analytic", options=frozenset({"order"})):
    def report_limits(self, npu, cfg, chips, grid, limits, *, samples=None):
        """The ring, the scheme, and each chunk's tokens and keys (:func:`check_sequence`)."""
        check_ring_size(chips, limits)
        limits.run(self.check_quant, cfg.quant)
        check_sequence(npu, cfg, chips, limits=limits)

    def split(self, chips, grid=None):
        return Split()

    def _compile(self, npu, qm, chips, *, seq, samples, microbatches, grid, reduce,
                 order="auto"):
        return compile_sequence(npu, qm, chips, seq=seq, samples=samples, order=order)

    def compile_shapes(self, npu, qm, chips, *, samples, microbatches=None, grid=None,
                       only=None, emit=True):
        if grid is not None or microbatches is not None:
            raise ValueError("sequence takes no grid and no microbatches")
        return compile_sequence(npu, qm, chips, seq=qm.cfg.seq_len, samples=samples,
                                contents=False, check=False, emit=emit,
                                only=None if emit else only)

    def reference_program(self, npu, qm, *, seq, samples):
        """One chip, or, when the sequence does not fit one chip's pass, one chip in passes."""
        prog, why = REGISTRY["single"].reference_program(npu, qm, seq=seq, samples=samples)
        if prog is not None:
            return prog, why
        try:
            return self.compile(npu, qm, 1, seq=seq, samples=samples), " (sequence in passes)"
        except ConfigError as exc:
            return None, f"does not fit one chip: {exc}"

    def sections(self, prog, comms, res, spans) -> dict:
        cycles = [c.get("cycles") for c in res["chips"]] if res.get("chips") else None
        return {"sequence": sequence_stats(prog, comms, spans, cycles)}

    def comm(self, npu, cfg, chips, grid=None):
        if chips <= 1:
            return 0, 0, []
        kv = 2 * cfg.d_kv * cfg.batch             # K and V: n_kv_heads heads each
        if cfg.window:
            return (cfg.window - 1) * kv * (1 if cfg.causal else 2), 0, [
                "sequence: each chunk receives the K/V of the previous window - 1 tokens"
                + ("" if cfg.causal else " from both sides")]
        chunk = math.ceil(cfg.seq_len / chips)
        return (chips - 1) * chunk * kv, 0, [
            "sequence: ring attention passes every chunk's K/V around the ring"]

    def roles(self, npu, cfg, chips, grid, picks):
        return [whole(cfg, c) for c in picks]        # every chunk looks up its tokens

    def search_limit(self, cfg, npu) -> int:
        return cfg.seq_len                    # a token per chip


SEQUENCE = register(Sequence())
