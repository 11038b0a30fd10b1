"""bf16 GEMMs in a stream, as users run them: cuBLAS (torch.matmul), tmaflow, and tmaflow
launched with PDL, each called back to back or after an L2 flush each time:
    PYTHONPATH=. python3 tools/peers/stream_gemm.py [--shape MxNxK ...] [--rounds N]
Per call: the kernel's device time (CUPTI median), the idle gap before it (negative: PDL
overlapped its start with the kernel before), and the wall time per call (CUDA events over
200 calls). Kernel times compare the kernels; wall times include what lies between them. Last,
how far tmaflow's C lies from cuBLAS's (both bf16)."""
import argparse
import statistics

from tmaflow import bench, kernels

def is_flush(name: str) -> bool:
    return "memset" in name.lower() or "elementwise" in name or "fill" in name.lower()

def timeline(fn, flush, repeats: int = 40) -> tuple:
    """(median kernel µs, median idle gap before a GEMM in µs) over ``repeats`` calls."""
    ev = bench.cupti.timeline(fn, repeats, between=flush)
    gemms = [(s, e) for s, e, name in ev if not is_flush(name)]
    gaps = [ev[i + 1][0] - ev[i][1] for i in range(len(ev) - 1) if not is_flush(ev[i + 1][2])]
    return statistics.median(e - s for s, e in gemms), statistics.median(gaps)

def wall(fn, flush, repeats: int = 200) -> float:
    """µs per call, CUDA events around ``repeats`` calls."""
    import torch  # optional dependency: --help works without it

    for _ in range(5):
        fn()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    torch.cuda.synchronize()
    start.record()
    for _ in range(repeats):
        if flush is not None:
            flush()
        fn()
    end.record()
    torch.cuda.synchronize()
    return start.elapsed_time(end) * 1e3 / repeats

def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--shape", action="append", default=[])
    p.add_argument("--rounds", type=int, default=3)
    args = p.parse_args()
    import torch  # optional dependency, before the driver is touched

    flush = bench.L2Flush()
    for m, n, k in bench.parse_shapes(args.shape, [(2048, 2048, 2048)]):
        a, b = bench.nt_operands(m, n, k)
        c, peer = (torch.empty(m, n, device="cuda", dtype=torch.bfloat16) for _ in range(2))
        fns = {"cuBLAS": lambda: torch.matmul(a, b.T, out=peer), "tmaflow": kernels.gemm.prepare(a, b, c),
               "tmaflow pdl": kernels.gemm.prepare(a, b, c, pdl=True)}
        for flushed in (None, flush):
            print(f"== {m}x{n}x{k} {'after an L2 flush each' if flushed is not None else 'back to back'}")
            got = {label: [] for label in fns}
            for _ in range(args.rounds):
                for label, fn in fns.items():
                    got[label].append((*timeline(fn, flushed), wall(fn, flushed)))
            for label, rows in got.items():
                kernel, gap, per_call = (statistics.median(col) for col in zip(*rows))
                print(f"  {label:12s} kernel {kernel:8.2f} us  gap before it {gap:6.2f} us  "
                      f"wall per call {per_call:8.2f} us", flush=True)
        diff = ((c.float() - peer.float()).abs().max() / peer.float().abs().max()).item()
        print(f"  tmaflow's C against cuBLAS's: max |difference| / max |C| = {diff:.1e}")

if __name__ == "__main__":
    main()
