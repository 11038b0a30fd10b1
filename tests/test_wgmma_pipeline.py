"""Every tensor-core kernel tmaflow ships compiles without ptxas serializing its wgmma or
injecting waits (its C75xx notes; tmaflow warns on them at compile time). A change that makes
ptxas serialize the GEMM or attention pipelines costs 20-40% on the GPU with correct results,
so it is caught here, on the CPU."""
from dataclasses import replace

import pytest

from tmaflow.launch import compiler
from tmaflow.kernels.attention_entry import attention_kernel, attention_plan
from tmaflow.kernels.matmul import GemmConfig, SkinnyConfig, gemm_plan, skinny_plan
from tmaflow.kernels.registry import get_kernel


def _gemm(dtype, config, extra=None, block_scales=None):
    plan = gemm_plan(4096, 4096, 4096, "nt", config, dtype, block_scales)
    return get_kernel("gemm_bf16", plan.layout, defines=dict(plan.defines, **(extra or {})), file="gemm")


def _skinny(m, config, block_scales=None, dtype="float8_e4m3fn"):
    plan = skinny_plan(m, 4096, 4096, config, 132, dtype, block_scales)
    return get_kernel("gemm_skinny_bf16", plan.layout, defines=plan.defines, file="skinny")


KERNELS = {
    "gemm bf16 256": lambda: _gemm("bfloat16", GemmConfig()),
    "gemm bf16 128 split-K": lambda: _gemm("bfloat16", GemmConfig(bn=128, cluster_m=1, split_k=2)),
    "gemm bf16 192": lambda: _gemm("bfloat16", GemmConfig(bn=192, cluster_m=1, epi_cols=64)),
    "gemm bf16 64": lambda: _gemm("bfloat16", GemmConfig(bn=64, cluster_m=1, epi_cols=64)),
    "gemm bf16 grouped": lambda: _gemm("bfloat16", GemmConfig(), {"GROUPED": 1}),
    **{f"gemm bf16 {bn} cluster-K {ck}": (lambda bn=bn, ck=ck: _gemm("bfloat16", GemmConfig(
        bn=bn, cluster_m=1, cluster_k=ck, epi_cols=64)))
       for bn in (64, 128, 256) for ck in (2, 4)},
    **{f"gemm bf16 {bn} c{cm}": (lambda bn=bn, cm=cm: _gemm("bfloat16", GemmConfig(bn=bn, cluster_m=cm, epi_cols=64)))
       for bn, cm in ((80, 2), (96, 1), (112, 2), (144, 1), (160, 2), (176, 1), (208, 2), (224, 1), (240, 2))},
    "gemm bf16 160 split-K": lambda: _gemm("bfloat16", GemmConfig(bn=160, cluster_m=1, epi_cols=64, split_k=2)),
    "gemm bf16 240 cluster-K 4": lambda: _gemm("bfloat16", GemmConfig(bn=240, cluster_m=1, cluster_k=4, epi_cols=64)),
    "gemm fp8 promoted": lambda: _gemm("float8_e4m3fn", GemmConfig(bn=128)),
    "gemm fp8 fast 256": lambda: _gemm("float8_e4m3fn", GemmConfig(bn=256, promote=0)),
    "gemm fp8 promoted 192": lambda: _gemm("float8_e4m3fn", GemmConfig(bn=192, cluster_m=1, epi_cols=64)),
    **{f"gemm fp8 block scales {mode}": (lambda mode=mode: _gemm("float8_e4m3fn", GemmConfig(bn=128, promote=1),
                                                                block_scales=mode))
       for mode in ("row_major", "m_major")},
    **{f"gemm fp8 block scales row_major {name}": (lambda fields=fields, extra=extra: _gemm(
        "float8_e4m3fn", GemmConfig(bn=128, promote=1, **fields), extra, block_scales="row_major"))
       for name, fields, extra in [("c1", dict(cluster_m=1), None), ("split-K", dict(split_k=2), None),
                                   ("c1 split-K", dict(cluster_m=1, split_k=3), None),
                                   ("tail split", dict(split_tail=True), None),
                                   ("release warp", {}, {"SCALE_RELEASE": 0}),
                                   ("release quads", {}, {"SCALE_RELEASE": 2})]},
    "gemm fp8 block scales m_major c1": lambda: _gemm("float8_e4m3fn", GemmConfig(bn=128, promote=1, cluster_m=1),
                                                      block_scales="m_major"),
    # row-major scale_a in the per-stage box (scale_ring=False; the ring is the default)
    **{f"skinny fp8 block scales {mode} M={m} {name}": (lambda m=m, cfg=cfg, mode=mode: get_kernel(
        "gemm_skinny_bf16", skinny_plan(m, 4096, 4096, cfg, 132, "float8_e4m3fn", mode).layout,
        defines=skinny_plan(m, 4096, 4096, cfg, 132, "float8_e4m3fn", mode).defines, file="skinny"))
       for m, name, cfg in [(16, "rows64", SkinnyConfig(scale_ring=False)),
                            (128, "rows128 c2", SkinnyConfig(rows=128, cluster=2, scale_ring=False))]
       for mode in ("m_major", "row_major")},
    "skinny fp8 block scales row_major M=1": lambda: _skinny(1, SkinnyConfig(scale_ring=False), "row_major"),
    # row-major scale boxes in a ring of their own, the default (K splits are a launch argument:
    # the same builds)
    **{f"skinny fp8 block scales row_major ring M={m} {name}": (lambda m=m, cfg=cfg: _skinny(m, cfg, "row_major"))
       for m in (1, 16, 64, 128)
       for name, cfg in [("rows64", SkinnyConfig()),
                         ("rows128 c2", SkinnyConfig(rows=128, cluster=2, scale_ring=True))]},
    **{f"skinny M={m}": (lambda m=m: get_kernel("gemm_skinny_bf16", skinny_plan(m, 4096, 4096, SkinnyConfig(), 132).layout,
                                                defines=skinny_plan(m, 4096, 4096, SkinnyConfig(), 132).defines,
                                                file="skinny"))
       for m in (1, 16, 128)},
    **{f"attention{' fp16' if fp16 else ''} d{d}{' causal' if c else ''}": (
        lambda d=d, c=c, fp16=fp16: attention_kernel(attention_plan(d, bool(c)), "float16" if fp16 else "bfloat16"))
       for d in (64, 128, 256) for c in (0, 1) for fp16 in (0, 1)},
    **{f"attention varlen d{d}/{dv}{' causal' if c else ''}": (
        lambda d=d, dv=dv, c=c: attention_kernel(attention_plan(d, bool(c), dv, varlen=True), "bfloat16"))
       for d, dv in ((128, 128), (96, 96), (192, 128)) for c in (0, 1)},
}


