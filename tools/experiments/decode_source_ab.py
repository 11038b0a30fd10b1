"""kernels.attention_decode built from this tree's decode.cu against the same plan built from
other sources of it (an earlier commit's: ``git show REV:tmaflow/kernels/decode.cu > OLD.cu``),
in one set of rotated rounds, cold (L2 flushed before every call) and back to back; the outputs
compared first (bits against this tree's, and against float64 softmax(q k^T) v):

    PYTHONPATH=. python3 tools/experiments/decode_source_ab.py --baseline OLD.cu [OTHER.cu ...]
        [--repeats N] [--rows GROUP:PAGE:BATCH:CONTEXT ...]

Rows (default): batch 1 at 1k, 8k and 32k (GQA 8:1 and 4:1, page 16): the short calls whose
tail (the warps' and the splits' merges) is a large share of their time; batch 4 8k. Each row
prints the plan's grid and merge, then per source its median us and the median per-round ratio
(its time over this tree's: above 1, this tree is faster). The plan is the same (the
Python side is this tree's): a change of the kernel alone."""
from __future__ import annotations

import argparse

from tmaflow import bench, kernels
from tmaflow.kernels import registry

ROWS = ["8:16:1:1024", "8:16:1:8192", "8:16:1:32768", "4:16:1:8192", "8:16:4:8192"]
HEADS_KV, HEAD_DIM = 8, 128


def baseline_source(text: str, index: int):
    """Entry points called inside build decode.cu's kernels from ``text`` (a define marks them
    apart in the on-disk kernel caches too)."""
    return registry.extra_defines({"TMAFLOW_BASELINE_SOURCE": index + 1}, sources={"decode": text})


def reference(torch, q, k_cache, v_cache, table, ctx, group):
    """float64 softmax(q k^T / sqrt(d)) v of one request (batch index 0) over its table's pages."""
    k = k_cache[table[0].long()].reshape(-1, HEADS_KV, HEAD_DIM)[:ctx].double()
    v = v_cache[table[0].long()].reshape(-1, HEADS_KV, HEAD_DIM)[:ctx].double()
    qh = q[0].double().view(HEADS_KV, group, HEAD_DIM)
    s = torch.einsum("hgd,khd->hgk", qh, k) / HEAD_DIM ** 0.5
    return torch.einsum("hgk,khd->hgd", torch.softmax(s, -1), v).reshape(HEADS_KV * group, HEAD_DIM)


def row(torch, texts: dict, spec: str, repeats: int) -> None:
    group, page, batch, ctx = (int(x) for x in spec.split(":"))
    dt = torch.bfloat16
    pages = ctx // page
    k_cache, v_cache = (torch.randn(batch * pages, page, HEADS_KV, HEAD_DIM, device="cuda", dtype=dt) for _ in "kv")
    table = torch.randperm(batch * pages, device="cuda", dtype=torch.int32).view(batch, pages)
    lens = torch.full((batch,), ctx, device="cuda", dtype=torch.int32)
    q = torch.randn(batch, HEADS_KV * group, HEAD_DIM, device="cuda", dtype=dt)
    outs = {name: torch.full_like(q, float("nan")) for name in ("this", *texts)}
    fns = {"this": kernels.attention_decode.prepare(q, k_cache, v_cache, table, lens, out=outs["this"])}
    for index, (name, text) in enumerate(texts.items()):
        with baseline_source(text, index):
            fns[name] = kernels.attention_decode.prepare(q, k_cache, v_cache, table, lens, out=outs[name])
    for fn in fns.values():
        fn()
    torch.cuda.synchronize()
    ref = reference(torch, q, k_cache, v_cache, table, ctx, group)
    errs = {name: ((out[0].double() - ref).abs().max() / ref.abs().max()).item() for name, out in outs.items()}
    same = all(torch.equal(outs["this"].view(torch.int16), out.view(torch.int16)) for out in outs.values())
    cold = bench.rounds(fns, repeats=repeats, warmup=2, flush_l2=True, rotate=True)
    warm = bench.rounds(fns, repeats=repeats, warmup=2, batch=5, settle=1, rotate=True)
    launcher = getattr(fns["this"].launcher, "launcher", fns["this"].launcher)
    defines = launcher.kernel.defines
    merge = next((m for m in ("SLICE_MERGE", "CLUSTER_MERGE", "MERGE_KERNEL", "PERSISTENT", "HEAD_GROUP")
                  if defines.get(m)), "counter")
    print(f"{group}:1 page {page} batch {batch} ctx {ctx} grid {launcher.config.grid} {merge.lower()}: this "
          f"{cold['this'].median * 1e6:.2f} / {warm['this'].median * 1e6:.2f} us (cold / back to back), "
          f"err {errs['this']:.1e}, equal bits {same}", flush=True)
    for name in texts:
        print(f"    {name:<40s} {cold[name].median * 1e6:6.2f} / {warm[name].median * 1e6:6.2f} us  "
              f"x{cold.ratio('this', name).median:.3f} / x{warm.ratio('this', name).median:.3f}  err {errs[name]:.1e}",
              flush=True)


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--baseline", required=True, nargs="+",
                   help="other decode.cu sources (e.g. git show REV:tmaflow/kernels/decode.cu)")
    p.add_argument("--repeats", type=int, default=30)
    p.add_argument("--rows", nargs="*", default=ROWS, help="GROUP:PAGE:BATCH:CONTEXT (GQA group, page size)")
    args = p.parse_args()
    import torch  # optional dependency, as in the benches
    texts = {path: open(path).read() for path in args.baseline}
    print("this tree's decode.cu against", *args.baseline, "(ratios: their time / this; above 1, this is faster)")
    for spec in args.rows:
        row(torch, texts, spec, args.repeats)
        torch.cuda.empty_cache()


if __name__ == "__main__":
    main()
