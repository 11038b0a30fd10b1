"""kernels.attention against torch's scaled_dot_product_attention with the cuDNN and the flash
backends, in one run: TFLOP/s and the ratio to the better backend, causal and not.

    PYTHONPATH=. python3 tools/peers/bench_attention.py [--json FILE] [--repeats N] [--quick] [--dims D ...]
        [--seqs S ...] [--dtype bfloat16|float16]
    PYTHONPATH=. python3 tools/peers/bench_attention.py --decode | --decode-sweep [--json FILE] [--repeats N]
        [--quick] [--clean]
    PYTHONPATH=. python3 tools/peers/bench_attention.py --backward [--json FILE] [--repeats N] [--quick]
        [--dims D ...] [--seqs S ...] [--dtype bfloat16|float16] [--deterministic]

Shapes keep 16k tokens a batch (batch = 16384 / seq) at head dim 64 (32 heads), 128 (16
heads) and 256 (8 heads). The three run in interleaved rounds, timed twice: cold (each call
after a write that evicts L2) and back to back; the ratio is the median of per-round ratios. FLOPs: 4 * batch * heads * seq^2 * head_dim, half of it
causal. Each row also checks our output against the cuDNN one. At head dims 64 and 128 the
pre-Hopper kernel kept from seed 002 (kernels.attention_cp_async) runs in the same rounds.

``--decode``: kernels.attention_decode over a paged cache (random block tables, every request
at the full context) against torch SDPA (the fastest backend that takes q_len 1 with GQA) over
the same keys and values in a contiguous (batch, heads_kv, context, head_dim) cache, and
against a device-to-device copy of the K+V bytes (two copies: K, then V), in the same rounds:
GB/s of K+V read (the copy: read + written) and the ratios; back to back, each function's
samples follow an untimed call of its own. Head dim 128, 8 kv heads, GQA 4:1 and 8:1, pages 16
and 64, batch 1, 4, 16, 64, 128 x context 1k, 8k, 32k, 128k up to 4M tokens a row (68 rows);
each row prints the plan (splits, evict-first); ``--quick``: batch 1 and 16, context 8k and
32k, GQA 4:1 (under a minute); ``--clean``: also cold after a read of 2x L2 instead of a write
(the write leaves the whole L2 dirty, and a call after it writes that back as it reads).
``--decode-sweep``: the same shapes at page 16, the automatic plan against other split counts
and the other L2 priority, with the copy, in the same rounds (cold, clean and back to back):
the best per row.

``--backward``: kernels.attention_backward (dq, dk, dv from the forward's out and log-sum-exp)
against the backward of torch SDPA's cuDNN and flash backends (autograd.grad through an SDPA
output recorded under that backend), the same shapes and rounds as the forward; FLOPs 2.5x the
forward's. Each row checks our dq against the cuDNN one; ``--deterministic`` times that mode;
``--quick``: head dims 64 and 128, seq 1k and 4k (under a minute).
"""
from __future__ import annotations

import argparse

from tmaflow import bench, kernels

CP_ASYNC_HEAD_DIMS = (64, 128)  # the head dims kernels.attention_cp_async takes
COLUMNS = ["dtype", "d", "seq", "batch", "causal", "best_peer", "cold ratio", "warm ratio", "rel_err_vs_peer"]
DECODE_COLUMNS = ["group", "page", "batch", "context", "splits", "evict_first", "best_peer", "cold GB/s", "cold ratio",
                  "cold vs memcpy", "warm ratio", "warm vs memcpy", "rel_err_vs_peer"]
DECODE_SWEEP_COLUMNS = ["group", "page", "batch", "context", "splits", "evict_first", "cold GB/s", "cold vs memcpy",
                        "cold best", "cold best vs auto", "clean best", "clean best vs auto", "warm best",
                        "warm best vs auto"]
DECODE_TOKENS = 1 << 22  # batch x context at most: 16 GiB of K+V a layout at 8 kv heads, head dim 128


def _cold_and_warm(fns: dict, repeats: int, settle: int = 0):
    """(mode, rounds) of ``fns`` timed both ways, in turn: every call after an L2 flush
    ("cold"), and back to back ("warm"; ``settle`` untimed calls of a function before each of
    its samples, so the first timed call follows its own, not another's dirty L2)."""
    yield "cold", bench.rounds(fns, repeats=repeats, warmup=2, flush_l2=True)
    yield "warm", bench.rounds(fns, repeats=repeats, warmup=2, batch=5, settle=settle)


