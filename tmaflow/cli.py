"""``python -m tmaflow demo | bench | cache info|clear | swizzle``."""
from __future__ import annotations

import argparse
import os
import sys
import time

import numpy as np

from . import checks, plot
from .bench import do_bench
from .bench.bandwidth import bandwidth_suite, format_table
from .bench.main import main as bench_main
from .debug import trace as tr
from .dtypes import bf16_bits, bf16_to_float32
from .errors import TmaflowError
from .kernels import examples, gemm
from .kernels.matmul import gemm_plan
from .launch import cache
from .runtime import driver
from .runtime.device import current_device
from .runtime.driver import driver_available
from .runtime.memory import empty, from_numpy
from .tma import reference
from .tma.spec import TensorMapSpec
from .version import __version__


def _output(option: str, path):
    """An output path whose directory exists (checked before any work, so a typo does not
    cost the run)."""
    if path is None:
        return None
    if not path or os.path.isdir(path) or not os.path.isdir(os.path.dirname(path) or "."):
        raise TmaflowError(f"{option}={path!r} must be a file in an existing directory")
    return path


def _demo_compile_only() -> int:
    print("tmaflow demo: no CUDA driver / GPU here, so NO KERNEL RAN.")
    print("Compiling every example to sm_90a CUBIN, validating its tensor maps, and running the")
    print("numpy TMA model instead.\n")
    plans = [
        ("tile_copy", *examples.copy_plan("float32", (16384, 16384))[1:]),
        ("transpose", examples.transpose_plan((8192, 8192))[2], None),
        ("softmax", *examples.softmax_plan((65536, 4096))[1:]),
        ("broadcast_scale", examples.broadcast_plan(256, 4)[1], None),
        ("axpb_ldgsts", None, None), ("axpb_tma", None, None),
    ]
    g = gemm_plan(8192, 8192, 8192)
    plans.append(("gemm_bf16", g.layout, g.defines))
    for name, layout, defines in plans:
        t0 = time.perf_counter()
        k = examples.get_kernel(name, layout, defines)
        res = k.resources
        usage = f"{res.registers:3d} regs, {res.spills} B spills" if res else "no ptxas report"
        smem = layout.total_bytes if layout is not None else 0
        print(f"  compiled {name:16s} {len(k.cubin):7d} B cubin, {usage}, "
              f"{smem:6d} B planned smem ({time.perf_counter() - t0:.2f} s)")
    spec = TensorMapSpec.tiled("bfloat16", (64, 64), (8, 64), swizzle="128B")
    g = np.arange(64 * 64, dtype=np.uint16).reshape(64, 64)
    image = reference.tma_load(g, spec, (0, 0)).view(np.uint16).reshape(8, 64)
    print("\n  reference: a bf16 (8 x 64) box with 128B swizzle; element column of each 16-byte")
    print("  chunk per row (row r, chunk c holds elements 8*(c ^ r) ...):")
    for r in range(8):
        print("   ", " ".join(f"{image[r, 8 * c] % 64:2d}" for c in range(8)))
    print("\nDone: compiled and modelled. Run on a Hopper GPU to execute the kernels.")
    return 0


def demo(args) -> int:
    if not driver.driver_available() or args.no_gpu:
        return _demo_compile_only()

    dev = current_device()
    if not dev.is_hopper:
        print(f"tmaflow demo: {dev.name} is not a Hopper GPU; compile-only mode.")
        return _demo_compile_only()
    print(f"tmaflow demo on {dev.name} ({dev.sm_count} SMs): running every example, checked "
          "against numpy")
    rows = bandwidth_suite(repeats=5, quick=True)
    print(format_table(rows))
    gemm_ok = _demo_gemm()
    return 0 if all(r["ok"] for r in rows) and gemm_ok else 1


