"""Every forward attention variant compiled with NVRTC (no GPU needed): per head-dim pair,
causal or not, dense or varlen, its keys a tile, pipeline stages, shared memory, registers,
spills and ptxas's wgmma notes, as one table.

    PYTHONPATH=. python3 tools/experiments/attention_variants.py [--dims 96 192/128 ...] [--dtype float16]

Registers are what the launch allocates (384 threads, 168 each); the consumers' 232 and the
producer's 40 (setmaxnreg) show as spills when a variant outgrows them."""
from __future__ import annotations

import argparse

from tmaflow.kernels.attention_entry import HEAD_DIMS, attention_kernel, attention_plan
from tmaflow.launch import compiler


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--dims", nargs="+", help="head dims, d or d/dv (default: every multiple of 16 and 192/128)")
    p.add_argument("--dtype", default="bfloat16", choices=["bfloat16", "float16"])
    args = p.parse_args()
    dims = [tuple(int(x) for x in a.split("/")) * (1 if "/" in a else 2) for a in args.dims] if args.dims else \
        [(d, d) for d in HEAD_DIMS] + [(192, 128)]
    print("| d / dv | causal | build | keys | stages q/k/v | smem B | regs | spills B | wgmma notes |")
    print("| --- | --- | --- | --- | --- | --- | --- | --- | --- |")
    for d, dv in dims:
        for causal in (False, True):
            for varlen in (False, True):
                plan = attention_plan(d, causal, dv, varlen)
                kernel = attention_kernel(plan, args.dtype)
                r = kernel.resources
                stages = "/".join(str(item.stages) for item in plan.layout.items[:3])
                notes = len(compiler.wgmma_pipeline_notes(kernel.program.log))
                print(f"| {d} / {dv} | {'yes' if causal else 'no'} | {'varlen' if varlen else 'dense'} | {plan.keys} | "
                      f"{stages} | {plan.layout.total_bytes} | {r.registers} | {r.spills} | {notes} |", flush=True)


if __name__ == "__main__":
    main()
