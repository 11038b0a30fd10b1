"""kernels.attention against torch's scaled_dot_product_attention with the cuDNN and the flash
backends, in one run: TFLOP/s and the ratio to the better backend, causal and not.

    PYTHONPATH=. python3 tools/peers/bench_attention.py [--json FILE] [--repeats N] [--quick] [--dims D|D/DV ...]
        [--seqs S ...] [--dtype bfloat16|float16]
    PYTHONPATH=. python3 tools/peers/bench_attention.py --varlen [--json FILE] [--repeats N] [--dtype ...]
    PYTHONPATH=. python3 tools/peers/bench_attention.py --decode | --decode-sweep [--json FILE] [--repeats N]
        [--decode-grid acceptance|quick|focus] [--quick] [--clean] [--decode-batches B ...] [--decode-alts NAME ...]
        [--decode-rows GROUP:PAGE:BATCH:CONTEXT ...]
    PYTHONPATH=. python3 tools/peers/bench_attention.py --backward [--json FILE] [--repeats N] [--quick]
        [--dims D ...] [--seqs S ...] [--dtype bfloat16|float16] [--deterministic]

Shapes keep 16k tokens a batch (batch = 16384 / seq) at head dim 64 (32 heads), 128 (16
heads) and 256 (8 heads); other head dims (``--dims 96 192/128``: Q/K's over V's) keep heads x
head dim at 2048. The three run in interleaved rounds, timed twice: cold (each call after a
write that evicts L2) and back to back; the ratio is the median of per-round ratios. FLOPs:
2 * batch * heads * seq^2 * (head_dim + head_dim_v), half of it causal. Each row also checks
our output against the first peer's (cuDNN, flash, or torch's memory-efficient backend where
the others refuse V's head dim). At head dims 64 and 128 the pre-Hopper kernel kept from seed
002 (kernels.attention_cp_async) runs in the same rounds.

``--varlen``: kernels.attention_varlen over 16k packed tokens at each --dims head dim (16 heads at
128, 32 at 64, 8 at 256): four sequences of 4096 and 128 of 128 (their time against the dense
kernel on as many sequences of that length is the varlen path's own cost), eight ragged ones
(256 to 5120), 128 short ones (32 to 224) and 512 tiny ones (8 to 56; planned in windows of 128
packed rows, as the short ones causal), each against the dense kernel at the same token
count (batch x seq = 16k, ratio of TFLOP/s: the FLOPs differ) and torch's flash varlen
(``torch.nn.attention.varlen.varlen_attn``, where torch has it), cold and back to back (about
30 s a head dim).

``--decode``: kernels.attention_decode over a paged cache (random block tables, every request
at the full context) against torch SDPA (the fastest backend that takes q_len 1 with GQA) over
the same keys and values in a contiguous (batch, heads_kv, context, head_dim) cache, and
against a device-to-device copy of the K+V bytes (two copies: K, then V), in the same rounds:
GB/s of K+V read (the copy: read + written) and the ratios; back to back, each function's
samples follow an untimed call of its own. Head dim 128, 8 kv heads. ``--decode-grid
acceptance`` (the default): issue 32's grid, GQA 4:1 and 8:1 x pages 16 and 64 x batch 1, 4,
16, 64, 128 x context 1k, 8k, 32k, 128k, less the rows whose three caches (paged, contiguous,
the copy's destination) pass ~60 GB (batch x context over 4M tokens: batch 64 and 128 stop
at 32k), 72 rows; ``--decode-grid quick`` (or ``--quick``): 16 rows at the weak corners (batch
1 at every context, page 16, GQA 8:1, batch 128 at 1k; under a minute on an H200), each also
timing our call with the other L2 priority, at 2-16 splits the other merge of the splits (cl0:
workspace and counter, cl1: a cluster through distributed shared memory) and at batch 1 16
splits in a cluster (s16cl), in the same rounds ("alt" cells: their time over the plan's,
above 1 = the plan is faster). Each row prints the plan (splits, evict-first, persistent,
cluster merge); ``--decode-grid focus``: the 12 rows still short of issue 32's goal
(session 18: batch 1 at 1k-32k, batch 16 at 8k-32k, batch 64 at 8k, batch 128 at 1k) with the
quick grid's alternatives; ``--decode-rows 8:16:1:131072 ...``: these rows (GQA group, page,
batch, context) alone, with the quick grid's alternatives; ``--clean``: also cold after a read of
2x L2 instead of a write (the write leaves the whole L2 dirty, and a call after it writes that
back as it reads).
``--decode-sweep``: the same shapes at page 16, the automatic plan against other split counts
and the other L2 priority, with the copy, in the same rounds (cold, clean and back to back):
the best per row.

``--backward``: kernels.attention_backward (dq, dk, dv from the forward's out and log-sum-exp)
against the backward of torch SDPA's cuDNN and flash backends (autograd.grad through an SDPA
output recorded under that backend), the same shapes and rounds as the forward; FLOPs 2.5x the
forward's. Each row checks our dq against the cuDNN one; ``--deterministic`` times that mode;
``--quick``: head dims 64 and 128, seq 1k and 4k (under a minute).
``--varlen --backward``: kernels.attention_varlen_backward over 16k packed tokens (8 x 2048, and
the ragged 8) against the dense backward of batch 8 x 2048, head dims 64 and 128, TFLOP/s
against TFLOP/s, both timings.
"""
from __future__ import annotations

import argparse

from tmaflow import bench, kernels

CP_ASYNC_HEAD_DIMS = (64, 128)  # the head dims kernels.attention_cp_async takes
COLUMNS = ["dtype", "d", "seq", "batch", "causal", "best_peer", "cold ratio", "warm ratio", "rel_err_vs_peer"]
DECODE_COLUMNS = ["group", "page", "batch", "context", "splits", "evict_first", "persistent", "head_group",
                  "slice_merge", "best_peer", "cold GB/s", "cold ratio", "cold vs memcpy", "warm ratio", "warm vs memcpy",
                  "rel_err_vs_peer"]
DECODE_SWEEP_COLUMNS = ["group", "page", "batch", "context", "splits", "evict_first", "cold GB/s", "cold vs memcpy",
                        "cold best", "cold best vs auto", "clean best", "clean best vs auto", "warm best",
                        "warm best vs auto"]