@pytest.mark.parametrize("name", list(KERNELS))
def test_no_wgmma_serialization_notes(name):
    kernel = KERNELS[name]()
    notes = compiler.wgmma_pipeline_notes(kernel.program.log)
    assert notes == [], (name, notes)
    assert kernel.resources.spills == 0, (name, kernel.resources)


def _mma_loop(kernel) -> list[str]:
    """The innermost SASS loop that issues wgmma (the k-loop)."""
    from tmaflow.launch.sass import sass_loops

    return next(body for body in sass_loops(kernel.sass()) if any("GMMA" in t for t in body))


@pytest.mark.parametrize("dtype, config, block_scales", [
    ("bfloat16", GemmConfig(bn=256), None),
    ("float8_e4m3fn", GemmConfig(bn=128), None),
    ("float8_e4m3fn", GemmConfig(bn=128, epi_cols=64, promote=1), "m_major"),
])
def test_cluster_release_adds_no_loop_bloat(dtype, config, block_scales):
    """In clusters of two each consumer warp releases a stage in both CTAs. A release looping
    over all 16 possible ranks unrolled into 16 predicated arrivals and pushed the descriptors
    out of uniform registers: the fp8 block-scaled k-loop grew from 233 to 457 instructions and
    ran 16% slower on H200. The clustered k-loop must stay within a few instructions of the
    unclustered one."""
    alone = _mma_loop(_gemm(dtype, replace(config, cluster_m=1), block_scales=block_scales))
    paired = _mma_loop(_gemm(dtype, replace(config, cluster_m=2), block_scales=block_scales))
    assert len(paired) <= len(alone) + 8, (len(alone), len(paired))
    moves = [sum(t.startswith("R2UR") for t in body) for body in (alone, paired)]
    assert moves[1] <= moves[0] + 1, moves  # vector-to-uniform moves: descriptors left uniform registers


def _opcodes(kernel) -> set[str]:
    """The SASS opcodes (without modifiers) of a kernel."""
    import re

    found = (re.search(r"\*/\s+(?:@!?U?P\w+\s+)?([A-Z][A-Z0-9_]+)", line) for line in kernel.sass().splitlines())
    return {m.group(1) for m in found if m}


@pytest.mark.parametrize("bn", [64, 128, 256])
@pytest.mark.parametrize("ck", [2, 4])
def test_cluster_k_keeps_the_k_loop_and_the_partials_in_the_cluster(bn, ck):
    """Cluster K-splits send warps down different paths by epilogue group. With the group taken
    from threadIdx.x alone, ptxas could not prove it warp-uniform: the k-loop kept its stage
    cursor in vector registers and moved all 8 descriptors into uniform ones every k-block (70
    instructions against 63 unsplit). Through a shuffle it stays within 4 of the unsplit loop.
    The partials travel by st.async into the owners' shared memory: no global load, store or
    atomic in the kernel (split-K's partials and counters go through global memory)."""
    alone = _mma_loop(_gemm("bfloat16", GemmConfig(bn=bn, cluster_m=1, epi_cols=64)))
    kernel = _gemm("bfloat16", GemmConfig(bn=bn, cluster_m=1, cluster_k=ck, epi_cols=64))
    split = _mma_loop(kernel)
    assert len(split) <= len(alone) + 4, (len(alone), len(split))
    moves = [sum(t.startswith("R2UR") for t in body) for body in (alone, split)]
    assert moves[1] <= moves[0], moves
    ops = _opcodes(kernel)
    assert "STAS" in ops and not ops & {"STG", "LDG", "ATOMG", "REDG", "ATOM", "RED"}, sorted(ops)
    assert {"STG", "ATOMG"} <= _opcodes(_gemm("bfloat16", GemmConfig(bn=bn, cluster_m=1, epi_cols=64, split_k=2)))


