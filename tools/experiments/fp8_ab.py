r"""A/B of fp8 GEMM kernel variants in one run, each paired with torch._scaled_mm:
    PYTHONPATH=. python3 tools/experiments/fp8_ab.py [--shape MxNxK ...] [--repeats N] [--only A|B] [--base LABEL]
A variant is a GemmConfig, per-tensor or block scales (scale_a row-major or M-major), extra
compile-time defines (for trying a kernel change before it becomes a config) and optionally
an edit of the FFMA runs' yield bits in the SASS (tools/experiments/sass_yield.py). cuBLAS's block-scaled
_scaled_mm runs beside them where torch has it. Errors are against float64 of the dequantised
operands on 256 rows; "bits" says whether a variant's whole output equals the first selected
variant's of the same scales (same inputs). --base: every row also gives the per-round ratio
against that variant (above 1: faster than it). The releases of a stage of row-major block
scales (gemm.cu's SCALE_RELEASE) against the one before, at four shapes, cold and back to back:
    PYTHONPATH=. python3 tools/experiments/fp8_ab.py --only release --base "block scales, row-major, release warp" \
        --shape 4096x7168x16384 --shape 2048x2048x4096 --shape 512x4096x7168 --shape 8192x8192x8192"""
import argparse
import functools

import sass_yield  # this script's directory: python puts it first on the path

from tmaflow import bench, kernels
from tmaflow.kernels.matmul import GemmConfig, SkinnyConfig
from tmaflow.kernels.registry import extra_defines


def yield_patch(cubin: bytes, symbol: str, hold: bool = False, **fields) -> bytes:
    """The CUBIN with its FFMA runs' scheduling bits edited (tools/experiments/sass_yield.py)."""
    if hold:
        cubin, changed = sass_yield.hold_in_ffma_runs(cubin, symbol)
    else:
        cubin, changed = sass_yield.yield_in_ffma_runs(cubin, symbol, **fields)
    print(f"  yield patch {fields or 'hold'}: {changed} instructions", flush=True)
    return cubin


def selected(label: str, only: str) -> bool:
    """Whether ``--only`` (substrings with | between; empty: every label) picks this variant."""
    return any(part in label for part in only.split("|"))