DECODE_TOKENS = 1 << 22  # batch x context at most: 16 GiB of K+V a layout at 8 kv heads, head dim 128
VARLEN_COLUMNS = ["dtype", "d", "case", "causal", "cold tflops", "cold vs dense", "cold vs flash varlen", "warm vs dense",
                  "warm vs flash varlen", "rel_err_vs_peer"]
# Packed batches of 16k tokens: (sequence lengths, the dense (batch, seq) of as many tokens).
VARLEN_CASES = {"equal 4x4096": ([4096] * 4, (4, 4096)),
                "ragged 8": ([5120, 1024, 3072, 512, 2048, 256, 4096, 256], (8, 2048)),
                "short 128": ([32, 96, 160, 224] * 32, (128, 128)),
                "equal 128x128": ([128] * 128, (128, 128)),
                "tiny 32": ([8, 24, 40, 56] * 128, (512, 32))}


def _cold_and_warm(fns: dict, repeats: int, settle: int = 0):
    """(mode, rounds) of ``fns`` timed both ways, in turn: every call after an L2 flush
    ("cold"), and back to back ("warm"; ``settle`` untimed calls of a function before each of
    its samples, so the first timed call follows its own, not another's dirty L2)."""
    yield "cold", bench.rounds(fns, repeats=repeats, warmup=2, flush_l2=True)
    yield "warm", bench.rounds(fns, repeats=repeats, warmup=2, batch=5, settle=settle)


def _tflops_cells(fns: dict, flop: float, repeats: int, row: dict) -> list[str]:
    """Both timings of ``fns`` in TFLOP/s, tmaflow's against the fastest peer (neither tmaflow
    nor cp.async; none when every backend refused the shape), recorded in ``row``; one printed
    cell a timing."""
    cells = []
    for mode, got in _cold_and_warm(fns, repeats):
        tflops = {name: flop / got[name].median / 1e12 for name in fns}
        best = max((n for n in fns if n not in ("tmaflow", "cp.async")), key=lambda n: tflops[n], default=None)
        ratio = got.ratio("tmaflow", best).median if best is not None else None
        row.update({f"{mode} tflops": tflops, "best_peer": best, f"{mode} ratio": ratio})
        cells.append(f"{mode} " + " ".join(f"{n} {tflops[n]:6.1f}" for n in fns) +
                     (f" ratio to {best} {ratio:.3f}" if best is not None else " (no peer)"))
    return cells


def _head_dims(text: str) -> tuple[int, int]:
    """--dims entries: "D" (Q, K and V alike) or "D/DV"."""
    d, _, dv = text.partition("/")
    return int(d), int(dv or d)


