"""kernels.attention against torch's scaled_dot_product_attention with the cuDNN and the flash
backends, in one run: TFLOP/s and the ratio to the better backend, causal and not.

    PYTHONPATH=. python3 tools/peers/bench_attention.py [--json FILE] [--repeats N] [--quick] [--dims D ...]
        [--seqs S ...] [--dtype bfloat16|float16]

Shapes keep 16k tokens a batch (batch = 16384 / seq) at head dim 64 (32 heads), 128 (16
heads) and 256 (8 heads). The three run in interleaved rounds, timed twice: cold (each call
after a write that evicts L2) and back to back; the ratio is the median of per-round ratios. FLOPs: 4 * batch * heads * seq^2 * head_dim, half of it
causal. Each row also checks our output against the cuDNN one. At head dims 64 and 128 the
pre-Hopper kernel kept from seed 002 (kernels.attention_cp_async) runs in the same rounds.
"""
from __future__ import annotations

import argparse

from tmaflow import bench, kernels

CP_ASYNC_HEAD_DIMS = (64, 128)  # the head dims kernels.attention_cp_async takes
COLUMNS = ["dtype", "d", "seq", "batch", "causal", "best_peer", "cold ratio", "warm ratio", "rel_err_vs_peer"]


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--json")
    p.add_argument("--repeats", type=int, default=10)
    p.add_argument("--quick", action="store_true", help="seq 1k and 4k only")
    p.add_argument("--dims", type=int, nargs="+", default=[64, 128, 256], help="head dims to run")
    p.add_argument("--seqs", type=int, nargs="+", help="sequence lengths (default 512 to 16k)")
    p.add_argument("--dtype", default="bfloat16", choices=["bfloat16", "float16"])
    args = p.parse_args()
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
                cells = []
                for mode, got in (("cold", bench.rounds(available, repeats=args.repeats, warmup=2, flush_l2=True)),
                                  ("warm", bench.rounds(available, repeats=args.repeats, warmup=2, batch=5))):
                    tflops = {name: flop / got[name].median / 1e12 for name in available}
                    peers = [n for n in available if n not in ("tmaflow", "cp.async")]
                    best = max(peers, key=lambda n: tflops[n])
                    ratio = got.ratio("tmaflow", best).median
                    row.update({f"{mode} tflops": tflops, "best_peer": best, f"{mode} ratio": ratio})
                    cells.append(f"{mode} " + " ".join(f"{n} {tflops[n]:6.1f}" for n in available)
                                 + f" ratio to {best} {ratio:.3f}")
                rows.append(row)
                print(f"{'fp16' if args.dtype == 'float16' else 'bf16'} d{d:<4d} seq {seq:6d} b{batch:<3d} "
                      f"{'causal' if causal else 'full  '} " + " | ".join(cells) + f"  TFLOP/s  err {err:.1e}", flush=True)
    if args.json:
        bench.records.write(args.json, "attention", "Attention against torch SDPA (cuDNN, flash)", COLUMNS, rows,
                            repeats=args.repeats)


if __name__ == "__main__":
    main()