P1 = dict(bn=128, cluster_m=1, epi_cols=64, stages=6, promote=1)
VARIANTS = [  # (label, block scales: None, "row_major" or "m_major" (scale_a's layout), GemmConfig
    #          fields, a SkinnyConfig, or None for the automatic choice, extra defines, SASS patch
    #          arguments or None)
    ("block scales, row-major", "row_major", None, {}, None),
    # gemm.cu's SCALE_RELEASE: 1 (the default) every lane releases on its own CTA, 0 one lane per
    # CTA after __syncwarp (the release before; racecheck flags it), 2 one reading lane per quad
    ("block scales, row-major, release lanes", "row_major", None, {"SCALE_RELEASE": 1}, None),
    ("block scales, row-major, release warp", "row_major", None, {"SCALE_RELEASE": 0}, None),
    ("block scales, row-major, release quads", "row_major", None, {"SCALE_RELEASE": 2}, None),
    ("block scales, M-major", "m_major", None, {}, None),
    ("block scales, M-major, FFMA yields 9/16", "m_major", None, {}, dict(fraction=9 / 16)),
    ("block scales, M-major, tail split", "m_major", dict(bn=128, cluster_m=2, epi_cols=64, promote=1, split_tail=True), {}, None),
    ("block scales, M-major, unclustered", "m_major", dict(bn=128, cluster_m=1, epi_cols=64, promote=1), {}, None),
    ("block scales, M-major, skinny, one set", "m_major", SkinnyConfig(), {"BLOCK_SCALE_SETS": 1}, None),
    ("block scales, M-major, skinny, two sets", "m_major", SkinnyConfig(), {"BLOCK_SCALE_SETS": 2}, None),
    # session 32, the skinny path at M = 1-64: B's scales of the split loaded into registers before
    # the k-loop (skinny.cu's SCALES_B_AHEAD), and row-major scale_a's box with every stage
    ("block scales, row-major, skinny", "row_major", SkinnyConfig(), {}, None),
    ("block scales, row-major, skinny, B scales ahead", "row_major", SkinnyConfig(), {"SCALES_B_AHEAD": 1}, None),
    ("block scales, row-major, skinny, per-stage box", "row_major", SkinnyConfig(scale_ring=False), {}, None),
    ("block scales, M-major, skinny", "m_major", SkinnyConfig(), {}, None),
    ("block scales, M-major, skinny, B scales ahead", "m_major", SkinnyConfig(), {"SCALES_B_AHEAD": 1}, None),
    ("block scales, row-major, unclustered", "row_major", dict(bn=128, cluster_m=1, epi_cols=64, promote=1), {}, None),
    ("per-tensor, bn192 clusters of 2", None, dict(bn=192, cluster_m=2, epi_cols=64), {}, None),
    ("per-tensor, bn192 clusters of 2, tail split", None, dict(bn=192, cluster_m=2, epi_cols=64, split_tail=True), {}, None),
    ("per-tensor, bn128 clusters of 2", None, dict(bn=128, cluster_m=2), {}, None),
    ("per-tensor, bn128 clusters of 2, tail split", None, dict(bn=128, cluster_m=2, split_tail=True), {}, None),
    ("per-tensor, bn192 unclustered", None, dict(bn=192, cluster_m=1, epi_cols=64), {}, None),
    ("per-tensor, bn128 e64 s6 promote 1", None, P1, {}, None),
    ("per-tensor, bn128 e64 s6 promote 0", None, dict(P1, promote=0), {}, None),
]


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--shape", action="append", default=[])
    p.add_argument("--repeats", type=int, default=20)
    p.add_argument("--only", default="", help="substrings (| between) of the variant labels to run")
    p.add_argument("--base", default="", help="a variant label: every row also gives its ratio against it")
    args = p.parse_args()
    if args.base and not any(args.base == v[0] and selected(v[0], args.only) for v in VARIANTS):
        p.error(f"--base {args.base!r} is not a label --only selects")
    import torch  # optional dependency: --help works without it

    shapes = bench.parse_shapes(args.shape, [(4096, 7168, 16384), (8192, 8192, 8192)])
    for m, n, k in shapes:
        torch.manual_seed(0)
        a, b = bench.nt_operands(m, n, k, "float8_e4m3fn")
        sa, sb, ref_block = bench.block_scales(a, b)
        one = torch.tensor(0.01, device="cuda")
        ref_tensor = (a[:256].double() @ b.double().T) * 1e-4
        fns, errs = {}, {}
        peer_out = torch.empty(m, n, device="cuda", dtype=torch.bfloat16)
        fns["_scaled_mm"] = lambda: torch._scaled_mm(a, b.T, scale_a=one, scale_b=one, out_dtype=torch.bfloat16,
                                                     out=peer_out)
        block_out = torch.empty(m, n, device="cuda", dtype=torch.bfloat16)
        blockwise = bench.cublas.block_scaled_mm(a, b, sa, sb, block_out)
        if blockwise is not None:
            fns["_scaled_mm block scales"], errs["_scaled_mm block scales"] = blockwise, bench.rel_error(block_out[:256], ref_block)
        outputs: dict = {}  # block mode -> (label, output) of its first variant
        for label, block, fields, extra, patch in VARIANTS:
            if not selected(label, args.only):
                continue
            c = torch.empty(m, n, device="cuda", dtype=torch.bfloat16)
            cfg = GemmConfig(**fields) if isinstance(fields, dict) else fields
            scales = ({"scale_a": sa.t().contiguous().t() if block == "m_major" else sa, "scale_b": sb} if block
                      else {"scale_a": 0.01, "scale_b": 0.01})
            with extra_defines(extra, patch=functools.partial(yield_patch, **patch) if patch else None):
                run = kernels.gemm.prepare(a, b, c, config=cfg, **scales)
            errs[label] = bench.poisoned_error(run, c, ref_block if block else ref_tensor)
            first, out = outputs.setdefault(block, (label, c))
            if first != label:
                same = torch.equal(c.view(torch.int16), out.view(torch.int16))
                print(f"{label}: bits {'identical to' if same else 'DIFFER from'} {first!r}", flush=True)
            fns[label] = run
        flop = 2.0 * m * n * k
        for how, got in (("cold", bench.rounds(fns, repeats=args.repeats, flush_l2=True)),
                         ("back to back", bench.rounds(fns, repeats=args.repeats, batch=10))):
            print(f"== {m}x{n}x{k} {how}")
            for name in fns:
                ms = got[name].median * 1e3
                peer = "_scaled_mm block scales"
                versus = "".join(f"  vs {ref} {got.ratio(name, ref).median:.3f}" for ref in (peer, args.base)
                                 if ref in fns and ref != name)
                print(f"{name:<28s} {flop / ms / 1e9:8.1f} TFLOP/s  {ms:7.3f} ms  vs _scaled_mm "
                      f"{got.ratio(name, '_scaled_mm').median:.3f}{versus}  err {errs.get(name, float('nan')):.1e}",
                      flush=True)


if __name__ == "__main__":
    main()
