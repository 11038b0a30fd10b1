"""kernels.attention against torch's scaled_dot_product_attention with the cuDNN and the flash
backends, in one run: TFLOP/s and the ratio to the better backend, causal and not.

    PYTHONPATH=. python3 tools/bench_attention.py [--json FILE] [--repeats N] [--quick]

Shapes keep 16k tokens a batch (batch = 16384 / seq) at head dim 64 (32 heads), 128 (16
heads) and 256 (8 heads). The three run in turns, each timed call after a 256 MB write that evicts L2; the ratio
is the median of per-round ratios. FLOPs: 4 * batch * heads * seq^2 * head_dim, half of it
causal. Each row also checks our output against the cuDNN one. At head dims 64 and 128 the
pre-Hopper kernel kept from seed 002 (kernels.attention_cp_async) runs in the same rounds.
"""
from __future__ import annotations

import argparse
import json
import statistics

import torch  # before the driver is touched
from torch.nn.attention import SDPBackend, sdpa_kernel

import tmaflow as tf
from bench_gemm import timed_rounds  # tools/ is on the path when this script runs
from tmaflow import kernels
from tmaflow.kernels.attention_entry import CP_ASYNC_HEAD_DIMS


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--json")
    p.add_argument("--repeats", type=int, default=10)
    p.add_argument("--quick", action="store_true", help="seq 1k and 4k only")
    p.add_argument("--dims", type=int, nargs="+", default=[64, 128, 256], help="head dims to run")
    p.add_argument("--seqs", type=int, nargs="+", help="sequence lengths (default 512 to 16k)")
    p.add_argument("--dtype", default="bfloat16", choices=["bfloat16", "float16"])
    args = p.parse_args()
    flush = torch.empty(256 << 20, dtype=torch.uint8, device="cuda")
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
                times = timed_rounds(available, flush, args.repeats, warmup=2)
                flop = 4.0 * batch * heads * seq * seq * d / (2 if causal else 1)
                tflops = {name: flop / statistics.median(t) / 1e9 for name, t in times.items()}
                peers = [n for n in times if n not in ("tmaflow", "cp.async")]
                best = max(peers, key=lambda n: tflops[n])
                ratio = statistics.median(b / o for b, o in zip(times[best], times["tmaflow"]))
                row = {"dtype": args.dtype, "d": d, "seq": seq, "batch": batch, "heads": heads, "causal": causal,
                       "tflops": tflops, "best_peer": best, "ratio": ratio, "rel_err_vs_peer": err}
                rows.append(row)
                print(f"{'fp16' if args.dtype == 'float16' else 'bf16'} d{d:<4d} seq {seq:6d} b{batch:<3d} {'causal' if causal else 'full  '} "
                      + "  ".join(f"{n} {tflops[n]:6.1f}" for n in times)
                      + f"  TFLOP/s  ratio to {best} {ratio:.3f}  err {err:.1e}", flush=True)
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"device": tf.current_device().name, "torch": torch.__version__, "rows": rows}, f, indent=1)


if __name__ == "__main__":
    main()
