"""The forward attention's schedules in one run, beside cuDNN: the default ("new") and, where
they differ, round 2's candidates against round 1's default:
- "r1": round 1's default: O stored a 4-byte word a lane and, for plans of one Q buffer (head
  dims 128 and 256), the Q buffer whole (released once both warpgroups' last S is done) and no
  L2 prefetch. "new" has STORE16 (O stored 16 B a lane after two quad shuffles) and, with one Q
  buffer, Q_SPLIT (each warpgroup's 64 rows released after its own last S) and L2_PREFETCH (the
  next work tile's Q, first K and first V fetched into L2 under this one);
- "pf" and "st4": "new" with L2_PREFETCH (off by default: 1-3% slower, H200), and without STORE16;
- "k128": head dim 128 non-causal with 128-key tiles (8 steps at 1k, 3 K and V stages) instead
  of 176 (6 steps, the last one ragged, 2 stages);
- "k80": head dim 256 non-causal with 80-key tiles (FlashAttention-3's; 13 steps at 1k, 2 K
  stages, the Q buffer whole: split, it spills) instead of 64 (16 steps, 3 K stages).
With --keys K..., also the default with K keys a tile (BLOCK_N, "kK") and, causal, with
one CTA a row block ("unpaired", the block scheduler balancing instead of PAIRED's stride).
With --round1, round 1's rows instead: the schedule before it (one CTA a causal tile, one Q
buffer), at head dim 64 the pairs with one Q buffer, and a forced second Q buffer ("2q").
The benchmark's shapes (16k tokens a batch: head dim 64 x 32 heads, 128 x 16, 256 x 8);
interleaved rounds, cold (L2 flushed before each call) and back to back; TFLOP/s and, in
parentheses, the median per-round ratio to cuDNN (above 1: faster).

    PYTHONPATH=. python3 tools/experiments/attention_schedule_ab.py [--dims 64 128] [--seqs 1024 2048 4096]
        [--extra 256:1024] [--repeats N] [--round1] [--keys 64 96 128]
"""
from __future__ import annotations

import argparse

from tmaflow import TmaflowError, bench, kernels
from tmaflow.kernels.registry import extra_defines


def _variants(d: int, causal: bool, round1: bool = False, keys: tuple = ()) -> list:
    """(label, extra defines) of the variants that differ at this head dim, "new" (what a call
    plans) first: a second Q buffer fits only up to about head dim 64 (the others prefetch
    into L2), PAIRED changes only causal plans."""
    from tmaflow.kernels.attention_entry import attention_plan

    plan = attention_plan(d, causal)
    two_q = plan.defines["Q_STAGES"] == 2
    keep = [("new", {})]
    if keys:
        for n in keys:
            try:
                attention_plan(d, causal, keys=n)
            except TmaflowError:
                continue  # its stages do not fit
            if n != plan.defines["BLOCK_N"]:
                keep.append((f"k{n}", {"BLOCK_N": n}))
        return keep + ([("unpaired", {"PAIRED": 0})] if causal else [])
    if not round1:
        if two_q:  # two Q buffers: round 1's differs by STORE16 alone
            return keep + [("r1", {"STORE16": 0})]
        keep += [("r1", {"Q_SPLIT": 0, "STORE16": 0}), ("pf", {"L2_PREFETCH": 1}), ("st4", {"STORE16": 0})]
        if (d, causal) == (128, False):
            keep.append(("k128", {"BLOCK_N": 128}))
        if (d, causal) == (256, False):  # with 80 keys a split Q or STORE16 spill (12 and 40 B)
            keep.append(("k80", {"BLOCK_N": 80, "Q_SPLIT": 0, "STORE16": 0}))
        return keep
    if causal or two_q:
        keep.append(("old", {"PAIRED": 0, "Q_STAGES": 1, "L2_PREFETCH": 0, "Q_SPLIT": 0, "STORE16": 0}))
    if causal and two_q:
        keep.append(("pairs 1q", {"Q_STAGES": 1, "L2_PREFETCH": 0, "STORE16": 0}))
    forced = attention_plan(d, causal, q_stages=2)
    if not two_q and min(p.stages for p in forced.layout.items[1:3]) >= 2:  # a candidate: 2 Q, fewer K / V
        keep.append(("2q", {"Q_STAGES": 2, "Q_SPLIT": 0, "STORE16": 0}))
    return keep


def row(torch, d: int, seq: int, causal: bool, repeats: int, round1: bool = False, keys: tuple = ()):
    from torch.nn.attention import SDPBackend, sdpa_kernel

    heads = {64: 32, 128: 16, 256: 8}[d]
    batch = max(1, 16384 // seq)
    q, k, v = (torch.randn(batch, heads, seq, d, device="cuda", dtype=torch.bfloat16) for _ in range(3))
    fns, outs = {}, {}
    for label, defines in _variants(d, causal, round1, keys):
        outs[label] = torch.empty_like(q)
        with extra_defines(defines):
            fns[label] = kernels.attention.prepare(q, k, v, outs[label], causal=causal)

    def cudnn():
        with sdpa_kernel(SDPBackend.CUDNN_ATTENTION):
            return torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=causal)
    fns["cudnn"] = cudnn
    for fn in fns.values():
        fn()
    ref = cudnn().float()
    errs = {label: (torch.linalg.norm(out.float() - ref) / torch.linalg.norm(ref)).item() for label, out in outs.items()}
    flop = 4.0 * batch * heads * seq * seq * d / (2 if causal else 1)
    cells = []
    for mode, got in (("cold", bench.rounds(fns, repeats=repeats, warmup=2, flush_l2=True)),
                      ("warm", bench.rounds(fns, repeats=repeats, warmup=2, batch=5))):
        cells.append(f"{mode} cudnn {flop / got['cudnn'].median / 1e12:5.0f} " +
                     " ".join(f"{label} {flop / got[label].median / 1e12:5.0f} ({got.ratio(label, 'cudnn').median:.3f})"
                              for label in outs))
    print(f"d{d:<4d} seq {seq:5d} b{batch:<3d} {'causal' if causal else 'full  '} " + " | ".join(cells) +
          "  TFLOP/s (x cuDNN)  err " + " ".join(f"{e:.1e}" for e in errs.values()), flush=True)
    worst = max(errs.values())
    assert worst < 2e-2, f"d{d} seq {seq} causal={causal}: relative error {worst:.2e} against cuDNN"


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--dims", type=int, nargs="+", default=[64, 128])
    p.add_argument("--seqs", type=int, nargs="+", default=[1024, 2048, 4096])
    p.add_argument("--extra", nargs="*", default=["256:1024"], help="more d:seq rows")
    p.add_argument("--repeats", type=int, default=10)
    p.add_argument("--round1", action="store_true", help="round 1's variants (PAIRED, Q buffers)")
    p.add_argument("--keys", type=int, nargs="*", default=[], help="the default with these keys a tile instead")
    p.add_argument("--causal-only", action="store_true")
    args = p.parse_args()
    import torch  # optional dependency (--help works without it), before the driver is touched

    shapes = [(d, s) for d in args.dims for s in args.seqs] + [tuple(int(x) for x in e.split(":")) for e in args.extra]
    for d, seq in shapes:
        for causal in (True,) if args.causal_only else (True, False):
            row(torch, d, seq, causal, args.repeats, args.round1, tuple(args.keys))


if __name__ == "__main__":
    main()
