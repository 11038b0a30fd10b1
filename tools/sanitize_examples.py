"""Run every example kernel (or, with --seeds, every seed kernel) once, small, on initialised
data, for compute-sanitizer:

    compute-sanitizer --tool memcheck python3 tools/sanitize_examples.py [--seeds | --handoff [HOW]]
    HOW: --warp-release | --named-release | --lanes-release [--quads | --one-lane]

Outputs are pre-zeroed: initcheck does not count TMA (async-proxy) stores as initialising
global memory, so a TMA-written output copied to the host would be flagged otherwise.
Exits non-zero if any result is wrong.
"""
from __future__ import annotations

import sys
from pathlib import Path

import numpy as np

import tmaflow as tf
from tmaflow import kernels
from tmaflow.kernels import examples as ex


def main() -> int:
    rng = np.random.default_rng(7)
    bad = []

    def check(name, ok):
        print(f"{name:28s} {'ok' if ok else 'WRONG'}", flush=True)
        if not ok:
            bad.append(name)

    if "--seeds" in sys.argv:
        return seeds(rng, check, bad)
    if "--handoff" in sys.argv:
        return handoff(rng, check, bad)
    h = rng.standard_normal((256, 512)).astype(np.float32)
    x = tf.from_numpy(h)
    out = tf.zeros(h.shape, "float32")
    check("tile_copy", np.array_equal(kernels.copy(x, out).numpy(), h))
    check("transpose", np.array_equal(kernels.transpose(x, tf.zeros(h.shape[::-1])).numpy(), h.T))
    s = kernels.softmax(x, tf.zeros(h.shape)).numpy()
    ref = np.exp(h - h.max(1, keepdims=True))
    check("softmax", np.allclose(s, ref / ref.sum(1, keepdims=True), rtol=1e-4, atol=1e-7))
    parts = rng.standard_normal((3, 64, 128)).astype(np.float32)
    acc = tf.zeros((64, 128), "float32")
    check("reduce_add", np.allclose(kernels.reduce_add(tf.from_numpy(parts), acc).numpy(),
                                    parts.sum(0), atol=1e-5))
    xb = rng.standard_normal((4 * 32, 256)).astype(np.float32)
    wb = rng.standard_normal((8 * 32, 256)).astype(np.float32)
    for cluster in (1, 2, 4):
        o = kernels.broadcast_scale(tf.from_numpy(xb), tf.from_numpy(wb), tf.zeros(xb.shape),
                                    cluster=cluster).numpy()
        check(f"broadcast cluster={cluster}", np.allclose(o, ex.broadcast_reference(xb, wb), rtol=1e-4, atol=1e-4))
    v = rng.standard_normal(4096 * 8).astype(np.float32)
    for method in ("ldgsts", "tma"):
        o = kernels.axpb(tf.from_numpy(v), 2.0, 1.0, tf.zeros(v.shape), method=method).numpy()
        check(f"axpb {method}", np.allclose(o, 2 * v + 1))
    from tmaflow.dtypes import bf16_bits, bf16_to_float32
    from tmaflow.kernels.matmul import GemmConfig
    for layout, cfg in (("nt", GemmConfig()), ("nn", GemmConfig(bn=128, cluster_m=1)),
                        ("nt", GemmConfig(bn=128, cluster_m=1, split_k=3))):
        bits = [bf16_bits(rng.standard_normal(shape))
                for shape in ((300, 384), (264, 384) if layout == "nt" else (384, 264))]
        av, bv = [bf16_to_float32(x).astype(np.float64) for x in bits]
        ref = av @ (bv.T if layout == "nt" else bv)
        out = tf.zeros((300, 264), "bfloat16")
        kernels.gemm(tf.from_numpy(bits[0], dtype="bfloat16"), tf.from_numpy(bits[1], dtype="bfloat16"),
                     out, layout=layout, config=cfg)
        got = bf16_to_float32(out.numpy())
        check(f"gemm {layout} bn{cfg.bn} k{cfg.split_k}", np.linalg.norm(got - ref) / np.linalg.norm(ref) < 1e-2)
    print(f"{len(bad)} wrong" if bad else "all results correct")
    return 1 if bad else 0


