"""Render BENCHMARKS.md, the reference of current figures, from the bench records in
bench/results/<area>.json (written by the peer tools' and ``python -m tmaflow bench``'s
``--json``; seeded by hand from docs/history.md where no run has written one yet):

    python tools/docs/benchmarks_page.py           # write the page
    python tools/docs/benchmarks_page.py --check   # exit 1 if the page is out of date (CI test)
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
RESULTS = ROOT / "bench" / "results"
PAGE = ROOT / "BENCHMARKS.md"

# (area, heading, the command that writes its record)
AREAS = [
    ("launch", "Launch", "python -m tmaflow bench --only launch"),
    ("bandwidth", "Bandwidth", "python -m tmaflow bench --only bandwidth"),
    ("copy_defaults", "kernels.copy with defaults", "python -m tmaflow bench --only bandwidth"),
    ("compile_encode", "Compile and encode", "python -m tmaflow bench --only compile encode"),
    ("gemm_bf16", "GEMM bf16", "python tools/peers/bench_gemm.py --suite 30 --json bench/results/gemm_bf16.json"),
    ("gemm_sweep", "GEMM bf16: every configuration per shape (the heuristics' evidence)",
     "python tools/peers/gemm_sweep.py --json bench/results/gemm_sweep.json"),
    ("gemm_sweep_long_k", "GEMM bf16: small products of long K, every configuration (session 27: K in clusters of four)",
     "python tools/peers/gemm_sweep.py --shape 129x264x4096 ... --json bench/results/gemm_sweep_long_k.json"),
    ("gemm_fp8", "GEMM fp8 and block-scaled", "python tools/peers/bench_gemm.py --fp8 --json bench/results/gemm_fp8.json"),
    ("gemm_fp8_skinny", "GEMM fp8 decode shapes (skinny path and one-M-tile cluster K-splits) and block scales",
     "python tools/peers/bench_gemm.py --fp8 --skinny --json bench/results/gemm_fp8_skinny.json"),
    ("gemm_skinny", "GEMM skinny, bf16 decode shapes on their own (their rows are also in GEMM bf16; "
                    "the fp8 decode shapes are in the fp8 section above)",
     "python tools/peers/bench_gemm.py --suite skinny --json bench/results/gemm_skinny.json"),
    ("gemm_grouped", "GEMM grouped (MoE)", "python tools/peers/bench_grouped.py --json bench/results/gemm_grouped.json"),
    ("gemm_grouped_acceptance", "GEMM grouped (MoE): issue 33's whole grid",
     "python tools/peers/bench_grouped.py --grid acceptance --json bench/results/gemm_grouped_acceptance.json"),
    ("gemm_unaligned", "GEMM unaligned shapes",
     "python tools/peers/bench_gemm.py --suite unaligned --json bench/results/gemm_unaligned.json"),
    ("attention", "Attention", "python tools/peers/bench_attention.py --json bench/results/attention.json"),
    ("attention_quick", "Attention forward, quick set (seq 1k and 4k)",
     "python tools/peers/bench_attention.py --quick --json bench/results/attention_quick.json"),
    ("attention_varlen", "Attention over packed sequences (varlen)",
     "python tools/peers/bench_attention.py --varlen --json bench/results/attention_varlen.json"),
    ("attention_varlen_backward", "Attention backward over packed sequences (varlen) against the dense backward",
     "python tools/peers/bench_attention.py --varlen --backward --json bench/results/attention_varlen_backward.json"),
    ("attention_backward", "Attention backward",
     "python tools/peers/bench_attention.py --backward --json bench/results/attention_backward.json"),
    ("attention_deterministic", "Attention backward, deterministic mode against the default",
     "python tools/experiments/deterministic_backward_ab.py --rows d128-4k d128-16k d128c-4k d128c-16k d64-4k "
     "d64-16k d64c-4k d64c-16k --json bench/results/attention_deterministic.json"),
    ("attention_decode", "Attention decode (paged KV cache)",
     "python tools/peers/bench_attention.py --decode --json bench/results/attention_decode.json"),
    ("attention_training", "Attention in training (2-layer transformer, 100 steps)",
     "python tools/peers/train_block.py --json bench/results/attention_training.json"),
    ("autotune", "Autotune", "python tools/peers/bench_autotune.py --json bench/results/autotune.json"),
    # the same commands on an H100 (issue 33 asks for both machines)
    ("gemm_bf16_h100", "GEMM bf16 on an H100", "python tools/peers/bench_gemm.py --suite 30 --json ..."),
    ("gemm_fp8_skinny_h100", "GEMM fp8 decode shapes and block scales on an H100",
     "python tools/peers/bench_gemm.py --fp8 --skinny --json ..."),
    ("gemm_grouped_h100", "GEMM grouped (MoE) on an H100", "python tools/peers/bench_grouped.py --grid quick --json ..."),
    ("gemm_unaligned_h100", "GEMM unaligned shapes on an H100 (before stage_rows)",
     "python tools/peers/bench_gemm.py --suite unaligned --json ..."),
    ("attention_quick_h100", "Attention forward, quick set, on an H100",
     "python tools/peers/bench_attention.py --quick --json ..."),
    ("attention_varlen_h100", "Attention over packed sequences (varlen) on an H100",
     "python tools/peers/bench_attention.py --varlen --json ..."),
    ("attention_backward_h100", "Attention backward on an H100",
     "python tools/peers/bench_attention.py --backward --json ..."),
    ("attention_deterministic_h100", "Attention backward, deterministic mode against the default, on an H100",
     "python tools/experiments/deterministic_backward_ab.py --json ..."),
    ("attention_decode_h100", "Attention decode (paged KV cache) on an H100",
     "python tools/peers/bench_attention.py --decode --decode-grid quick --json ..."),
    ("tracing", "Tracing cost", "python tools/experiments/trace_overhead.py"),
    ("sanitizers", "Sanitizers", "SANITIZE=1 bash tools/gpu_check.sh"),
    ("distributed_2", "Multi-GPU: all-gather + GEMM and GEMM + reduce-scatter, 2 ranks",
     "bash tools/multi_gpu_check.sh 2 (tools/peers/bench_distributed.py under torchrun)"),
    ("distributed_4", "Multi-GPU: all-gather + GEMM and GEMM + reduce-scatter, 4 ranks",
     "bash tools/multi_gpu_check.sh 4 (tools/peers/bench_distributed.py under torchrun)"),
]

HEADER = """# Benchmarks: current figures