def _heads(d: int) -> int:
    return {64: 32, 128: 16, 256: 8}.get(d, max(1, 2048 // d))


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--json")
    p.add_argument("--repeats", type=int, default=10)
    p.add_argument("--quick", action="store_true", help="seq 1k and 4k only (--decode: 4 shapes a page size)")
    p.add_argument("--dims", type=_head_dims, nargs="+", default=[(64, 64), (128, 128), (256, 256)],
                   help="head dims to run: D, or D/DV for V's apart from Q's and K's (e.g. 96 192/128)")
    p.add_argument("--seqs", type=int, nargs="+", help="sequence lengths (default 512 to 16k)")
    p.add_argument("--dtype", default="bfloat16", choices=["bfloat16", "float16"])
    p.add_argument("--decode", action="store_true", help="paged-KV decode against SDPA and the copy ceiling")
    p.add_argument("--decode-sweep", action="store_true",
                   help="paged-KV decode: split counts and L2 priority against the automatic plan")
    p.add_argument("--decode-grid", choices=["acceptance", "quick", "focus"], default="acceptance",
                   help="--decode/--decode-sweep rows: issue 32's acceptance grid (72 rows), its weak corners (16) "
                   "or the rows still short of the goal (12)")
    p.add_argument("--decode-batches", type=int, nargs="+", help="--decode: only the grid's rows of these batch sizes")
    p.add_argument("--decode-alts", nargs="+", help="--decode: only these alternatives beside the plan (e.g. hg p0)")
    p.add_argument("--decode-rows", type=_decode_row_spec, nargs="+",
                   help="--decode: only these rows, GROUP:PAGE:BATCH:CONTEXT each (e.g. 8:16:1:131072)")
    p.add_argument("--clean", action="store_true", help="--decode: also time cold after a read of 2x L2 (no dirty line)")
    p.add_argument("--backward", action="store_true", help="dq, dk, dv against the SDPA backends' backward")
    p.add_argument("--deterministic", action="store_true", help="--backward: time deterministic=True")
    p.add_argument("--varlen", action="store_true", help="packed sequences against the dense kernel and flash varlen "
                   "(with --backward: the varlen backward against the dense backward)")
    args = p.parse_args()
    if args.decode_sweep:
        return decode_sweep(args)
    if args.decode:
        return decode(args)
    if args.varlen and args.backward:
        return varlen_backward(args)
    if args.backward:
        return backward(args)
    if args.varlen:
        return varlen(args)
    import torch  # optional dependency, before the driver is touched: --help works without it
    from torch.nn.attention import SDPBackend, sdpa_kernel

    seqs = args.seqs or ((1024, 4096) if args.quick else (512, 1024, 2048, 4096, 8192, 16384))
    rows = []
    for d, dv in args.dims:
        heads = _heads(d)
        for seq in seqs:
            batch = max(1, 16384 // seq)
            dt = getattr(torch, args.dtype)
            q, k = (torch.randn(batch, heads, seq, d, device="cuda", dtype=dt) for _ in range(2))
            v = torch.randn(batch, heads, seq, dv, device="cuda", dtype=dt)
            out = torch.empty(batch, heads, seq, dv, device="cuda", dtype=dt)
            for causal in (False, True):
                def sdpa(backend):
                    def run():
                        with sdpa_kernel(backend):
                            return torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=causal)
                    return run
                fns = {"tmaflow": kernels.attention.prepare(q, k, v, out, causal=causal),
                       "cudnn": sdpa(SDPBackend.CUDNN_ATTENTION), "flash": sdpa(SDPBackend.FLASH_ATTENTION)}
                if dv != d:  # the backend that takes V's own head dim when the others refuse it
                    fns["efficient"] = sdpa(SDPBackend.EFFICIENT_ATTENTION)
                if d == dv and d in CP_ASYNC_HEAD_DIMS and args.dtype == "bfloat16":  # seed 002's schedule, for scale
                    fns["cp.async"] = kernels.attention_cp_async.prepare(q, k, v, torch.empty_like(q), causal=causal)
                available = _available(fns)
                torch.cuda.synchronize()
                peer = next((available[n] for n in ("cudnn", "flash", "efficient") if n in available), None)
                err = None
                if peer is not None:
                    ref = peer().float()
                    err = (torch.linalg.norm(out.float() - ref) / torch.linalg.norm(ref)).item()
                flop = 2.0 * batch * heads * seq * seq * (d + dv) / (2 if causal else 1)
                row = {"dtype": args.dtype, "d": d if d == dv else f"{d}/{dv}", "seq": seq, "batch": batch,
                       "heads": heads, "causal": causal, "rel_err_vs_peer": err}
                cells = _tflops_cells(available, flop, args.repeats, row)
                rows.append(row)
                print(f"{'fp16' if args.dtype == 'float16' else 'bf16'} d{row['d']!s:<7} seq {seq:6d} b{batch:<3d} "
                      f"{'causal' if causal else 'full  '} " + " | ".join(cells) + f"  TFLOP/s  err {_fmt(err, '.1e')}", flush=True)
    if args.json:
        bench.records.write(args.json, "attention", "Attention against torch SDPA (cuDNN, flash)", COLUMNS, rows,
                            repeats=args.repeats)


def _fmt(value, spec: str) -> str:
    return "n/a" if value is None else format(value, spec)


def _available(fns: dict) -> dict:
    """The functions of ``fns`` that run (a backend may refuse a shape), each run once."""
    available = {}
    for name, fn in fns.items():
        try:
            fn()
            available[name] = fn
        except RuntimeError as exc:  # a backend that does not take this shape
            print(f"  {name} unavailable: {str(exc).splitlines()[0][:100]}")
    return available


def varlen(args):
    import torch  # optional dependency, as in main

    rows = []
    for d in [d for d, dv in args.dims if d == dv]:
        for case, (lengths, dense) in VARLEN_CASES.items():
            for causal in (False, True):
                rows.append(_varlen_row(torch, args, d, case, lengths, dense, causal))
    if args.json:
        bench.records.write(args.json, "attention_varlen", "Packed sequences against the dense kernel and flash varlen",
                            VARLEN_COLUMNS, rows, repeats=args.repeats)


VARLEN_BACKWARD_COLUMNS = ["dtype", "d", "case", "causal", "cold tflops", "cold vs dense", "warm tflops", "warm vs dense",
                           "rel_err_vs_dense"]


def varlen_backward(args):
    """``--varlen --backward``: kernels.attention_varlen_backward over packed batches of 16k
    tokens against the dense backward of as many tokens (the acceptance's "within 5% of the dense
    kernel at equal total tokens": TFLOP/s against TFLOP/s), both timings; gradients of the
    equal-length case checked against the dense kernel's."""
    import torch  # optional dependency, as in main

    rows = []
    dims = [d for d, dv in args.dims if d == dv and d in (64, 128)]
    for d in dims:
        for case in ("equal 8x2048", "ragged 8"):
            lengths, dense = ([2048] * 8, (8, 2048)) if case == "equal 8x2048" else VARLEN_CASES["ragged 8"]
            for causal in (False, True):
                rows.append(_varlen_backward_row(torch, args, d, case, lengths, dense, causal))
    if args.json:
        bench.records.write(args.json, "attention_varlen_backward",
                            "Varlen backward against the dense backward at equal tokens", VARLEN_BACKWARD_COLUMNS, rows,
                            repeats=args.repeats)


def _varlen_backward_row(torch, args, d: int, case: str, lengths: list, dense: tuple, causal: bool) -> dict:
    import itertools

    heads, dt = 16, getattr(torch, args.dtype)
    (batch, seq), total, longest = dense, sum(lengths), max(lengths)
    cu = torch.tensor([0, *itertools.accumulate(lengths)], device="cuda", dtype=torch.int32)
    q, k, v, dout = (torch.randn(batch, heads, seq, d, device="cuda", dtype=dt) for _ in range(4))
    out, lse = kernels.attention(q, k, v, causal=causal, return_lse=True)
    packed = [x.transpose(1, 2).reshape(total, heads, d).contiguous() for x in (q, k, v, dout)]
    pout, plse = kernels.attention_varlen(*packed[:3], cu, cu, longest, longest, causal=causal, return_lse=True)
    grads = [torch.empty_like(x) for x in packed[:3]]
    fns = {"tmaflow": kernels.attention_varlen_backward.prepare(*packed[:3], pout, packed[3], plse, cu, cu, longest,
                                                                longest, causal=causal, dq=grads[0], dk=grads[1],
                                                                dv=grads[2]),
           "dense": kernels.attention_backward.prepare(q, k, v, out, dout, lse, causal=causal)}
    for fn in fns.values():
        fn()
    err = None
    if case.startswith("equal"):  # the same sequences both ways
        want = [x.transpose(1, 2).reshape(total, heads, d).float() for x in fns["dense"]()]
        err = max((torch.linalg.norm(g.float() - w) / torch.linalg.norm(w)).item() for g, w in zip(grads, want))
    half = 0.5 if causal else 1.0
    flop = {"tmaflow": 2.5 * 4.0 * heads * d * sum(n * n for n in lengths) * half,
            "dense": 2.5 * 4.0 * batch * heads * seq * seq * d * half}
    row = {"dtype": args.dtype, "d": d, "case": case, "causal": causal, "tokens": total, "rel_err_vs_dense": err}
    cells = []
    for mode, got in _cold_and_warm(fns, args.repeats):
        tflops = {n: flop[n] / got[n].median / 1e12 for n in fns}
        row[f"{mode} tflops"] = tflops["tmaflow"]
        row[f"{mode} vs dense"] = got.ratio("tmaflow", "dense").median * flop["tmaflow"] / flop["dense"]
        cells.append(f"{mode} varlen {tflops['tmaflow']:6.1f} dense {tflops['dense']:6.1f} "
                     f"vs dense {row[f'{mode} vs dense']:.3f}")
    print(f"varlen bwd d{d:<4d} {case:<13} {'causal' if causal else 'full  '} " + " | ".join(cells) +
          f"  TFLOP/s  err {_fmt(err, '.1e')}", flush=True)
    return row


def _flash_varlen(torch):
    """torch's flash varlen forward as f(q, k, v, cu, max_len, causal), or None without one
    (torch.nn.attention.varlen: is_causal until 2.10, a (left, right) window after)."""
    import inspect

    try:
        from torch.nn.attention.varlen import varlen_attn
    except ImportError:
        return None
    if "is_causal" in inspect.signature(varlen_attn).parameters:
        return lambda q, k, v, cu, n, causal: varlen_attn(q, k, v, cu, cu, n, n, is_causal=causal)
    return lambda q, k, v, cu, n, causal: varlen_attn(q, k, v, cu, cu, n, n, window_size=(-1, 0 if causal else -1))


def _varlen_row(torch, args, d: int, case: str, lengths: list, dense: tuple, causal: bool) -> dict:
    import itertools

    heads, dt = _heads(d), getattr(torch, args.dtype)
    total, longest, (batch, seq) = sum(lengths), max(lengths), dense
    cu = torch.tensor([0, *itertools.accumulate(lengths)], device="cuda", dtype=torch.int32)
    q, k, v = (torch.randn(total, heads, d, device="cuda", dtype=dt) for _ in range(3))
    dq, dk, dv = (torch.randn(batch, heads, seq, d, device="cuda", dtype=dt) for _ in range(3))
    out, dense_out = torch.empty_like(q), torch.empty_like(dq)
    fns = {"tmaflow": kernels.attention_varlen.prepare(q, k, v, cu, cu, longest, longest, out, causal=causal),
           "dense": kernels.attention.prepare(dq, dk, dv, dense_out, causal=causal)}
    flash = _flash_varlen(torch)
    if flash is not None:
        fns["flash varlen"] = lambda: flash(q, k, v, cu, longest, causal)
    available = _available(fns)
    torch.cuda.synchronize()
    err = None
    if "flash varlen" in available:
        ref = available["flash varlen"]().float()
        err = (torch.linalg.norm(out.float() - ref) / torch.linalg.norm(ref)).item()
    half = 2 if causal else 1
    flop = {"tmaflow": 4.0 * heads * d * sum(n * n for n in lengths) / half,
            "dense": 4.0 * batch * heads * seq * seq * d / half}
    flop["flash varlen"] = flop["tmaflow"]
    row = {"dtype": args.dtype, "d": d, "case": case, "causal": causal, "tokens": total, "rel_err_vs_peer": err}
    cells = []
    for mode, got in _cold_and_warm(available, args.repeats):
        tflops = {n: flop[n] / got[n].median / 1e12 for n in available}
        row[f"{mode} tflops"] = tflops["tmaflow"]
        row[f"{mode} all tflops"] = tflops
        # TFLOP/s ratios: the dense kernel's batch does other FLOPs at the same token count
        row[f"{mode} vs dense"] = got.ratio("tmaflow", "dense").median * flop["tmaflow"] / flop["dense"]
        row[f"{mode} vs flash varlen"] = (got.ratio("tmaflow", "flash varlen").median if "flash varlen" in available
                                          else None)
        cells.append(f"{mode} " + " ".join(f"{n} {tflops[n]:6.1f}" for n in available) +
                     f" vs dense {row[f'{mode} vs dense']:.3f} vs flash {_fmt(row[f'{mode} vs flash varlen'], '.3f')}")
    print(f"varlen d{d:<4d} {case:<13} {'causal' if causal else 'full  '} " + " | ".join(cells) +
          f"  TFLOP/s  err {_fmt(err, '.1e')}", flush=True)
    return row


def backward(args):
    import torch  # optional dependency, as in main

    seqs = args.seqs or ((1024, 4096) if args.quick else (512, 1024, 2048, 4096, 8192, 16384))
    dims = [d for d, dv in args.dims if d == dv and (d in (64, 128) or not args.quick)]
    rows = []
    for d, heads in ((d, _heads(d)) for d in dims):
        for seq in seqs:
            for causal in (False, True):
                rows.append(_backward_row(torch, args, d, heads, seq, causal))
    if args.json:
        bench.records.write(args.json, "attention_backward", "Attention backward against torch SDPA (cuDNN, flash)",
                            COLUMNS, rows, repeats=args.repeats, deterministic=args.deterministic)


def _backward_row(torch, args, d: int, heads: int, seq: int, causal: bool) -> dict:
    from torch.nn.attention import SDPBackend, sdpa_kernel

    batch, dt = max(1, 16384 // seq), getattr(torch, args.dtype)
    q, k, v, dout = (torch.randn(batch, heads, seq, d, device="cuda", dtype=dt) for _ in range(4))
    out, lse = kernels.attention(q, k, v, causal=causal, return_lse=True)
    grads = [torch.empty_like(x) for x in (q, k, v)]

    def sdpa(backend):
        leaves = [x.detach().requires_grad_() for x in (q, k, v)]
        with sdpa_kernel(backend):
            o = torch.nn.functional.scaled_dot_product_attention(*leaves, is_causal=causal)
        return lambda: torch.autograd.grad(o, leaves, dout, retain_graph=True)
    fns = {"tmaflow": kernels.attention_backward.prepare(q, k, v, out, dout, lse, causal=causal,
                                                         deterministic=args.deterministic, dq=grads[0],
                                                         dk=grads[1], dv=grads[2])}
    for name, backend in (("cudnn", SDPBackend.CUDNN_ATTENTION), ("flash", SDPBackend.FLASH_ATTENTION)):
        try:
            fns[name] = sdpa(backend)
            fns[name]()
        except RuntimeError as exc:  # a backend that does not take this shape
            fns.pop(name, None)
            print(f"  {name} unavailable: {str(exc).splitlines()[0][:100]}")
    fns["tmaflow"]()
    torch.cuda.synchronize()
    ref = fns[next(n for n in fns if n != "tmaflow")]()[0].float()
    err = (torch.linalg.norm(grads[0].float() - ref) / torch.linalg.norm(ref)).item()
    flop = 2.5 * 4.0 * batch * heads * seq * seq * d / (2 if causal else 1)
    row = {"dtype": args.dtype, "d": d, "seq": seq, "batch": batch, "heads": heads, "causal": causal,
           "rel_err_vs_peer": err}
    cells = _tflops_cells(fns, flop, args.repeats, row)
    print(f"bwd {'fp16' if args.dtype == 'float16' else 'bf16'} d{d:<4d} seq {seq:6d} b{batch:<3d} "
          f"{'causal' if causal else 'full  '} " + " | ".join(cells) + f"  TFLOP/s  dq err {err:.1e}", flush=True)
    return row


DECODE_BATCHES, DECODE_CONTEXTS = (1, 4, 16, 64, 128), (1024, 8192, 32768, 131072)
DECODE_GROUPS, DECODE_PAGES = (4, 8), (16, 64)
# The weak corners (group, page, batch, context), most telling first: batch 1 at every context
# (too few requests to fill the GPU without splits), page 16, GQA 8:1, many short requests.
DECODE_QUICK = [(8, 16, 1, 1024), (8, 16, 1, 8192), (8, 16, 1, 32768), (8, 16, 1, 131072), (8, 16, 128, 1024),
                (4, 16, 1, 1024), (4, 16, 1, 8192), (4, 16, 1, 32768), (4, 64, 1, 8192), (4, 64, 1, 131072),
                (4, 64, 128, 1024), (4, 16, 64, 1024), (8, 16, 16, 32768), (4, 16, 16, 8192), (8, 64, 4, 8192),
                (8, 64, 64, 8192)]
# Issue 32's rows still short of the goal (session 18), the furthest first (a run cut short keeps
# them): batch 16 at 8k and 32k (4:1 and 8:1, page 16), batch 1 at 1k-32k (GQA 4:1, pages 16 and
# 64), batch 64 at 8k (8:1, page 64), batch 128 at 1k (8:1, page 16).
DECODE_FOCUS = [(4, 16, 16, 8192), (4, 16, 1, 8192), (8, 16, 16, 32768), (8, 16, 16, 8192), (4, 16, 16, 32768),
                (4, 16, 1, 1024), (4, 16, 1, 32768), (8, 64, 64, 8192), (4, 64, 1, 8192), (8, 16, 128, 1024),
                (4, 64, 1, 1024), (4, 64, 1, 32768)]


def _decode_row_spec(text: str) -> tuple[int, int, int, int]:
    """--decode-rows entries: "GROUP:PAGE:BATCH:CONTEXT"."""
    parts = text.split(":")
    if len(parts) != 4 or not all(p.isdigit() for p in parts):
        raise argparse.ArgumentTypeError(f"{text!r}: give GROUP:PAGE:BATCH:CONTEXT, e.g. 8:16:1:131072")
    group, page, batch, ctx = (int(p) for p in parts)
    return group, page, batch, ctx


def _decode_grid(args) -> list[tuple[int, int, int, int]]:
    """(group, page, batch, context) rows, GQA 4:1 page 16 first. The acceptance grid keeps the
    rows whose caches fit: 4M tokens a row at most (17 GB of K+V a layout at 8 kv heads, head
    dim 128; the paged cache, SDPA's contiguous one and the copy's destination make 52 GB), so
    batch 64 and 128 stop at 32k. ``--decode-rows``: those rows, in their order."""
    if getattr(args, "decode_rows", None):
        grid = list(args.decode_rows)
    elif args.quick or args.decode_grid in ("quick", "focus"):
        grid = list(DECODE_FOCUS if args.decode_grid == "focus" else DECODE_QUICK)
    else:
        grid = [(group, page, b, c) for group in DECODE_GROUPS for page in DECODE_PAGES
                for b in DECODE_BATCHES for c in DECODE_CONTEXTS if b * c <= DECODE_TOKENS]
    return [row for row in grid if not args.decode_batches or row[2] in args.decode_batches]


def _decode_plan(batch: int, ctx: int, heads_kv: int, page: int, device=None):
    """What a call plans at head dim 128 on ``device`` (the current one by default):
    decode_defaults' splits, evict_first, persistent, cluster_merge, head_group, slice_merge,
    items (CTAs a request and split) and ctas (1: one CTA an SM asked for by the plan)."""
    from tmaflow.kernels.decode_plan import decode_defaults
    from tmaflow.runtime.device import current_device

    return decode_defaults(batch, heads_kv, 128, page, ctx, device or current_device())


def decode_call(choice: dict) -> tuple[bool, dict]:
    """An alternative's (ordered, attention_decode's keyword options): "ordered" (the caches
    with their pages in table order) is not an option of the call."""
    options = {name: value for name, value in choice.items() if value is not None}
    return bool(options.pop("ordered", False)), options


def _decode_alternatives(args, batch: int, ctx: int, heads_kv: int, page: int, device=None) -> dict:
    """name -> attention_decode's options (and "ordered", see decode_call) timed beside the plan in the
    quick grid's rows: the other L2 priority, at batch 1 twice the splits merged in a cluster
    (up to 16, down to one 64-key tile a split: "s16cl"), a persistent plan's one CTA an item,
    at 2-16 splits the other merge ("cl0": workspace and counter, "cl1": a cluster), at
    batch 1 past 16 splits 16 splits merged in a cluster ("s16cl"), and at batch 1 the plan's
    splits merged by slices ("sl1": each split its share of the columns after a count), and at
    batch 16+ to 8k the plan on a copy of the cache whose pages lie in table order ("ord": what
    the random page order costs against SDPA's contiguous caches); in every row the plan with
    the warps' merge a warp at a time ("ws0": four more barriers; not persistent, one kv head a
    CTA), where it splits the plan's splits merged by a kernel of their own launched with PDL
    ("mk1": no counter, no last CTA reading every split), at batch 1 the plan launched with PDL
    ("pdl1": set up while the kernel before finishes; back to back, each call lets the next
    start early), and with the K/V maps at L2 promotion
    256B ("pr256": a kv head's 256-byte key row from DRAM at once); at batch 16+ where the plan
    splits or walks, cuDNN's grid: one CTA an item, one split, no walk ("s1"), with one CTA an
    SM of six stages ("s1c1"), one 4-D box a page piece ("s1wb") or both ("s1c1wb"); at batch 1
    past 16 splits, 16 splits in one CTA an SM of six stages ("s16c1": fewer, longer splits,
    half the merge); where the plan merges its splits by slices (a cooperative launch), the
    counter's merge ("sl0") and the slice merge launched plainly ("co0"); where it differs, session
    18's plan ("s18": evict-first past one L2, no slice merge, clusters only where every CTA fits);
    at batch 1 from 8k, four kv heads a CTA of six stages, one CTA an SM, merged by slices
    ("hgc1sl"), past batch 1 where its splits all fit, the same at its own CTAs an SM ("hgsl");
    at batch 16+ the plan's splits with one 4-D box a page piece ("wb": half the
    copies; at batch 1 where the plan slices, the plan with it) and with one CTA an SM of six
    stages ("c1"), and (not persistent) three CTAs an SM of two
    stages at the splits that fill those slots ("c3": the plan's would leave a third empty); in every
    row four kv heads a CTA at their own automatic plan ("hg": one 4-D copy of 16 keys x 4 heads
    a stage), at batch 16+ the same at one CTA an SM of six stages ("hgc1"; where that is the
    plan, one kv head a CTA at its own plan instead: "hg0"), and where the
    head-group plan walks items, one group a CTA without walking ("hgp0"), and where the groups
    are at least half the SMs and that plan splits them, one group a CTA of six stages, one split
    ("hgs1c1": cuDNN's one CTA an SM, a group's 1 KB runs).
    ``--decode-alts``: only the named ones. ``device``: the current one by default (a test
    plans for a described H200 without a GPU)."""
    from tmaflow.kernels.decode_entry import MAX_CLUSTER
    from tmaflow.kernels.decode_plan import (HEAD_GROUP, decode_choices, decode_defaults, decode_plan,
                                             persistent_default)
    from tmaflow.runtime.device import current_device

    if not (args.quick or args.decode_grid in ("quick", "focus") or getattr(args, "decode_rows", None)):
        return {}
    device = device or current_device()
    plan = _decode_plan(batch, ctx, heads_kv, page, device)
    splits, evict_first, persistent, cluster, four_heads, slices = (plan.splits, plan.evict_first, plan.persistent,
                                                                    plan.cluster_merge, plan.head_group,
                                                                    plan.slice_merge)
    one_cta_groups = four_heads and plan.ctas == 1  # (group_one_cta_default's plan)
    alts = {f"ef{int(not evict_first)}": {"evict_first": not evict_first}}  # the rest of the plan as it is
    if slices:  # the counter's merge (the plan before session 19), the slice merge without a cooperative launch
        alts["sl0"] = {"slice_merge": False}
        alts["co0"] = {"cooperative": False}
    # session 18's plan: evict-first past one L2, clusters only where every CTA fits
    old_cluster = 2 <= splits <= 8 and batch * heads_kv * splits <= device.sm_count
    old = {"evict_first": 2 * batch * heads_kv * 128 * ctx * 2 > device.l2_bytes, "slice_merge": False,
           "cluster_merge": None if persistent or four_heads else old_cluster}
    if old["cluster_merge"]:  # a cluster's size is the splits: named
        old["num_splits"] = splits
    if old["evict_first"] != evict_first and (slices or old_cluster != cluster):  # (else "sl0", "cl0" or "ef" is it)
        alts["s18"] = old
    if not (persistent or four_heads):  # the plan with the warps' merge a warp at a time (before session 18)
        alts["ws0"] = {"warp_slices": False}
    if splits > 1 and not (persistent or four_heads):  # the plan's splits merged by a second kernel (PDL)
        alts["mk1"] = {"num_splits": splits, "merge_kernel": True}
    if batch == 1:  # short calls: the plan launched with PDL (its start hidden behind the kernel before)
        alts["pdl1"] = {"pdl": True}
    if batch == 1 and 2 * splits <= min(MAX_CLUSTER, ctx // 64):  # (past 16: x1.26-1.37 slower, session 16)
        alts[f"s{2 * splits}cl"] = {"num_splits": 2 * splits, "evict_first": evict_first, "persistent": False,
                                     "cluster_merge": True}
    if persistent:
        alts["p0"] = {"num_splits": splits, "evict_first": evict_first, "persistent": False, "cluster_merge": False}
    if 2 <= splits <= MAX_CLUSTER:
        alts[f"cl{int(not cluster)}"] = {"num_splits": splits, "evict_first": evict_first, "persistent": False,
                                         "cluster_merge": not cluster}
    if batch == 1 and splits > MAX_CLUSTER:
        alts[f"s{MAX_CLUSTER}cl"] = {"num_splits": MAX_CLUSTER, "evict_first": evict_first, "persistent": False,
                                      "cluster_merge": True}
    if batch == 1 and splits > 1 and not persistent and not slices:  # every CTA at once (8 kv heads x <= 32 splits)
        alts["sl1"] = {"num_splits": splits, "evict_first": evict_first, "persistent": False, "cluster_merge": False,
                       "slice_merge": True}
    if batch >= 16 and ctx <= 8192:  # the plan on a cache whose pages lie in table order (DRAM locality)
        alts["ord"] = {"ordered": True}
    alts["pr256"] = {"l2_promotion": "256B"}  # the plan, maps at L2 promotion 256B
    if batch >= 16:  # the bytes in flight an SM and the copies a stage (session 16, round 4)
        same = {"num_splits": splits, "persistent": persistent, "cluster_merge": cluster}
        alts["wb"] = {**same, "wide_box": True}
        alts["c1"] = {**same, "ctas_per_sm": 1}
        if not persistent:  # (its own splits: a cluster merge of the plan's is named only with them)
            alts["c3"] = {"persistent": False, "cluster_merge": None if cluster else False, "ctas_per_sm": 3}
    elif batch == 1 and slices:  # one 4-D box a page piece: half the copies (the first tile sooner?)
        alts["wb"] = {"wide_box": True}
    if batch >= 16 and (splits > 1 or persistent):  # cuDNN's grid: one CTA an item, no split, no walk
        one = {"num_splits": 1, "persistent": False, "head_group": False}
        if splits > 1:  # (a walking plan's one CTA an item is "p0")
            alts["s1"] = one
        alts["s1c1"] = {**one, "ctas_per_sm": 1}
        alts["s1wb"] = {**one, "wide_box": True}
        alts["s1c1wb"] = {**one, "ctas_per_sm": 1, "wide_box": True}
    if batch == 1 and splits > 16:  # fewer, larger splits: 16 in one CTA an SM of six stages, half the merge
        alts["s16c1"] = {"num_splits": 16, "cluster_merge": False, "ctas_per_sm": 1}
    if batch == 1 and heads_kv % HEAD_GROUP == 0 and ctx >= 8192:  # 1 KB runs, the groups' splits merged by slices
        alts["hgc1sl"] = {"head_group": True, "ctas_per_sm": 1, "slice_merge": True}
    if heads_kv % HEAD_GROUP == 0:
        alts["hg"] = {"head_group": True}
        grouped = decode_defaults(batch, heads_kv, 128, page, ctx, device, head_group=True, slice_merge=True)
        if batch > 1 and grouped.slice_merge and \
                batch * grouped.items * grouped.splits <= device.sm_count * grouped.ctas_per_sm:
            alts["hgsl"] = {"head_group": True, "slice_merge": True}  # its automatic splits merged by slices
        if batch * heads_kv // HEAD_GROUP >= device.sm_count // 2 and \
                decode_defaults(batch, heads_kv, 128, page, ctx, device, ctas=1, head_group=True).splits > 1:
            alts["hgs1c1"] = {"head_group": True, "num_splits": 1, "persistent": False, "ctas_per_sm": 1}
        if batch >= 16 and not one_cta_groups:  # one CTA an SM of six stages: at batch 16 8k 128 CTAs of 4 splits
            alts["hgc1"] = {"head_group": True, "ctas_per_sm": 1}
        if persistent_default(batch, heads_kv // HEAD_GROUP, 128, 1, device.sm_count,
                              decode_plan(128, page, head_group=True)[2]) and \
                decode_choices(batch, heads_kv, 128, page, ctx, device=device, head_group=True)[0] == 1:
            alts["hgp0"] = {"head_group": True, "persistent": False, "num_splits": 1}
    if one_cta_groups:  # one kv head a CTA at its own plan (batch 64's before session 27)
        alts["hg0"] = {"head_group": False}
    return {name: choice for name, choice in alts.items() if not args.decode_alts or name in args.decode_alts}


def decode(args):
    import torch  # optional dependency, as in main

    rows = []
    for group, page, batch, ctx in _decode_grid(args):
        rows.append(_decode_row(torch, args, group, page, batch, ctx))
        torch.cuda.empty_cache()  # the row's caches are gone: room for the next, larger one
        if args.json:  # after every row: a run stopped by a time limit keeps what it measured
            columns = DECODE_COLUMNS + (["clean ratio", "clean vs memcpy"] if args.clean else [])
            bench.records.write(args.json, "attention_decode",
                                "Paged-KV decode against torch SDPA and the copy ceiling", columns, rows,
                                repeats=args.repeats, grid="quick" if args.quick else args.decode_grid)


def decode_sweep(args):
    """Per row, the automatic plan against every split count worth trying (powers of two up to
    a tile a split and four waves of CTAs) and against its own evict-first choice flipped,
    with the copy ceiling, in the same rounds: the best split per row, cold (after the usual
    write of 2x L2, and after a read of it: a clean L2) and back to back. Page 16 rows of the
    grid only."""
    import torch  # optional dependency, as in main

    rows = []
    for group, page, batch, ctx in _decode_grid(args):
        if page != 16:
            continue
        rows.append(_decode_row(torch, args, group, page, batch, ctx, sweep=True))
        torch.cuda.empty_cache()
        if args.json:
            bench.records.write(args.json, "attention_decode_sweep", "Paged-KV decode: split counts and L2 priority",
                                DECODE_SWEEP_COLUMNS, rows, repeats=args.repeats)


def _clean_cold(torch, fns: dict, repeats: int) -> bench.Rounds:
    """Rounds of ``fns`` (as bench.rounds), each call after a read of bench.flush_bytes() (a
    sum): the previous work's lines leave L2, written back if dirty, before the timing starts,
    and what L2 holds then is clean, as after a layer that read its weights. bench.rounds'
    cold flush is a write: a call after it also writes back up to the whole L2 of dirty lines."""
    buf, total = torch.zeros(bench.flush_bytes() // 4, device="cuda"), torch.zeros((), device="cuda")
    got: dict = {name: [] for name in fns}
    with bench.EventPair() as events:  # the legacy default stream, torch's default too
        for fn in list(fns.values()) * 2:
            fn()
        torch.cuda.synchronize()
        for _ in range(repeats):
            for name, fn in fns.items():
                torch.sum(buf, dim=0, out=total)
                events.start()
                fn()
                got[name].append(events.stop())
    return bench.Rounds(got)


def _decode_modes(torch, fns: dict, repeats: int, clean: bool):
    """(mode, rounds): "cold" and "warm" as the other benches (back to back from each
    function's own L2 state), and with ``clean`` "clean" (cold after a read: no dirty line)."""
    for mode, got in _cold_and_warm(fns, repeats, settle=1):
        yield mode, got
        if mode == "cold" and clean:
            yield "clean", _clean_cold(torch, fns, repeats)


def _sweep_variants(batch: int, ctx: int, heads_kv: int, page: int) -> dict:
    """name -> options for the sweep: "auto" (what a call plans), "sN" (N
    splits, the automatic L2 priority) and "auto ef0/ef1" (the automatic splits, the other
    priority)."""
    from tmaflow.kernels.decode_plan import MAX_SPLITS, decode_choices, decode_plan
    from tmaflow.runtime.device import current_device

    device = current_device()
    splits, evict_first = decode_choices(batch, heads_kv, 128, page, ctx)
    slots = device.sm_count * decode_plan(128, page)[2]
    variants = {"auto": {}, f"auto ef{int(not evict_first)}": {"evict_first": not evict_first}}
    for n in (1, 2, 4, 8, 16, 32, 64):
        if n <= min(MAX_SPLITS, ctx // 64) and batch * heads_kv * n <= 4 * slots and n != splits:
            variants[f"s{n}"] = {"num_splits": n}
    return variants


def _head_group_plan(batch: int, ctx: int, heads_kv: int, page: int) -> str:
    """The "hg" alternative's automatic splits and walk, as the row prints the plan's."""
    from tmaflow.kernels.decode_plan import HEAD_GROUP, decode_choices, decode_plan, persistent_default
    from tmaflow.runtime.device import current_device

    splits = decode_choices(batch, heads_kv, 128, page, ctx, head_group=True)[0]
    walks = persistent_default(batch, heads_kv // HEAD_GROUP, 128, splits, current_device().sm_count,
                               decode_plan(128, page, head_group=True)[2])
    return f"s{splits} p{int(walks)}"


def _decode_row(torch, args, group: int, page: int, batch: int, ctx: int, sweep: bool = False) -> dict:
    from torch.nn.attention import SDPBackend, sdpa_kernel

    dt, d, heads_kv = getattr(torch, args.dtype), 128, 8
    k, v = (torch.randn(batch, heads_kv, ctx, d, device="cuda", dtype=dt) for _ in "kv")
    q = torch.randn(batch, heads_kv * group, 1, d, device="cuda", dtype=dt)
    pages = batch * ctx // page
    order = torch.randperm(pages, device="cuda", dtype=torch.int32)
    table = order.view(batch, ctx // page).contiguous()

    def paged(x):  # (batch, heads_kv, ctx, d) -> pages in the table's random order
        cache = torch.empty(pages, page, heads_kv, d, device="cuda", dtype=dt)
        cache[order.long()] = x.transpose(1, 2).reshape(pages, page, heads_kv, d)
        return cache
    k_cache, v_cache = paged(k), paged(v)

    def in_order():  # the same caches with page i of the table at row i
        return tuple(x.transpose(1, 2).reshape(pages, page, heads_kv, d).contiguous() for x in (k, v))
    lens = torch.full((batch,), ctx, device="cuda", dtype=torch.int32)
    k_copy, v_copy = torch.empty_like(k), torch.empty_like(v)

    def sdpa(backend):
        def run():
            with sdpa_kernel(backend):
                return torch.nn.functional.scaled_dot_product_attention(q, k, v, enable_gqa=True)
        return run

    def memcpy():
        k_copy.copy_(k), v_copy.copy_(v)

    kept: list = []

    def ours(choice: dict | None = None):
        ordered, options = decode_call(choice or {})
        caches = (*in_order(), torch.arange(pages, device="cuda", dtype=torch.int32).view(batch, -1)) if ordered \
            else (k_cache, v_cache, table)
        kept.append(caches)  # alive while the prepared call is
        return kernels.attention_decode.prepare(q[:, :, 0], *caches, lens, **options,
                                                out=torch.empty(batch, heads_kv * group, d, device="cuda", dtype=dt))
    plan = _decode_plan(batch, heads_kv=heads_kv, ctx=ctx, page=page)
    splits, evict_first, persistent, cluster, four_heads, slices = (plan.splits, plan.evict_first, plan.persistent,
                                                                    plan.cluster_merge, plan.head_group,
                                                                    plan.slice_merge)
    alts = {} if sweep else _decode_alternatives(args, batch, ctx, heads_kv, page)
    if sweep:
        fns = {name: ours(choice) for name, choice in _sweep_variants(batch, ctx, heads_kv, page).items()}
        peers = {"memcpy": memcpy}
    else:
        fns = {"tmaflow": ours(), **{f"alt {name}": ours(choice) for name, choice in alts.items()}}
        peers = {"cudnn": sdpa(SDPBackend.CUDNN_ATTENTION), "flash": sdpa(SDPBackend.FLASH_ATTENTION),
                 "efficient": sdpa(SDPBackend.EFFICIENT_ATTENTION), "memcpy": memcpy}
    available = dict(fns)
    for name, fn in peers.items():
        try:
            fn()
            available[name] = fn
        except (RuntimeError, TypeError) as exc:  # a backend that does not take this shape
            print(f"  {name} unavailable: {str(exc).splitlines()[0][:100]}")
    for fn in fns.values():
        fn()
    torch.cuda.synchronize()
    with sdpa_kernel([SDPBackend.CUDNN_ATTENTION, SDPBackend.FLASH_ATTENTION, SDPBackend.EFFICIENT_ATTENTION]):
        ref = torch.nn.functional.scaled_dot_product_attention(q, k, v, enable_gqa=True)[:, :, 0].float()
    err = max((torch.linalg.norm(fn.out.float() - ref) / torch.linalg.norm(ref)).item() for fn in fns.values())
    kv_bytes = 2 * k.numel() * k.element_size()
    row = {"dtype": args.dtype, "d": d, "group": f"{group}:1", "page": page, "batch": batch, "context": ctx,
           "splits": splits, "ctas": splits * plan.items * batch, "ctas_per_sm": plan.ctas_per_sm, "evict_first": evict_first, "persistent": persistent,
           "cluster_merge": cluster, "head_group": four_heads, "slice_merge": slices,
           "rel_err_vs_peer": err}
    main = "auto" if sweep else "tmaflow"
    cells = []
    for mode, got in _decode_modes(torch, available, args.repeats, clean=sweep or args.clean):
        gbs = {n: kv_bytes * (2 if n == "memcpy" else 1) / got[n].median / 1e9 for n in available}
        row.update({f"{mode} GB/s": gbs[main], f"{mode} all GB/s": gbs, f"{mode} vs memcpy": gbs[main] / gbs["memcpy"]})
        if sweep:
            best = max(fns, key=lambda n: gbs[n])
            row.update({f"{mode} best": best, f"{mode} best vs auto": got.ratio(best, "auto").median,
                        f"{mode} best vs memcpy": gbs[best] / gbs["memcpy"]})
            cells.append(f"{mode} auto {gbs['auto']:5.0f} best {best} {gbs[best]:5.0f} GB/s "
                         f"(x{row[f'{mode} best vs auto']:.3f}, vs memcpy {row[f'{mode} best vs memcpy']:.2f}) "
                         + " ".join(f"{n}:{gbs[n]:.0f}" for n in fns if n not in ("auto", best)))
        else:
            best = max((n for n in available if n not in fns and n != "memcpy"), key=lambda n: gbs[n])
            row.update({"best_peer": best, f"{mode} ratio": got.ratio("tmaflow", best).median})
            alt_cells = ""
            for name in fns:
                if name != "tmaflow":  # the alternative's time over the plan's: above 1, the plan is faster
                    row[f"{mode} {name} over plan"] = got.ratio("tmaflow", name).median
                    alt_cells += f" {name} x{row[f'{mode} {name} over plan']:.3f}"
            cells.append(f"{mode} ours {gbs['tmaflow']:6.0f} {best} {gbs[best]:6.0f} memcpy {gbs['memcpy']:6.0f} GB/s "
                         f"ratio {row[f'{mode} ratio']:.2f} vs memcpy {row[f'{mode} vs memcpy']:.2f}{alt_cells}")
    print(f"{group}:1 page {page:3d} b{batch:<4d} ctx {ctx:6d} s{splits:<2d} ef{int(evict_first)} p{int(persistent)} "
          f"cl{int(cluster)} hg{int(four_heads)} sl{int(slices)} c{plan.ctas_per_sm} "
          + " | ".join(cells)
          + f"  err {err:.1e}" + (f"  (hg plan: {_head_group_plan(batch, ctx, heads_kv, page)})" if "hg" in alts else ""),
          flush=True)
    return row


if __name__ == "__main__":
    main()