def _tflops_cells(fns: dict, flop: float, repeats: int, row: dict) -> list[str]:
    """Both timings of ``fns`` in TFLOP/s, tmaflow's against the fastest peer (neither tmaflow
    nor cp.async), recorded in ``row``; one printed cell a timing."""
    cells = []
    for mode, got in _cold_and_warm(fns, repeats):
        tflops = {name: flop / got[name].median / 1e12 for name in fns}
        best = max((n for n in fns if n not in ("tmaflow", "cp.async")), key=lambda n: tflops[n])
        ratio = got.ratio("tmaflow", best).median
        row.update({f"{mode} tflops": tflops, "best_peer": best, f"{mode} ratio": ratio})
        cells.append(f"{mode} " + " ".join(f"{n} {tflops[n]:6.1f}" for n in fns) + f" ratio to {best} {ratio:.3f}")
    return cells


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--json")
    p.add_argument("--repeats", type=int, default=10)
    p.add_argument("--quick", action="store_true", help="seq 1k and 4k only (--decode: 4 shapes a page size)")
    p.add_argument("--dims", type=int, nargs="+", default=[64, 128, 256], help="head dims to run")
    p.add_argument("--seqs", type=int, nargs="+", help="sequence lengths (default 512 to 16k)")
    p.add_argument("--dtype", default="bfloat16", choices=["bfloat16", "float16"])
    p.add_argument("--decode", action="store_true", help="paged-KV decode against SDPA and the copy ceiling")
    p.add_argument("--decode-sweep", action="store_true",
                   help="paged-KV decode: split counts and L2 priority against the automatic plan")
    p.add_argument("--clean", action="store_true", help="--decode: also time cold after a read of 2x L2 (no dirty line)")
    p.add_argument("--backward", action="store_true", help="dq, dk, dv against the SDPA backends' backward")
    p.add_argument("--deterministic", action="store_true", help="--backward: time deterministic=True")
    args = p.parse_args()
    if args.decode_sweep:
        return decode_sweep(args)
    if args.decode:
        return decode(args)
    if args.backward:
        return backward(args)
    import torch  # optional dependency, before the driver is touched: --help works without it
    from torch.nn.attention import SDPBackend, sdpa_kernel

    seqs = args.seqs or ((1024, 4096) if args.quick else (512, 1024, 2048, 4096, 8192, 16384))
    rows = []
    for d, heads in ((d, h) for d, h in ((64, 32), (128, 16), (256, 8)) if d in args.dims):
        for seq in seqs:
            batch = max(1, 16384 // seq)
            q, k, v = (torch.randn(batch, heads, seq, d, device="cuda", dtype=getattr(torch, args.dtype))
                       for _ in range(3))
            out = torch.empty_like(q)
            for causal in (False, True):
                def sdpa(backend):
                    def run():
                        with sdpa_kernel(backend):
                            return torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=causal)
                    return run
                fns = {"tmaflow": kernels.attention.prepare(q, k, v, out, causal=causal),
                       "cudnn": sdpa(SDPBackend.CUDNN_ATTENTION), "flash": sdpa(SDPBackend.FLASH_ATTENTION)}
                if d in CP_ASYNC_HEAD_DIMS and args.dtype == "bfloat16":  # seed 002's schedule, for scale
                    fns["cp.async"] = kernels.attention_cp_async.prepare(q, k, v, torch.empty_like(q), causal=causal)
                available = {}
                for name, fn in fns.items():
                    try:
                        fn()
                        available[name] = fn
                    except RuntimeError as exc:  # a backend that does not take this shape
                        print(f"  {name} unavailable: {str(exc).splitlines()[0][:100]}")
                torch.cuda.synchronize()
                peer = available.get("cudnn") or available.get("flash")
                ref = peer().float()
                err = (torch.linalg.norm(out.float() - ref) / torch.linalg.norm(ref)).item()
                flop = 4.0 * batch * heads * seq * seq * d / (2 if causal else 1)
                row = {"dtype": args.dtype, "d": d, "seq": seq, "batch": batch, "heads": heads, "causal": causal,
                       "rel_err_vs_peer": err}
                cells = _tflops_cells(available, flop, args.repeats, row)
                rows.append(row)
                print(f"{'fp16' if args.dtype == 'float16' else 'bf16'} d{d:<4d} seq {seq:6d} b{batch:<3d} "
                      f"{'causal' if causal else 'full  '} " + " | ".join(cells) + f"  TFLOP/s  err {err:.1e}", flush=True)
    if args.json:
        bench.records.write(args.json, "attention", "Attention against torch SDPA (cuDNN, flash)", COLUMNS, rows,
                            repeats=args.repeats)


def backward(args):
    import torch  # optional dependency, as in main

    seqs = args.seqs or ((1024, 4096) if args.quick else (512, 1024, 2048, 4096, 8192, 16384))
    dims = [d for d in args.dims if d in (64, 128)] if args.quick else args.dims
    rows = []
    for d, heads in ((d, h) for d, h in ((64, 32), (128, 16), (256, 8)) if d in dims):
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


