"""fp8 block-scaled decode shapes: where row-major scale_a should go (issue 33). Per shape, in ONE
set of interleaved rounds (cold: L2 flushed before every call, then back to back; order rotated
every round) with cuBLAS's block-scaled _scaled_mm: the skinny kernel reading row-major scale_a
with a stage's TMA box of MP rows x 4 k-blocks ("skinny row-major": SkinnyConfig(scale_ring=False),
the default until this tool's 30 rounds on an H200 put the ring 1-13% ahead at the five shapes
but 64x4096x4096 cold), the same with each box loaded once per 4 k-blocks into a ring of its own
(SkinnyConfig(scale_ring=True), now the default; also at the per-stage box's stage count where
the ring's differs), the per-stage box at one stage fewer, the skinny kernel on M-major scale_a
at its own stage count and at the row-major one's (is the lost stage the cost?), and the dense
kernel gathering row-major scale_a (the default before session 20):

    PYTHONPATH=. python3 tools/experiments/block_scales_ab.py [--shape MxNxK ...] [--repeats N]

Every variant's output, poisoned with NaN first, is checked against the float64 product of the
dequantised operands on 256 rows; a wrong one is reported and not timed. Each row gives median
us (cold / back to back) and the median per-round ratio to the peer (above 1: faster)."""
from __future__ import annotations

import argparse
from dataclasses import replace

import tmaflow as tf
from tmaflow import bench, kernels
from tmaflow.kernels.matmul import SkinnyConfig, block_scale_config, skinny_plan

SHAPES = ["64x4096x4096", "64x7168x16384", "128x4096x4096", "128x8192x8192", "128x7168x16384"]
WRONG = 1e-2


def variants(m: int, n: int, k: int, sms: int) -> list:
    """(name, scale_a layout, config) of one shape."""
    box, ring = SkinnyConfig(scale_ring=False), SkinnyConfig(scale_ring=True)  # the row-major rows: forced
    stages = {mode: skinny_plan(m, n, k, config, sms, "float8_e4m3fn", mode).config.stages
              for mode, config in (("row_major", box), ("m_major", SkinnyConfig()))}
    fewer = stages["row_major"] - 1
    in_ring = skinny_plan(m, n, k, ring, sms, "float8_e4m3fn", "row_major").config.stages
    at_box = [(f"skinny row-major ring s{stages['row_major']}", "row",
               replace(ring, stages=stages["row_major"]))] if in_ring != stages["row_major"] else []
    return [("skinny row-major", "row", box),
            (f"skinny row-major ring (s{in_ring})", "row", ring),
            *at_box,
            (f"skinny row-major s{fewer}", "row", replace(box, stages=fewer)),
            (f"skinny M-major (s{stages['m_major']})", "m", SkinnyConfig()),
            (f"skinny M-major s{stages['row_major']}", "m", SkinnyConfig(stages=stages["row_major"])),
            ("dense row-major (gathered)", "row", block_scale_config(m, n, k, sms))]


def shape_rows(m: int, n: int, k: int, sms: int, repeats: int) -> None:
    import torch  # optional dependency: --help works without it

    torch.manual_seed(0)
    a, b = bench.nt_operands(m, n, k, "float8_e4m3fn")
    sa, sb, ref = bench.block_scales(a, b)
    scale_a = {"row": sa, "m": sa.t().contiguous().t()}
    c_peer = torch.empty(m, n, device="cuda", dtype=torch.bfloat16)
    peer = bench.cublas.block_scaled_mm(a, b, sa, sb, c_peer)
    if peer is None:
        print(f"== {m}x{n}x{k}: no block-scaled cuBLAS kernel here; skipped", flush=True)
        return
    fns, names = {"peer": peer}, []
    for name, layout, config in variants(m, n, k, sms):
        c = torch.empty(m, n, device="cuda", dtype=torch.bfloat16)
        try:
            run = kernels.gemm.prepare(a, b, c, scale_a=scale_a[layout], scale_b=sb, config=config)
        except tf.TmaflowError as exc:
            print(f"  skip {name}: {str(exc).splitlines()[0]}", flush=True)
            continue
        err = bench.poisoned_error(run, c, ref)
        if not err < WRONG:
            print(f"  WRONG {name}: rel err {err:.1e}, not timed", flush=True)
            continue
        fns[name] = run
        names.append(name)
    cold = bench.rounds(fns, repeats=repeats, flush_l2=True, rotate=True)
    warm = bench.rounds(fns, repeats=repeats, rotate=True, batch=bench.peers.WARM_BATCH)
    print(f"== {m}x{n}x{k}, {repeats} rounds, peer {cold['peer'].median * 1e6:.2f} / "
          f"{warm['peer'].median * 1e6:.2f} us", flush=True)
    for name in names:
        print(f"   {name:<30s} {cold[name].median * 1e6:8.2f} {warm[name].median * 1e6:8.2f} us   x peer "
              f"{cold.ratio(name, 'peer').median:.3f} / {warm.ratio(name, 'peer').median:.3f}", flush=True)


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--shape", action="append", default=[], help="MxNxK (default: SHAPES)")
    p.add_argument("--repeats", type=int, default=30)
    args = p.parse_args()
    import torch  # optional dependency, before the driver is touched

    torch.cuda.init()
    sms = tf.current_device().sm_count
    for shape in args.shape or SHAPES:
        m, n, k, _ = bench.parse_gemm_shape(shape)  # ("nt" always here)
        shape_rows(m, n, k, sms, args.repeats)


if __name__ == "__main__":
    main()
