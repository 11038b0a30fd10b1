"""What the flight recorder costs: the bf16 GEMM and the row softmax, release build against
trace build, same inputs, paired rounds of CUDA-event-timed launches (kernel time only: the
rings are armed once and the launches go straight to cuLaunchKernelEx, so the copy of the
events back to the host is not counted), for trace="stage" and trace="all". Also leaves saved
traces (.npz; `python -m tmaflow trace --load F --json J --png P` draws them) in --out.

    PYTHONPATH=. python3 tools/experiments/trace_overhead.py [--out DIR]
"""
from __future__ import annotations

import argparse
import os
import statistics

import numpy as np

import tmaflow as tf
from tmaflow import bench
from tmaflow.kernels import examples as ex
from tmaflow.kernels import gemm


def raw(prepared):
    """A function launching ``prepared``'s kernel with its packed arguments, and its launcher."""
    launcher = getattr(prepared.launcher, "launcher", prepared.launcher)  # a split-K wrapper
    kp = launcher.packer.pack(prepared.args)
    cfg, fn, launch = launcher.cu_config(0), launcher.module.function, bench.cuda_driver().cuLaunchKernelEx
    return (lambda: launch(cfg, fn, kp, 0)), launcher


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--out", default=os.environ.get("OUT", "."))
    p.add_argument("--repeats", type=int, default=15)
    args = p.parse_args()
    rng = np.random.default_rng(0)
    cases = {}
    for n in (8192, 4096):
        a = tf.from_numpy(rng.integers(0, 2**16, (n, n), dtype=np.uint16) & 0x3FFF, "bfloat16")
        b = tf.from_numpy(rng.integers(0, 2**16, (n, n), dtype=np.uint16) & 0x3FFF, "bfloat16")
        c = tf.empty((n, n), "bfloat16")
        cases[f"gemm {n}^3"] = (lambda a=a, b=b, c=c, **kw: gemm.prepare(a, b, c, **kw), 2 * n**3)
    x = tf.from_numpy(rng.standard_normal((65536, 4096), dtype=np.float32))
    y = tf.empty((65536, 4096), "float32")
    cases["softmax 65536x4096"] = (lambda **kw: ex.softmax.prepare(x, y, **kw), None)
    rows = []
    for name, (prepare, flops) in cases.items():
        fns = {"release": raw(prepare())[0]}
        for level in ("stage", "all"):
            fns[level], launcher = raw(prepare(trace=level))
            launcher.module.recorder.arm(launcher.config, 0)
        got = bench.rounds(fns, repeats=args.repeats, batch=5, warmup=0, settle=3, rotate=True).samples
        rel = statistics.median(got["release"])
        for level in ("stage", "all"):
            ratio = statistics.median(t / r for r, t in zip(got["release"], got[level]))
            tra = statistics.median(got[level])
            rows.append((f"{name} ({level})", rel * 1e6, tra * 1e6, ratio,
                         f"{flops / rel / 1e12:.0f} vs {flops / tra / 1e12:.0f} TFLOP/s" if flops else ""))
            prepare(trace=level)()  # one traced launch through the launcher: events collected
            t = tf.trace.last()
            print(t.summary())
            if "4096" not in name:
                t.save(os.path.join(args.out, f"trace_{name.split()[0]}_{level}.npz"))
    print(f"{'kernel (trace level)':30s} {'release us':>11s} {'trace us':>9s} {'trace/release':>14s}")
    for name, rel, tra, ratio, note in rows:
        print(f"{name:30s} {rel:11.1f} {tra:9.1f} {ratio:14.3f}  {note}")


if __name__ == "__main__":
    main()
