"""The deterministic attention backward's walks and dQ warps beside the default mode, in one
process. Full attention: "default" (atomic dQ adds, any order), "chain" (deterministic, every key
block from query block 0, key block j adding after j - 1: DET_ROTATE=0; head dim 128 two dQ
warps), "chain1w" (head dim 128: the chain with one dQ buffer and warp, session 18's), "rotate1w"
(the rotated walk, a persistent cooperative grid of whole (batch, kv head) groups a wave, with one
dQ warp: session 18's plan), "rotate" (the plan's: head dim 128 two dQ warps, DQ_WARPS=2), and
the rotated walk's diagnostics (one dQ warp, DET_DIAG: sums in no fixed order): "nochain" (no
wait, no completion wait, no release: the schedule alone), "nowait" (no chain wait; the
completion wait and release kept), "nodone" (the release once the reduction is read, not
complete; the chain wait kept). Causal: "default", "det" (the plan's last-first chain: head dim
128 two dQ buffers and warps), "det1w" (one buffer and warp, session 18's), "det2b" (two
buffers, one warp).

The benchmark's shapes (16k tokens a batch: head dim 64 x 32 heads, 128 x 16); interleaved
rounds, L2 flushed before every call ("cold") and back to back ("warm"); TFLOP/s (backward = 2.5 x
the forward's FLOPs) and the median per-round speed against the default (default time / its
time: issue 32 asks >= 0.85). Each variant's dq, dk, dv are checked against the default's
(relative error below 2e-2); "a==b" whether two deterministic variants' gradients are equal to
the bit (the same adds in the same order: TWINS), "rerun" whether each deterministic variant's
gradients after the timed calls equal its first call's.

    PYTHONPATH=. python3 tools/experiments/deterministic_backward_ab.py [--rows d128-4k d128-16k
        d128c-4k d128c-16k d64-4k ...] [--repeats N] [--json FILE]
"""
from __future__ import annotations

import argparse

from tmaflow import bench, kernels
from tmaflow.kernels.attention_backward_sm90 import (DET_DIAGNOSTICS, ROTATE_ONE_BUFFER, ROTATE_ONE_DQ_WARP,
                                                     TWO_DQ_BUFFERS)
from tmaflow.kernels.registry import extra_defines

# (label, deterministic, defines over the plan's, diagnostic: sums in no fixed order)
FULL = [("default", False, {}, False), ("chain", True, {"DET_ROTATE": 0}, False),
        ("rotate1w", True, ROTATE_ONE_DQ_WARP, False), ("rotate", True, {}, False)]
FULL_128 = [("chain1w", True, {"DET_ROTATE": 0, **ROTATE_ONE_BUFFER}, False)] + [
    (name, True, {**ROTATE_ONE_DQ_WARP, **diag}, True) for name, diag in DET_DIAGNOSTICS.items()]
CAUSAL = [("default", False, {}, False), ("det", True, {}, False), ("det1w", True, ROTATE_ONE_BUFFER, False),
          ("det2b", True, {**TWO_DQ_BUFFERS, **ROTATE_ONE_DQ_WARP}, False)]
ROWS = {"d128-4k": (128, 4096, False), "d128-16k": (128, 16384, False), "d128c-4k": (128, 4096, True),
        "d128c-16k": (128, 16384, True), "d64-4k": (64, 4096, False), "d64-16k": (64, 16384, False),
        "d64c-4k": (64, 4096, True), "d64c-16k": (64, 16384, True)}


# Variants that must equal another's gradients to the bit (the same adds in the same order)
TWINS = {"rotate": "rotate1w", "chain": "chain1w", "det": "det1w", "det2b": "det1w"}


def variants(d: int, causal: bool) -> list:
    if causal:
        return CAUSAL if d == 128 else CAUSAL[:2]
    return FULL + FULL_128 if d == 128 else [FULL[0], FULL[1], FULL[3]]


COLUMNS = ["d", "seq", "batch", "causal", "det grid", "cold default TFLOP/s", "cold det TFLOP/s", "cold ratio",
           "warm ratio", "bit-identical reruns"]