def seeds(rng, check, bad) -> int:
    text = (Path(__file__).resolve().parents[1] / "tests" / "kernels" / "seeds.cu").read_text()
    seeds = lambda name, **kw: tf.Kernel(text, name, filename="seeds.cu", **kw)  # noqa: E731
    blocks, threads, batches = 4, 64, 3
    n = blocks * threads * batches
    data = rng.integers(-100, 100, n).astype(np.int32)
    want = (2 * np.roll(data.reshape(batches, blocks, threads), -1, 2) + 1).ravel()
    for name in ("with_barrier", "with_single_stage", "with_staging", "with_memcpy_async"):
        o = tf.zeros(n, "int32")
        seeds(name).launch(o, tf.from_numpy(data), n, batches, grid=blocks, block=threads,
                           smem=threads * 8)
        check(name, np.array_equal(o.numpy(), want))
    ints = rng.integers(-100, 100, 4096).astype(np.int32)
    d = tf.from_numpy(ints)
    seeds("add_one_kernel").launch(d, 1024, grid=1, block=128)
    w = ints.copy()
    w[1024:2048] += 1
    check("add_one_kernel", np.array_equal(d.numpy(), w))
    o = tf.zeros(4, "int32")
    seeds("dsmem_kernel").launch(o, grid=4, block=32)
    check("dsmem_kernel", (o.numpy() == 2).all())
    print(f"{len(bad)} wrong" if bad else "all results correct")
    return 1 if bad else 0


def handoff(rng, check, bad) -> int:
    """tests/kernels/probe.cu's cp_async_noinc_handoff: does racecheck model a cp.async
    arrival on an mbarrier (the row-major block-scale gather's hand-off)? With --lanes-release,
    cp_async_lanes_handoff: the GEMM's hand-off in clusters of 2, released as gemm.cu releases it
    (every lane on its own CTA; --quads: one reading lane per quad; --one-lane: the warp release)."""
    text = (Path(__file__).resolve().parents[1] / "tests" / "kernels" / "probe.cu").read_text()
    rounds = 8
    if "--lanes-release" in sys.argv:
        release = 2 if "--quads" in sys.argv else 0 if "--one-lane" in sys.argv else 1  # gemm.cu's SCALE_RELEASE
        kernel = tf.Kernel(text, "cp_async_lanes_handoff", filename="probe.cu")
        src = rng.standard_normal((2, rounds, 32)).astype(np.float32)
        out = tf.zeros((2, 2, rounds, 32), "float32")
        kernel.launch(tf.from_numpy(src), out, rounds, release, grid=2, block=96, cluster=(2, 1, 1))
        want = np.broadcast_to(src[:, None], out.shape)  # each CTA's two consumer warps read its rounds
        check(f"cp_async_lanes_handoff release={release}", np.array_equal(out.numpy(), want))
        print(f"{len(bad)} wrong" if bad else "all results correct")
        return 1 if bad else 0
    kernel = tf.Kernel(text, "cp_async_noinc_handoff", filename="probe.cu")
    # 0: every lane releases; 1: one lane after __syncwarp; 2: one lane after a named barrier
    warp_release = 2 if "--named-release" in sys.argv else int("--warp-release" in sys.argv)
    src = rng.standard_normal(rounds * 32).astype(np.float32)
    out = tf.zeros(rounds * 32, "float32")
    kernel.launch(tf.from_numpy(src), out, rounds, warp_release, grid=1, block=64)
    check(f"cp_async_noinc_handoff warp_release={warp_release}", np.array_equal(out.numpy(), src))
    print(f"{len(bad)} wrong" if bad else "all results correct")
    return 1 if bad else 0


if __name__ == "__main__":
    raise SystemExit(main())
