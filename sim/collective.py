"""Run one collective on the simulated ring (:class:`hw.ring.testbed.RingTestbed`) and check it.

:func:`simulate_collective` is the pysim driver the tests, the benchmarks and ``npu collective``
share: it packs each chip's buffer into its test DMA in the engine's stream order, issues the
command, waits for the ring to go idle (watchdog: :class:`~sim.rtl.pysim.SimulationTimeout`)
and unpacks every chip's output. :func:`cmd_collective` is the ``npu collective`` command.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import numpy as np

from hw.spec.collective import (
    CollectiveRequest,
    Kind,
    bidirectional_split,
    check_fits,
    local_blocks,
    max_block_words,
    output_blocks,
    pack_blocks,
    reverse_rank,
    step_words,
    steps,
    unpack_blocks,
    word_bytes,
)
from hw.spec.timing.collective import ring_bound_cycles, system_cycles

from .golden import collectives as golden

__all__ = ["chip_inputs", "command_value", "simulate_collective", "cmd_collective"]


def chip_inputs(req: CollectiveRequest, x: np.ndarray) -> list[np.ndarray]:
    """Each chip's local input vector for ``req`` from the CLI's ``X`` ([chips, length]).

    All-reduce and reduce-scatter: row ``i``. All-gather: ``length`` is the result length and a
    member contributes ``X[i]``, which must be its block's length (``X`` has ``length / count``
    columns, so the blocks are equal). Send/recv: the sender's row.
    """
    return [np.asarray(row) for row in x]


def command_value(req: CollectiveRequest) -> dict:
    """The ``command_layout`` value of ``req`` (``rank`` is set per chip by the system)."""
    return {"kind": int(req.kind), "op": int(req.op), "wide": int(req.width == 64),
            "length": req.length, "chips": req.chips, "rank": 0, "first": req.first,
            "count": req.count}


def buffer_words_needed(req: CollectiveRequest, wbytes: int) -> int:
    need = 1
    for chip in range(req.chips):
        sched = steps(req, chip)
        for flag in ("local", "out"):
            need = max(need, sum(step_words(req, s, wbytes) for s in sched if getattr(s, flag)))
    return need + 1


def _rings(req: CollectiveRequest, npu, inputs):
    """``[(request, {chip: rank}, {chip: vector})]`` per ring the system uses for ``req``."""
    if not npu.link_bidirectional:
        return [(req, {c: c for c in range(req.chips)}, dict(enumerate(inputs)))]
    forward, reverse = bidirectional_split(req)
    if reverse is None:
        return [(forward, {c: c for c in range(req.chips)}, dict(enumerate(inputs)))]
    cut = forward.length
    return [(forward, {c: c for c in range(req.chips)},
             {c: np.asarray(x)[:cut] for c, x in enumerate(inputs)}),
            (reverse, {c: reverse_rank(c, req.chips) for c in range(req.chips)},
             {c: np.asarray(x)[cut:] for c, x in enumerate(inputs)})]


def simulate_collective(npu, req: CollectiveRequest, inputs: list, *, stall: float = 0.0,
                        seed: int = 0, max_cycles: int = 200_000, vcd: str | None = None,
                        fifo_words: int | None = None):
    """Simulate ``req`` on a :class:`RingTestbed` built for ``npu`` with pysim.

    ``inputs[i]`` is chip ``i``'s local vector (see :func:`chip_inputs`). ``stall`` is the
    probability, per cycle and per injection point (every link register, every DMA), of a stall.
    ``fifo_words`` defaults to the largest block (at least 16 words). On a bidirectional ring
    an all-reduce is split between the two rings (:func:`bidirectional_split`). Returns
    ``{"outputs": [each chip's result, empty outside the group], "cycles", "sim": {...}}``.
    """
    from hw.ring.testbed import RingTestbed

    from .rtl.pysim import run_sim

    wbytes = word_bytes(npu.link_bytes_per_cycle)
    rings = _rings(req, npu, inputs)
    depth = max(buffer_words_needed(r, wbytes) for r, _, _ in rings)
    fifo_words = fifo_words or max(16, *(max_block_words(r, wbytes) for r, _, _ in rings))
    for r, _, _ in rings:
        check_fits(r, wbytes, fifo_words)
    system = RingTestbed(npu=npu, chips=req.chips, buffer_words=depth, fifo_words=fifo_words)
    dma_sets = [system.dmas, system.rev_dmas][:len(rings)]
    plans = []   # per ring: loads, output word counts, output blocks per chip
    for r, rank, vectors in rings:
        loads, counts, blocks = [], [], []
        for chip in range(req.chips):
            v = rank[chip]
            local = local_blocks(r, v)
            loads.append(pack_blocks(vectors[chip], r, local, wbytes) if local else [])
            counts.append(sum(step_words(r, s, wbytes) for s in steps(r, v) if s.out))
            blocks.append(output_blocks(r, v))
        plans.append((loads, counts, blocks))
    result = {}

    async def bench(ctx):
        for dmas, (loads, _, _) in zip(dma_sets, plans, strict=True):
            for dma, words in zip(dmas, loads, strict=True):
                for addr, word in enumerate(words):
                    ctx.set(dma.in_mem.data[addr], word)
        ctx.set(system.cmd, command_value(req))
        ctx.set(system.start, 1)
        await ctx.tick()
        ctx.set(system.start, 0)
        # A plain loop rather than ctx.tick().until(): if the watchdog fires, an abandoned
        # until() generator raises again when it is garbage-collected.
        await ctx.tick()
        while ctx.get(system.busy):
            await ctx.tick()
        result["cycles"] = ctx.get(system.cycles)
        result["words"] = [[[ctx.get(dma.out_mem.data[a]) for a in range(count)]
                            for dma, count in zip(dmas, counts, strict=True)]
                           for dmas, (_, counts, _) in zip(dma_sets, plans, strict=True)]

    processes = []
    if stall > 0:
        rng = np.random.default_rng(seed)
        link_bits, dma_bits = len(system.stall), len(system.dma_stall)

        async def staller(ctx):
            async for _ in ctx.tick():
                bits = np.flatnonzero(rng.random(link_bits) < stall)
                ctx.set(system.stall, int(sum(1 << int(k) for k in bits)))
                bits = np.flatnonzero(rng.random(dma_bits) < stall)
                ctx.set(system.dma_stall, int(sum(1 << int(k) for k in bits)))

        processes.append(staller)
    stats = run_sim(system, [bench], processes=processes, max_cycles=max_cycles, vcd=vcd)
    dtype = np.int32 if req.width == 32 else np.int64
    outputs = []
    for chip in range(req.chips):
        pieces = []
        for (r, _, _), (_, _, blocks), words in zip(rings, plans, result["words"],
                                                        strict=True):
            if not blocks[chip]:
                continue
            parts = unpack_blocks(words[chip], r, blocks[chip], wbytes)
            if r.kind in (Kind.REDUCE_SCATTER, Kind.SEND_RECV):
                pieces.append(parts[blocks[chip][0]])
            else:
                pieces.append(np.concatenate([parts[b] for b in sorted(parts)]))
        outputs.append(np.concatenate(pieces) if pieces else np.zeros(0, dtype=dtype))
    return {"outputs": outputs, "cycles": result["cycles"], "sim": stats}


def _usage(message):
    from .cli import UsageError

    return UsageError(f"npu collective: {message}")


def _parse_group(text, chips):
    if text is None:
        return 0, chips
    try:
        first, count = (int(part, 0) for part in text.split(":"))
    except ValueError:
        raise _usage(f"--group {text!r} is not FIRST:COUNT") from None
    return first, count


def _load_input(path, chips, width, seed, length_default):
    dtype = np.int32 if width == 32 else np.int64
    if path is None:
        rng = np.random.default_rng(seed)
        info = np.iinfo(dtype)
        return rng.integers(info.min, info.max, size=(chips, length_default), dtype=dtype,
                            endpoint=True)
    try:
        x = np.load(path, allow_pickle=False)
    except (OSError, ValueError) as exc:
        raise _usage(f"cannot read --input {path}: {exc}") from None
    if not isinstance(x, np.ndarray):
        x = _stack_archive(x, path, chips)
    if x.ndim != 2 or x.shape[0] != chips:
        raise _usage(f"--input {path} has shape {x.shape}; expected [{chips}, length] "
                     f"(one row per chip, all rows the same length)")
    if x.shape[1] == 0:
        raise _usage(f"--input {path} has zero length")
    if x.dtype.kind not in "iu":
        raise _usage(f"--input {path} has dtype {x.dtype}; expected an integer array")
    info = np.iinfo(dtype)
    if x.size and (x.min() < info.min or x.max() > info.max):
        raise _usage(f"--input {path} has values outside int{width} "
                     f"[{x.min()}, {x.max()}]; use --width 64")
    return x.astype(dtype)


def _stack_archive(npz, path, chips):
    """An ``.npz`` input with ``chip0..chip{N-1}``: every chip's buffer must be as long."""
    with npz:
        names = [f"chip{i}" for i in range(chips)]
        missing = [n for n in names if n not in npz.files]
        if missing or len(npz.files) != chips:
            raise _usage(f"--input {path} must hold arrays {names[0]}..{names[-1]} "
                         f"(has {', '.join(npz.files) or 'nothing'})")
        rows = [npz[n] for n in names]
    for name, row in zip(names, rows, strict=True):
        if row.ndim != 1:
            raise _usage(f"--input {path}: {name} has shape {row.shape}; expected a vector")
        if row.shape != rows[0].shape:
            raise _usage(f"--input {path}: length mismatch between chips: chip0 has "
                         f"{rows[0].shape[0]} elements, {name} has {row.shape[0]}")
    return np.stack(rows)


def cmd_collective(args) -> int:
    """``npu collective``: exit 0 when every chip matches the golden, 1 otherwise."""
    from .cli import EXIT_MISMATCH, EXIT_OK, EXIT_WATCHDOG, _load
    from .rtl.pysim import SimulationTimeout

    npu = _load(args, "npu")
    try:
        word_bytes(npu.link_bytes_per_cycle)
    except ValueError as exc:
        raise _usage(f"{exc} ({args.npu})") from None
    chips = args.chips
    first, count = _parse_group(args.group, chips)
    x = _load_input(args.input, chips, args.width, args.seed, 4 * chips + 3)
    length = x.shape[1]
    req_length = length * count if args.kind == "all_gather" else length
    try:
        req = CollectiveRequest(kind=args.kind, op=args.op, width=args.width, length=req_length,
                                chips=chips, first=first, count=count)
    except (TypeError, ValueError) as exc:
        raise _usage(str(exc)) from None
    inputs = chip_inputs(req, x)
    max_cycles = getattr(args, "max_cycles", None) or 2_000_000
    try:
        run = simulate_collective(npu, req, inputs, max_cycles=max_cycles)
    except SimulationTimeout as exc:
        print(f"npu collective: {exc}", file=sys.stderr)
        return EXIT_WATCHDOG
    expected = golden.collective(req, inputs)
    mismatches = []
    for chip, (got, want) in enumerate(zip(run["outputs"], expected, strict=True)):
        if got.shape != want.shape:
            mismatches.append(f"chip {chip}: {got.shape[0]} elements, expected {want.shape[0]}")
        elif not np.array_equal(got, want):
            bad = int(np.flatnonzero(got != want)[0])
            mismatches.append(f"chip {chip} element {bad}: {got[bad]} != golden {want[bad]}")
    elem_bytes = args.width // 8
    message_bytes = req.length * elem_bytes
    link = npu.link_bytes_per_cycle
    bound = (ring_bound_cycles(req.kind, message_bytes, count, link, npu.link_latency_cycles)
             if count > 1 else 0)
    report = {
        "kind": args.kind, "op": args.op, "chips": chips, "width": args.width,
        "group": {"first": first, "count": count}, "length": length, "seed": args.seed,
        "npu": npu.name, "cycles": run["cycles"], "bytes": message_bytes,
        "link_bytes_per_cycle": link, "link_latency_cycles": npu.link_latency_cycles,
        "link_bidirectional": npu.link_bidirectional,
        "model_cycles": system_cycles(req, link, npu.link_latency_cycles,
                                      npu.link_bidirectional),
        "bound_cycles": bound, "ratio": run["cycles"] / bound if bound else None,
        "golden_match": not mismatches, "mismatches": mismatches[:10],
        "sim": {"wall_s": run["sim"]["wall_s"], "cycles_per_s": run["sim"]["cycles_per_s"]},
    }
    if args.output:
        written = _write_output(args.output, run["outputs"])
        report["output"] = str(written)
    if args.json:
        Path(args.json).parent.mkdir(parents=True, exist_ok=True)
        Path(args.json).write_text(json.dumps(report, indent=2) + "\n")
    ratio = f"{report['ratio']:.3f}" if bound else "n/a"
    print(f"{args.kind} {args.op} int{args.width} on {count} of {chips} chips, {length} "
          f"elements ({message_bytes} B): {run['cycles']} cycles, bound {bound}, ratio {ratio}, "
          f"golden {'match' if not mismatches else 'MISMATCH'}")
    for line in mismatches[:10]:
        print(f"  {line}")
    return EXIT_OK if not mismatches else EXIT_MISMATCH


def _write_output(path, outputs):
    lengths = {o.shape[0] for o in outputs}
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    if len(lengths) == 1:
        np.save(path, np.stack(outputs))
        return path
    if path.suffix != ".npz":
        path = path.with_suffix(".npz")
    np.savez(path, **{f"chip{i}": o for i, o in enumerate(outputs)})
    return path