@pytest.mark.parametrize("bn", [96, 160, 240])
def test_odd_width_keeps_the_k_loop_and_stores_its_last_columns_apart(bn):
    """A width that is no multiple of 64 runs the same k-loop as the next multiple of 64 (one
    wgmma of N = bn per k-step) and stores a tile in one more round than its whole 64-column
    boxes take: a tensor-map store more than the kernel of bn - bn % 64 columns."""
    def stores(kernel):
        return sum("UTMASTG" in line for line in kernel.sass().splitlines())

    config = GemmConfig(bn=bn, cluster_m=1, epi_cols=64)
    near = _mma_loop(_gemm("bfloat16", replace(config, bn=bn - bn % 64 + 64)))
    kernel = _gemm("bfloat16", config)
    loop = _mma_loop(kernel)
    assert len(loop) <= len(near) + 2, (len(near), len(loop))
    assert sum(f"64x{bn}x16" in t for t in loop) == 4 and not any("GMMA" in t and f"64x{bn}x16" not in t for t in loop)
    assert stores(kernel) == stores(_gemm("bfloat16", replace(config, bn=bn - bn % 64))) + 1


def _arrivals(loop: list[str]) -> tuple[list[str], list[str]]:
    """The k-loop's arrivals on this CTA's barriers and on other CTAs' (SYNCS ... .RED)."""
    arrive = [t for t in loop if "SYNCS.ARRIVE" in t]
    return [t for t in arrive if ".RED" not in t], [t for t in arrive if ".RED" in t]


@pytest.mark.parametrize("cm", [1, 2])
def test_gathered_scales_are_released_by_every_lane(cm):
    """Row-major block scales: every consumer lane reads them with ld.shared after warp 1's
    cp.async, so every lane arrives on its own CTA's empty barrier (racecheck credits a release
    only to the thread that makes it); the other CTA of a cluster gets one arrival per warp. Per
    k-block (the loop holds two): one unpredicated local SYNCS.ARRIVE for the whole warp and, in
    clusters, one predicated remote one; the warp release before (SCALE_RELEASE=0) had a single
    predicated arrival. The lane release costs no uniform registers (an unprovable `peer_mask
    != 0` branch around __syncwarp once cost 32 R2UR moves and 56 instructions)."""
    config = GemmConfig(bn=128, promote=1, cluster_m=cm)
    lanes = _mma_loop(_gemm("float8_e4m3fn", config, block_scales="row_major"))
    warp = _mma_loop(_gemm("float8_e4m3fn", config, {"SCALE_RELEASE": 0}, block_scales="row_major"))
    local, remote = _arrivals(lanes)
    assert len(local) == 2 and not any(t.startswith("@") for t in local), local
    assert len(remote) == (2 if cm == 2 else 0) and all(t.startswith("@") for t in remote), remote
    local, remote = _arrivals(warp)
    assert len(local + remote) == 2 and all(t.startswith("@") for t in local + remote), local + remote
    # NVRTC 13.5: 227 against 224 instructions in clusters of two; 13.0 (the GPU image's): 230 / 221
    assert len(lanes) <= len(warp) + 12, (len(lanes), len(warp))
    assert sum(t.startswith("R2UR") for t in lanes) <= sum(t.startswith("R2UR") for t in warp)


@pytest.mark.parametrize("m,config", [(16, SkinnyConfig()), (64, SkinnyConfig()), (128, SkinnyConfig(rows=128, cluster=2))])
def test_scale_ring_keeps_the_skinny_k_loop_uniform(m, config):
    """The scale ring's consumer adds a wait at a group's first k-block and a release after its
    last to the retire step (M = 16: the two-set k-loop 142 -> 175 instructions); its
    descriptors must stay in uniform registers (no more R2UR than the per-stage box's loop)."""
    box = _mma_loop(_skinny(m, replace(config, scale_ring=False), "row_major"))
    ring = _mma_loop(_skinny(m, config, "row_major"))  # the default: the ring
    assert len(ring) <= len(box) + 48, (len(box), len(ring))
    moves = [sum(t.startswith("R2UR") for t in body) for body in (box, ring)]
    assert moves[1] <= moves[0], moves
