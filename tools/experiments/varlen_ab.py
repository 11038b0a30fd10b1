"""Packed (varlen) attention forward against the dense kernel at equal tokens (issue 32: within
5%), and the schedules that might close the gap, in one set of interleaved rounds (cold: L2
flushed before every call; warm: back to back). The variants (extra defines on the varlen
build; session 21's first rounds compared STORE16, 128-key tiles and persistence against the
plans before them, docs/history.md):

- "default": what ``kernels.attention_varlen`` plans: one CTA an SM taking tiles (causal:
  PAIRED units of a sequence's row blocks i and m - 1 - i) from a counter, a tile ahead
  (DYNAMIC_TILES=2, FlashAttention-3's scheduler and order; the default from session 22);
- "split": one Q buffer split into two 64-row stages (Q_SPLIT; "whole": not split, where the
  plan splits: head dims past 80);
- "2q": two Q buffers, where K and V keep two stages ("1q": one, where the plan has two: head
  dims up to 80);
- "k64": 64 keys a tile (a short sequence's masked keys cost less);
- "cta" (causal): one CTA a tile (the plan before PAIRED came to varlen);
- "tiles" (non-causal): one CTA a tile (``attention_varlen_entry.A_TILE_A_CTA``), not one an
  SM striding over them: the block scheduler balances tiles of unequal length where a stride
  may not (ragged batches at head dim 256, few tiles a CTA);
- "stride" (both): one CTA an SM striding over tiles (causal: units) in a fixed order (session
  21's plan, before the counter);
- "dyn" (both): the counter, the next tile taken once a tile's loads but its last V tile are
  issued (DYNAMIC_TILES=1);
- "win" / "seq" (both): the plan in windows (WINDOWS: tiles of 128 packed query rows whatever
  their sequences, each row masking the keys outside its own; the plan's where max_seqlen_q and
  max_seqlen_k are short, ``attention_varlen_entry.in_windows``) or a sequence's own tiles.

Cases (16k tokens, as ``bench_attention.py --varlen``): "tiny 32" (8 / 24 / 40 / 56 x 128)
against dense 512 x 32, "short 64" (16 / 48 / 80 / 112 x 64) against dense 256 x 64, "short 128"
(32 / 96 / 160 / 224 x 32)
and "equal 128" (128 x 128: the varlen machinery alone, no raggedness) against dense 128 x 128;
"mixed 1k" (128 to 1024) against dense 16 x 1024; "ragged 8" (256 to 5120) against dense
8 x 2048; "equal 4k" (4 x 4096) against dense 4 x 4096. TFLOP/s count each kernel's own work;
"vs dense" is the varlen TFLOP/s over the dense kernel's in the same round (the acceptance's
ratio), and each variant's output is checked against the default's.

    PYTHONPATH=. python3 tools/experiments/varlen_ab.py [--dims 128 64] [--cases "short 128"]
        [--repeats N] [--only win seq] [--precompile] [--ncu]

``--precompile``: build every variant's kernel in a process pool and exit (for a device call's
first step). ``--ncu``: one cold call of each function after the warm-up, nothing timed (for
``ncu --kernel-name regex:attention_fwd``)."""
from __future__ import annotations

import argparse
import itertools

from tmaflow import bench, kernels
from tmaflow.kernels import attention_varlen_entry as entry
from tmaflow.kernels.registry import extra_defines

CASES = {"tiny 32": ([8, 24, 40, 56] * 128, (512, 32)),
         "short 64": ([16, 48, 80, 112] * 64, (256, 64)),
         "short 128": ([32, 96, 160, 224] * 32, (128, 128)),
         "equal 128": ([128] * 128, (128, 128)),
         "mixed 1k": ([1024, 896, 768, 640, 512, 384, 256, 128] * 3 + [1024, 896, 512, 128], (16, 1024)),
         "ragged 8": ([5120, 1024, 3072, 512, 2048, 256, 4096, 256], (8, 2048)),
         "equal 4k": ([4096] * 4, (4, 4096))}
HEADS = {64: 32, 128: 16, 256: 8}


def variants(d: int, causal: bool) -> list:
    """(label, extra defines) of the varlen build, the default first."""
    from tmaflow.kernels.attention_entry import attention_plan

    planned = attention_plan(d, causal, varlen=True).defines
    split = ("whole", {"Q_SPLIT": 0}) if planned.get("Q_SPLIT") else ("split", {"Q_SPLIT": 1, "Q_STAGES": 1})
    out = [("default", {}), split]
    two = attention_plan(d, causal, varlen=True, q_stages=2)
    if planned["Q_STAGES"] == 2:
        out.append(("1q", {"Q_STAGES": 1}))
    elif min(p.stages for p in two.layout.items[1:3]) >= 2:
        out.append(("2q", {"Q_STAGES": 2}))
    if attention_plan(d, causal, varlen=True).keys > 64:
        out.append(("k64", {"BLOCK_N": 64}))
    if causal:
        out.append(("cta", {"PAIRED": 0, "DYNAMIC_TILES": 0}))
    return out + ([] if causal else [("tiles", {"DYNAMIC_TILES": 0})]) + [("stride", {"DYNAMIC_TILES": 0}),
                                                                          ("dyn", {"DYNAMIC_TILES": 1}),
                                                                          ("win", WIN), ("seq", SEQ)]


# The windows choice is the entry's (attention_varlen_entry.in_windows), not a define: these
# stand for it.
WIN, SEQ = {"windows": True}, {"windows": False}


