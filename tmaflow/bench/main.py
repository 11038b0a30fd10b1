"""``python -m tmaflow bench``: the suites' tables on this GPU, and their JSON."""
from __future__ import annotations

import argparse
import json
import tempfile

from ..runtime.device import current_device
from ..runtime.driver import driver_available
from .bandwidth import bandwidth_suite, format_table
from .chains import dependent_chains, format_chains
from .costs import compile_times, encode_cost
from .internals import call
from .launch import format_launch, launch_paths
from . import records

SUITES = ("bandwidth", "launch", "chains", "encode", "compile")


def main(argv=None) -> int:
    """``python -m tmaflow bench``: run the suites, print their tables, optionally write JSON."""
    p = argparse.ArgumentParser(prog="tmaflow bench")
    p.add_argument("--json", metavar="FILE", help="write all results to this file")
    p.add_argument("--records", metavar="DIR", help="also write one bench record per suite into DIR "
                   "(bench/results: tools/docs/benchmarks_page.py renders them into BENCHMARKS.md)")
    p.add_argument("--repeats", type=int, default=10, metavar="N")
    p.add_argument("--quick", action="store_true", help="128 MiB problems instead of 1 GiB")
    p.add_argument("--only", choices=SUITES, nargs="*", metavar="SUITE", help=f"only these suites: {', '.join(SUITES)}")
    args = p.parse_args(argv)
    try:  # torch (the peer of several rows) imports cleanly only before the driver is touched
        import torch  # noqa: F401
    except Exception:
        pass
    if not driver_available():
        print("tmaflow bench: no CUDA driver here; benchmarks need a Hopper GPU.")
        return 1
    dev = current_device()
    only = set(args.only or SUITES)
    report = {"device": dev.name, "driver": call("cuDriverGetVersion"),
              "sms": dev.sm_count}
    if "launch" in only:
        report["launch"] = launch_paths()
        print(format_launch(report["launch"]))
    if "chains" in only:
        report["chains"] = dependent_chains()
        print(format_chains(report["chains"]))
    if "encode" in only:
        report["encode"] = encode_cost()
        print("tensor map encode:", json.dumps(report["encode"]))
    if "compile" in only:
        with tempfile.TemporaryDirectory() as tmp:
            report["compile"] = compile_times(tmp)
        print("compile:", json.dumps(report["compile"]))
    if "bandwidth" in only:
        report["bandwidth"] = bandwidth_suite(args.repeats, args.quick)
        print(format_table(report["bandwidth"]))
    if args.json:
        with open(args.json, "w") as f:
            json.dump(report, f, indent=1)
    if args.records:
        write_records(args.records, report)
    return 0


RECORDS = {"launch": ("launch", "Launch paths: host cost per launch against its reference", ["path", "us", "ratio", "ref"]),
           "bandwidth": ("bandwidth", "Bandwidth: ratio to cuMemcpyDtoD in the same run",
                         ["kernel", "shape", "GB/s", "ratio", "ok", "config", "note"]),
           "chains": ("chains", "Dependent chains, PDL against plain",
                      ["chain", "how", "plain_us", "pdl_us", "speedup", "identical"])}


def write_records(directory: str, report: dict) -> None:
    """One bench record per table suite of ``report`` in ``directory``."""
    for suite, (area, title, columns) in RECORDS.items():
        if suite in report:
            records.write(f"{directory}/{area}.json", area, title, columns, report[suite])
    costs = {k: report[k] for k in ("encode", "compile") if k in report}
    if costs:
        rows = [{"measure": f"{suite}: {name}", "value": value} for suite, got in costs.items() for name, value in got.items()]
        records.write(f"{directory}/compile_encode.json", "compile_encode", "Compile and encode costs",
                      ["measure", "value"], rows)