def _decode_shapes(args) -> list[tuple[int, int]]:
    """(batch, context) of the acceptance grid that fit: 4M tokens a row at most (17 GB of K+V
    a layout at 8 kv heads, head dim 128; the paged cache, SDPA's contiguous one and the copy's
    destination make 52 GB), so batch 128 stops at 32k and batch 64 at 32k."""
    if args.quick:
        return [(b, c) for b in (1, 16) for c in (8192, 32768)]
    return [(b, c) for b in DECODE_BATCHES for c in DECODE_CONTEXTS if b * c <= DECODE_TOKENS]


def decode(args):
    import torch  # optional dependency, as in main

    rows = []
    combos = [(4, 16)] if args.quick else [(4, 16), (4, 64), (8, 16), (8, 64)]  # the first the most telling
    for group, page in combos:
        for batch, ctx in _decode_shapes(args):
            rows.append(_decode_row(torch, args, group, page, batch, ctx))
            torch.cuda.empty_cache()  # the row's caches are gone: room for the next, larger one
            if args.json:  # after every row: a run stopped by a time limit keeps what it measured
                columns = DECODE_COLUMNS + (["clean ratio", "clean vs memcpy"] if args.clean else [])
                bench.records.write(args.json, "attention_decode",
                                    "Paged-KV decode against torch SDPA and the copy ceiling", columns, rows,
                                    repeats=args.repeats)


def decode_sweep(args):
    """Per row, the automatic plan against every split count worth trying (powers of two up to
    a tile a split and four waves of CTAs) and against its own evict-first choice flipped,
    with the copy ceiling, in the same rounds: the best split per row, cold (after the usual
    write of 2x L2, and after a read of it: a clean L2) and back to back."""
    import torch  # optional dependency, as in main

    rows = []
    for group in ((4,) if args.quick else (4, 8)):
        for batch, ctx in _decode_shapes(args):
            rows.append(_decode_row(torch, args, group, 16, batch, ctx, sweep=True))
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
    """name -> (num_splits, evict_first) for the sweep: "auto" (what a call plans), "sN" (N
    splits, the automatic L2 priority) and "auto ef0/ef1" (the automatic splits, the other
    priority)."""
    from tmaflow.kernels.decode_entry import MAX_SPLITS, decode_choices, decode_plan
    from tmaflow.runtime.device import current_device

    device = current_device()
    splits, evict_first = decode_choices(batch, heads_kv, 128, page, ctx)
    slots = device.sm_count * decode_plan(128, page)[2]
    variants = {"auto": (None, None), f"auto ef{int(not evict_first)}": (None, not evict_first)}
    for n in (1, 2, 4, 8, 16, 32, 64):
        if n <= min(MAX_SPLITS, ctx // 64) and batch * heads_kv * n <= 4 * slots and n != splits:
            variants[f"s{n}"] = (n, None)
    return variants


def _decode_row(torch, args, group: int, page: int, batch: int, ctx: int, sweep: bool = False) -> dict:
    from torch.nn.attention import SDPBackend, sdpa_kernel

    from tmaflow.kernels.decode_entry import decode_choices

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
    lens = torch.full((batch,), ctx, device="cuda", dtype=torch.int32)
    k_copy, v_copy = torch.empty_like(k), torch.empty_like(v)

    def sdpa(backend):
        def run():
            with sdpa_kernel(backend):
                return torch.nn.functional.scaled_dot_product_attention(q, k, v, enable_gqa=True)
        return run

    def memcpy():
        k_copy.copy_(k), v_copy.copy_(v)

    def ours(num_splits=None, evict_first=None):
        return kernels.attention_decode.prepare(q[:, :, 0], k_cache, v_cache, table, lens, num_splits=num_splits,
                                                evict_first=evict_first,
                                                out=torch.empty(batch, heads_kv * group, d, device="cuda", dtype=dt))
    splits, evict_first = decode_choices(batch, heads_kv, d, page, ctx)
    if sweep:
        fns = {name: ours(*choice) for name, choice in _sweep_variants(batch, ctx, heads_kv, page).items()}
        peers = {"memcpy": memcpy}
    else:
        fns = {"tmaflow": ours()}
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
           "splits": splits, "ctas": splits * heads_kv * batch, "evict_first": evict_first, "rel_err_vs_peer": err}
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
            best = max((n for n in available if n not in ("tmaflow", "memcpy")), key=lambda n: gbs[n])
            row.update({"best_peer": best, f"{mode} ratio": got.ratio("tmaflow", best).median})
            cells.append(f"{mode} ours {gbs['tmaflow']:6.0f} {best} {gbs[best]:6.0f} memcpy {gbs['memcpy']:6.0f} GB/s "
                         f"ratio {row[f'{mode} ratio']:.2f} vs memcpy {row[f'{mode} vs memcpy']:.2f}")
    print(f"{group}:1 page {page:3d} b{batch:<4d} ctx {ctx:6d} s{splits:<2d} ef{int(evict_first)} " + " | ".join(cells)
          + f"  err {err:.1e}", flush=True)
    return row


if __name__ == "__main__":
    main()