def row(torch, d: int, seq: int, causal: bool, repeats: int) -> dict:
    """Time one shape's variants; the record's row: the plan's deterministic mode ("rotate" for
    full attention, "det" for causal: the variants without defines over the plan's) against the
    default mode, cold and back to back."""
    heads, batch = {64: 32, 128: 16}[d], max(1, 16384 // seq)
    q, k, v, dout = (torch.randn(batch, heads, seq, d, device="cuda", dtype=torch.bfloat16) for _ in range(4))
    out, lse = kernels.attention(q, k, v, causal=causal, return_lse=True)
    fns, grads, grids, diag = {}, {}, {}, set()
    for label, det, defines, is_diag in variants(d, causal):
        grads[label] = [torch.empty_like(x) for x in (q, k, v)]
        with extra_defines(defines):
            fns[label] = kernels.attention_backward.prepare(q, k, v, out, dout, lse, causal=causal, deterministic=det,
                                                            dq=grads[label][0], dk=grads[label][1],
                                                            dv=grads[label][2])
        main = fns[label].launcher.launches[1]
        grids[label] = f"{main.grid[0]}x{main.grid[1]}x{main.grid[2]}{' coop' if main.config.cooperative else ''}"
        if is_diag or not det:
            diag.add(label)
    for fn in fns.values():
        fn()
    torch.cuda.synchronize()
    first = {label: [g.clone() for g in grads[label]] for label in grads if label not in diag}
    errs = {label: max((torch.linalg.norm(g.float() - r.float()) / torch.linalg.norm(r.float())).item()
                       for g, r in zip(grads[label], grads["default"])) for label in grads}
    same = {f"{label}=={twin}": all(torch.equal(a, b) for a, b in zip(first[label], first[twin]))
            for label, twin in TWINS.items() if label in first and twin in first}
    flop = 2.5 * 4.0 * batch * heads * seq * seq * d * (0.5 if causal else 1.0)
    kind = "causal" if causal else "full"
    plan = "det" if causal else "rotate"
    record = {"d": d, "seq": seq, "batch": batch, "heads": heads, "causal": causal, "det grid": grids[plan]}
    for mode, flush in (("cold", True), ("warm", False)):
        got = bench.rounds(fns, repeats=repeats, warmup=2, flush_l2=flush)
        cells = [f"{label} {flop / got[label].median / 1e12:5.0f}" for label in fns]
        cells += [f"{label}/default {got.ratio(label, 'default').median:.3f}" for label in fns if label != "default"]
        print(f"detbwd d{d:<4d} seq {seq:5d} b{batch:<3d} {kind} {mode} " + " ".join(cells) + "  TFLOP/s", flush=True)
        record[f"{mode} default TFLOP/s"] = flop / got["default"].median / 1e12
        record[f"{mode} det TFLOP/s"] = flop / got[plan].median / 1e12
        record[f"{mode} ratio"] = got.ratio(plan, "default").median
        record[f"{mode} ratios"] = {label: got.ratio(label, "default").median for label in fns if label != "default"}
    torch.cuda.synchronize()
    rerun = {label: all(torch.equal(a, b) for a, b in zip(grads[label], first[label])) for label in first}
    print("    grids " + " ".join(f"{label} {g}" for label, g in grids.items()) + " | err " +
          " ".join(f"{label} {e:.1e}" for label, e in errs.items() if label != "default") +
          " | " + " ".join(f"{pair} {ok}" for pair, ok in same.items()) + " | rerun " +
          " ".join(f"{label} {ok}" for label, ok in rerun.items()), flush=True)
    worst = max(errs.values())
    assert worst < 2e-2, f"d{d} seq {seq}: relative error {worst:.2e} against the default mode"
    assert all(rerun.values()) and all(same.values()), f"d{d} seq {seq}: bits differ: {rerun} {same}"
    record["bit-identical reruns"] = all(rerun.values())
    return record


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--rows", nargs="+", choices=sorted(ROWS), default=["d128-4k", "d128-16k", "d128c-4k",
                                                                       "d128c-16k", "d64-4k"])
    p.add_argument("--repeats", type=int, default=9)
    p.add_argument("--json", help="write the bench record (area attention_deterministic) here")
    args = p.parse_args()
    import torch  # optional dependency (--help works without it), before the driver is touched

    rows = [row(torch, *ROWS[name], args.repeats) for name in args.rows]
    if args.json:
        bench.records.write(args.json, "attention_deterministic",
                            "Deterministic attention backward against the default mode (same rounds)",
                            COLUMNS, rows, repeats=args.repeats)


if __name__ == "__main__":
    main()