def _demo_gemm(n: int = 4096) -> bool:
    """The bf16 GEMM at n^3: rows of C checked against float64 numpy, TFLOP/s from events."""
    rng = np.random.default_rng()
    bits = [bf16_bits(rng.standard_normal((n, n))) for _ in range(2)]
    A, B = (from_numpy(x, dtype="bfloat16") for x in bits)
    out = empty((n, n), "bfloat16").fill_bytes(0xFF)
    run = gemm.prepare(A, B, out)
    seconds = do_bench(run, warmup=2, repeats=10).median
    got = bf16_to_float32(out.numpy()[:256])
    av, bv = (bf16_to_float32(x).astype(np.float64) for x in bits)
    ref = av[:256] @ bv.T
    err = float(np.linalg.norm(got - ref) / np.linalg.norm(ref))
    ok = bool(np.isfinite(got).all() and err < 1e-2)
    print(f"\n  gemm bf16 {n}x{n}x{n} (C = A B^T): {2 * n ** 3 / seconds / 1e12:.0f} TFLOP/s, "
          f"rel. error {err:.1e} on 256 rows vs float64 numpy: {'ok' if ok else 'WRONG'}")
    print("  (its ratio to cuBLAS: tools/peers/bench_gemm.py)")
    return ok


def swizzle(args) -> int:
    _output("--png", args.png)
    try:
        box = tuple(int(v) for v in args.box.lower().split("x"))
    except ValueError:
        raise TmaflowError(f"--box={args.box!r} must be extents joined by 'x', e.g. 8x64") from None
    if not 1 <= len(box) <= 5 or not all(1 <= b <= 256 for b in box):
        raise TmaflowError(f"--box={args.box!r} must be 1-5 extents in [1, 256], e.g. 8x64")
    spec = TensorMapSpec.tiled(args.dtype, box, box, swizzle=args.swizzle)
    pos = reference.element_positions(spec)  # byte offset of each element
    E = spec.dtype.itemsize
    rows, cols = (pos.shape[0] if pos.ndim > 1 else 1), pos.shape[-1]
    pos2 = pos.reshape(-1, cols)
    fig = plot.figure("swizzle --png", (max(4, cols / 8), max(3, rows / 4))) if args.png else None
    print(spec.describe())
    print(f"\nsmem row (of {spec.row_pitch} B) and 16-byte chunk where element [row, col] lands:")
    per_chunk = max(1, 16 // E)
    for r in range(min(pos2.shape[0], 16)):
        cells = []
        for c in range(0, cols, per_chunk):
            off = int(pos2[r, c])
            cells.append(f"{off // spec.row_pitch}:{(off % spec.row_pitch) // 16}")
        print(f"  row {r:3d}: " + " ".join(cells))
    if fig is not None:
        chunk = (pos2 % spec.row_pitch) // 16
        ax = fig.subplots()
        ax.imshow(chunk, cmap="tab10", aspect="auto")
        per = max(1, 16 // E)
        if cols // per <= 32 and rows <= 32:
            for r in range(chunk.shape[0]):
                for c in range(0, cols, per):
                    ax.text(c + (per - 1) / 2, r, str(int(chunk[r, c])), ha="center", va="center",
                            fontsize=8, color="white")
        ax.set_xlabel("element column")
        ax.set_ylabel("box row")
        ax.set_title(f"{spec.dtype.name} box {box}, swizzle {spec.swizzle}: 16-byte chunk in smem row")
        fig.savefig(args.png, dpi=120, bbox_inches="tight")
        print(f"wrote {args.png}")
    return 0


def cache_cmd(args) -> int:
    where = cache.cache_dir()
    if os.path.exists(where) and not os.path.isdir(where):
        raise TmaflowError(f"the compile cache TMAFLOW_CACHE_DIR={str(where)!r} is a file, not a "
                           "directory; point it at a directory or remove the file")
    if args.action == "clear":
        print(f"removed {cache.clear()} entries from {cache.cache_dir()}")
    else:
        for k, v in cache.info().items():
            print(f"{k:10s} {v}")
    return 0


def trace_cmd(args) -> int:
    """Trace one launch of an entry point (GPU), or redraw a saved trace (no GPU)."""
    checks.as_int("--ctas", args.ctas, 1)
    checks.as_float("--window", args.window, lo=0)
    for option in ("json", "png", "save"):
        _output(f"--{option}", getattr(args, option))
    t: tr.Trace | None
    if args.load is not None:
        t = tr.Trace.load(args.load)
    else:
        if not driver_available():
            print("tmaflow trace: no CUDA driver here; tracing runs a kernel (use --load FILE.npz "
                  "to draw a saved trace)")
            return 1
        import numpy as np

        dims = [int(v) for v in args.shape.lower().split("x")]
        rng = np.random.default_rng(0)
        if args.kernel == "gemm":
            m, n, k = (dims * 3)[:3] if len(dims) == 1 else dims
            a = from_numpy(rng.integers(0, 2**16, (m, k), dtype=np.uint16) & 0x3FFF, "bfloat16")
            b = from_numpy(rng.integers(0, 2**16, (n, k), dtype=np.uint16) & 0x3FFF, "bfloat16")
            gemm(a, b, trace=True)
        else:
            rows, cols = (dims * 2)[:2]
            x = from_numpy(rng.standard_normal((rows, cols), dtype=np.float32))
            getattr(examples, args.kernel)(x, trace=True)
        t = tr.last()
        if t is None:
            raise TmaflowError(f"tmaflow trace: the {args.kernel} launch recorded no trace")
    print(t.summary())
    if args.json:
        t.to_chrome(args.json)
        print(f"wrote {args.json} (open it in https://ui.perfetto.dev or chrome://tracing)")
    if args.save:
        t.save(args.save)
        print(f"wrote {args.save}")
    if args.png:
        t.to_png(args.png, blocks=args.ctas, window_us=args.window or None)
        print(f"wrote {args.png}")
    return 0


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m tmaflow")
    p.add_argument("-V", "--version", action="version", version=f"tmaflow {__version__}")
    sub = p.add_subparsers(dest="cmd", required=True)
    d = sub.add_parser("demo", help="run the examples (GPU) or compile and model them (no GPU)")
    d.add_argument("--no-gpu", action="store_true", help="compile-only mode even with a GPU")
    sub.add_parser("bench", help="benchmarks: tables and JSON", add_help=False)
    c = sub.add_parser("cache", help="the compile cache")
    c.add_argument("action", choices=["info", "clear"])
    s = sub.add_parser("swizzle", help="show where a box's elements land in shared memory")
    s.add_argument("--dtype", default="bfloat16")
    s.add_argument("--box", default="8x64", help="rows x cols, e.g. 8x64")
    s.add_argument("--swizzle", default="128B", choices=["none", "32B", "64B", "128B"])
    s.add_argument("--png", help="also draw it to this PNG (needs matplotlib: the plot extra)")
    t = sub.add_parser("trace", help="flight recorder: trace one launch of an entry point")
    t.add_argument("kernel", nargs="?", default="gemm", choices=["gemm", "softmax", "copy"])
    t.add_argument("--shape", default="2048", help="gemm: MxNxK or one size; softmax/copy: ROWSxCOLS")
    t.add_argument("--json", help="write the Chrome / Perfetto trace JSON here")
    t.add_argument("--png", help="draw a timeline of the first CTAs here (needs matplotlib)")
    t.add_argument("--ctas", type=int, default=2, help="CTAs in the PNG")
    t.add_argument("--window", type=float, default=12.0, help="µs at the end the PNG shows (0: all)")
    t.add_argument("--save", help="keep the events in this .npz (draw it elsewhere with --load)")
    t.add_argument("--load", help="a saved trace (.npz) instead of running a kernel")
    argv = list(sys.argv[1:] if argv is None else argv)

    try:
        if argv and argv[0] == "bench":
            return bench_main(argv[1:])
        args = p.parse_args(argv)
        return {"demo": demo, "cache": cache_cmd, "swizzle": swizzle, "trace": trace_cmd}[args.cmd](args)
    except TmaflowError as exc:  # a user-facing problem: its message, not a traceback
        print(f"tmaflow: {str(exc).splitlines()[0]}", file=sys.stderr)
        return 1
    except BrokenPipeError:  # `python -m tmaflow swizzle | head`: the reader left, not an error
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())  # so the interpreter's final flush stays quiet
        return 0
    except OSError as exc:  # a path that cannot be written (--png, --json), a cache dir
        print(f"tmaflow: {exc.strerror or exc}: {exc.filename or ''}".rstrip(": "), file=sys.stderr)
        return 1