def _build(job):
    d, causal, defines = job
    from tmaflow.kernels.attention_entry import attention_kernel, attention_plan

    if "windows" in defines:  # both plans (which one a case takes depends on its lengths)
        for windows in (False, True):
            attention_kernel(entry.varlen_plan(d, causal, d, 1 << 14, 16, windows=windows), "bfloat16").program  # noqa: B018
        return
    plan = attention_plan(d, causal, varlen=True, q_stages=defines.get("Q_STAGES"), keys=defines.get("BLOCK_N"),
                          q_split=bool(defines["Q_SPLIT"]) if "Q_SPLIT" in defines else None)
    with extra_defines(defines):
        attention_kernel(plan, "bfloat16").program  # noqa: B018 (compiles into the cache)
    dense = attention_plan(d, causal)
    attention_kernel(dense, "bfloat16").program  # noqa: B018


def precompile(dims) -> None:
    from concurrent.futures import ProcessPoolExecutor

    jobs = [(d, c, v) for d in dims for c in (False, True) for _, v in variants(d, c)]
    with ProcessPoolExecutor(16) as pool:
        list(pool.map(_build, jobs))
    print(f"precompiled {len(jobs)} varlen builds", flush=True)


def row(torch, d: int, case: str, causal: bool, repeats: int, ncu: bool) -> None:
    lengths, (batch, seq) = CASES[case]
    heads, total, longest = HEADS.get(d, max(1, 2048 // d)), sum(lengths), max(lengths)
    assert total == batch * seq, case
    cu = torch.tensor([0, *itertools.accumulate(lengths)], device="cuda", dtype=torch.int32)
    q, k, v = (torch.randn(total, heads, d, device="cuda", dtype=torch.bfloat16) for _ in range(3))
    dq, dk, dv = (x.reshape(batch, seq, heads, d).transpose(1, 2).contiguous() for x in (q, k, v))
    fns, outs = {}, {}
    for label, defines in variants(d, causal):
        outs[label] = torch.full_like(q, float("nan"))
        entry.A_TILE_A_CTA = label == "tiles"
        planned = entry.in_windows
        if "windows" in defines:
            entry.in_windows = lambda *lengths, windows=defines["windows"]: windows
        try:
            with extra_defines({k: v for k, v in defines.items() if k != "windows"}):
                fns[label] = kernels.attention_varlen.prepare(q, k, v, cu, cu, longest, longest, outs[label],
                                                               causal=causal)
        finally:
            entry.A_TILE_A_CTA, entry.in_windows = False, planned
    dense_out = torch.empty_like(dq)
    fns["dense"] = kernels.attention.prepare(dq, dk, dv, dense_out, causal=causal)
    for fn in fns.values():
        fn()
    torch.cuda.synchronize()
    ref = outs["default"].float()
    errs = {label: (torch.linalg.norm(out.float() - ref) / torch.linalg.norm(ref)).item()
            for label, out in outs.items()}
    if case.startswith("equal"):  # the same sequences both ways
        errs["dense"] = (torch.linalg.norm(dense_out.transpose(1, 2).reshape(total, heads, d).float() - ref) /
                         torch.linalg.norm(ref)).item()
    if ncu:
        for fn in fns.values():
            fn()
        torch.cuda.synchronize()
        print(f"ncu d{d} {case} {'causal' if causal else 'full'}: " + " ".join(fns), flush=True)
        return
    half = 0.5 if causal else 1.0
    flop = {label: 4.0 * heads * d * sum(n * n for n in lengths) * half for label in outs}
    flop["dense"] = 4.0 * batch * heads * seq * seq * d * half
    cells = []
    for mode, got in (("cold", bench.rounds(fns, repeats=repeats, warmup=2, flush_l2=True)),
                      ("warm", bench.rounds(fns, repeats=repeats, warmup=2, batch=5))):
        dense_tf = flop["dense"] / got["dense"].median / 1e12
        cells.append(f"{mode} dense {dense_tf:5.0f} " + " ".join(
            f"{label} {flop[label] / got[label].median / 1e12:5.0f} "
            f"({got.ratio(label, 'dense').median * flop[label] / flop['dense']:.3f})" for label in outs))
    print(f"d{d:<4d} {case:<10} {'causal' if causal else 'full  '} " + " | ".join(cells) +
          "  TFLOP/s (x dense)  err " + " ".join(f"{n} {e:.1e}" for n, e in errs.items()), flush=True)
    worst = max(errs.values())
    assert worst < 2e-2, f"d{d} {case} causal={causal}: relative error {worst:.2e} against the default"


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--dims", type=int, nargs="+", default=[128, 64])
    p.add_argument("--cases", nargs="+", default=list(CASES), choices=list(CASES))
    p.add_argument("--repeats", type=int, default=10)
    p.add_argument("--only", nargs="+", help="these variants (and the default), not every one")
    p.add_argument("--precompile", action="store_true", help="build every variant and exit")
    p.add_argument("--ncu", action="store_true", help="one call of each function, nothing timed")
    args = p.parse_args()
    if args.only:
        global variants
        every = variants
        variants = lambda d, causal: [v for v in every(d, causal) if v[0] == "default" or v[0] in args.only]  # noqa: E731
    if args.precompile:
        precompile(args.dims)
        return
    import torch  # optional dependency (--help works without it), before the driver is touched

    for d in args.dims:
        for case in args.cases:
            for causal in (False, True):
                row(torch, d, case, causal, args.repeats, args.ncu)


if __name__ == "__main__":
    main()