One table per area, each with the device, driver, commit and command that measured it.
Every figure is a median over repeats, with its ratio to a peer or ceiling measured in the
same run; ratios above 1 mean tmaflow is faster. Peer benchmarks time each row twice: cold
(L2 flushed before every call, as a layer reads its weights in a model) and back to back.
Generated by `python tools/docs/benchmarks_page.py` from `bench/results/*.json`; the log of
how each figure came about is docs/history.md.
"""


def cell(value) -> str:
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, float):
        return f"{value:.3g}" if abs(value) < 1e-2 else f"{value:.3f}" if abs(value) < 100 else f"{value:.1f}"
    if isinstance(value, dict):
        return ", ".join(f"{k} {cell(v)}" for k, v in value.items())
    return str(value).replace("|", "\\|").replace("\n", " ")


def section(area: str, heading: str, command: str) -> list[str]:
    path = RESULTS / f"{area}.json"
    out = [f"## {heading}", ""]
    if not path.exists():
        return out + [f"No figures yet: `{command}` writes them.", ""]
    record = json.loads(path.read_text())
    out += [f"{record['title']}.", "",
            f"Device {record['device']}, driver {record['driver']}, commit `{record['commit']}`, "
            f"{record['date']}; command `{record['command']}`."]
    if record.get("seed"):
        out.append(f"(Figures {record['seed']}.)")
    columns = record["columns"]
    out += ["", "| " + " | ".join(columns) + " |", "|" + " --- |" * len(columns)]
    out += ["| " + " | ".join(cell(row.get(c, "")) for c in columns) + " |" for row in record["rows"]]
    return out + [""]


def render() -> str:
    lines = [HEADER]
    for area, heading, command in AREAS:
        lines += section(area, heading, command)
    known = {area for area, _, _ in AREAS}
    for path in sorted(RESULTS.glob("*.json")):
        if path.stem not in known:
            lines += section(path.stem, path.stem, "")
    return "\n".join(lines).rstrip() + "\n"


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--check", action="store_true", help="exit 1 if BENCHMARKS.md is out of date")
    args = p.parse_args(argv)
    text = render()
    if args.check:
        if not PAGE.exists() or PAGE.read_text() != text:
            print("BENCHMARKS.md is out of date: run python tools/docs/benchmarks_page.py", file=sys.stderr)
            return 1
        return 0
    PAGE.write_text(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
