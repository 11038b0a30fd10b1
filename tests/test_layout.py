"""Shared-memory plans: offsets, alignments, totals, tx bytes, masks, arrival counts."""
import re
import types

import pytest

import tmaflow as tf
from tmaflow.tma.spec import TensorMapSpec

A = TensorMapSpec.tiled("bfloat16", (4096, 4096), (128, 64), swizzle="128B")   # 16 KB
B = TensorMapSpec.tiled("bfloat16", (4096, 4096), (256, 64), swizzle="128B")   # 32 KB
SMALL = TensorMapSpec.tiled("float32", (64, 64), (3, 16))                     # 192 B


def test_pipeline_counts():
    p = tf.Pipeline("ab", stages=4, tiles=[A, B], consumers=2)
    assert p.tx_bytes == A.tx_bytes + B.tx_bytes == 48 * 1024
    assert p.full_arrivals == 1 and p.empty_arrivals == 2 and not p.uses_cluster


def test_pipeline_producers_count_on_the_full_barrier():
    """Threads that fill part of a stage themselves (cp.async) add their arrivals to the full
    barrier's count, in the plan and in the generated header."""
    p = tf.Pipeline("ab", stages=2, tiles=[A], consumers=8, producers=33)
    assert p.full_arrivals == 33 and p.empty_arrivals == 8
    assert "constexpr uint32_t full_arrivals = 33;" in tf.SharedLayout([p]).header()
    for bad in (0, 1025, True, 2.0):
        with pytest.raises(tf.LayoutError, match=rf"Pipeline 'ab': producers={bad!r} must be an int in \[1, 1024\]"):
            tf.Pipeline("ab", stages=2, tiles=[A], producers=bad)


@pytest.mark.parametrize("cluster,multicast,peers", [
    ((1, 1, 1), None, 0), ((2, 1, 1), ["x"], 1), ((4, 1, 1), ["x"], 3), ((2, 2, 1), ["x", "y"], 2),
    ((4, 2, 1), ["x", None], 3)])
def test_consumer_lanes_count_only_on_their_own_cta(cluster, multicast, peers):
    """Every lane of a consumer warp releases on its own CTA's barrier, one per warp on each
    other CTA of the release mask: 8 warps x 32 lanes + 8 per peer."""
    tiles = [A, B][:len(multicast)] if multicast else [A]
    p = tf.Pipeline("ab", stages=2, tiles=tiles, consumers=8, cluster=cluster, multicast=multicast,
                    consumer_lanes=32)
    assert p.empty_arrivals == 8 * 32 + 8 * peers
    assert bin(p.release_mask(0)).count("1") == 1 + peers
    one = tf.Pipeline("ab", stages=2, tiles=tiles, consumers=8, cluster=cluster, multicast=multicast)
    assert one.consumer_lanes == 1 and one.empty_arrivals == 8 * (1 + peers)  # as before
    hdr = tf.SharedLayout([p]).header()
    assert f"constexpr uint32_t empty_arrivals = {8 * 32 + 8 * peers};" in hdr
    assert "constexpr uint32_t consumer_lanes = 32;" in hdr


@pytest.mark.parametrize("cluster", [(2, 1, 1), (4, 1, 1), (2, 2, 1), (4, 2, 1)])
def test_generated_peer_mask_is_the_release_mask_without_this_cta(cluster):
    p = tf.Pipeline("ab", stages=2, tiles={"a": A, "b": B}, cluster=cluster, consumer_lanes=32,
                    multicast=["x", "y" if cluster[1] > 1 else None])
    hdr = tf.SharedLayout([p]).header()
    assert "uint32_t peer_mask(uint32_t rank) { return release_mask(rank) & ~(1u << rank); }" in hdr
    # one read of the rank feeds both masks of the device Pipeline
    assert ("const uint32_t r = tmaflow::cluster::rank(); return {" in hdr and
            "ab::empty_arrivals, ab::release_mask(r), ab::peer_mask(r), " in hdr)
    alone = tf.SharedLayout([tf.Pipeline("ab", stages=2, tiles=[A])]).header()
    assert "ab::empty_arrivals, 0, 0, " in alone and "peer_mask(uint32_t) { return 0; }" in alone


def test_consumer_lanes_are_checked():
    for bad in (0, 1025, True, 2.0):
        with pytest.raises(tf.LayoutError, match=rf"Pipeline 'ab': consumer_lanes={bad!r} must be an int in \[1, 1024\]"):
            tf.Pipeline("ab", stages=2, tiles=[A], consumer_lanes=bad)
    with pytest.raises(tf.LayoutError, match=r"consumers=1024 x consumer_lanes=1024 .* make 1048576 arrivals per "
                                             r"phase, over the mbarrier limit of 2\^20-1"):
        tf.Pipeline("ab", stages=2, tiles=[A], consumers=1024, consumer_lanes=1024)


def test_layout_offsets_and_alignment():
    pipe = tf.Pipeline("ab", stages=3, tiles={"a": A, "s": SMALL})
    layout = tf.SharedLayout([tf.Buffer("epi", 100, align=16), pipe, tf.Barrier("done", arrivals=3)])
    off = {p.name: p for p in layout.placements}
    assert off["ab_a"].offset % 1024 == 0 and off["ab_a"].nbytes == 3 * 16384
    assert off["ab_s"].offset % 128 == 0 and off["ab_s"].nbytes == 3 * 256  # 192 B rounded to 128
    assert off["epi"].offset % 16 == 0
    for name in ("ab_full", "ab_empty", "done"):
        assert off[name].offset % 8 == 0
    spans = sorted((p.offset, p.offset + p.nbytes) for p in layout.placements)
    assert all(a[1] <= b[0] for a, b in zip(spans, spans[1:]))  # no overlap
    assert layout.total_bytes == max(e for _, e in spans)
    hdr = layout.header()
    assert "constexpr uint32_t tx_bytes = 16576;" in hdr
    assert (f"ab_a(uint32_t stage, uint32_t box = 0) const {{ return base + {off['ab_a'].offset} + "
            "stage * ab::a_stride + box * ab::a_box_stride;") in hdr
    assert '"done"' in hdr and "tmaflow::Pipeline<3>" in hdr


def test_multicast_masks_and_arrivals_2x2():
    p = tf.Pipeline("ab", stages=4, tiles=[A, B], consumers=2, cluster=(2, 2, 1),
                    multicast=["x", "y"])
    # rank = x + 2 y. Tile a is shared along x (same y), tile b along y (same x).
    assert [p.group_mask(0, r) for r in range(4)] == [0b0011, 0b0011, 0b1100, 0b1100]
    assert [p.group_mask(1, r) for r in range(4)] == [0b0101, 0b1010, 0b0101, 0b1010]
    assert [p.is_leader(0, r) for r in range(4)] == [True, False, True, False]
    assert [p.is_leader(1, r) for r in range(4)] == [True, True, False, False]
    assert p.release_mask(0) == 0b0111 and p.release_mask(3) == 0b1110
    assert p.empty_arrivals == 2 * 3  # consumers x CTAs writing into each CTA
    assert p.tx_bytes == A.tx_bytes + B.tx_bytes  # every CTA receives both tiles


@pytest.mark.parametrize("cluster", [(2, 1, 1), (4, 1, 1), (2, 2, 1), (4, 2, 1), (2, 4, 1), (8, 2, 1), (3, 5, 1)])
def test_generated_mask_expressions_match_the_plan(cluster):
    # The header computes masks from the rank; evaluate its C expressions for every rank.
    import re
    p = tf.Pipeline("ab", stages=2, tiles={"a": A, "b": B, "s": SMALL}, cluster=cluster,
                    multicast=["x", "y" if cluster[1] > 1 else None, None])
    hdr = tf.SharedLayout([p]).header()
    for t, name in enumerate(["a", "b", "s"]):
        expr = re.search(rf"uint16_t {name}_mask\(uint32_t rank\) {{ return uint16_t\((.*)\); }}", hdr).group(1)
        py = re.sub(r"(\d+)u\b", r"\1", expr).replace("/", "//")
        for rank in range(cluster[0] * cluster[1]):
            assert eval(py, {"rank": rank}) & 0xFFFF == p.group_mask(t, rank), (name, rank, expr)


def test_tile_of_several_boxes():
    p = tf.Pipeline("ab", stages=3, tiles={"a": A, "b": (SMALL, 3)})
    assert p.boxes == (1, 3) and p.tx_bytes == A.tx_bytes + 3 * SMALL.tx_bytes
    assert p.box_stride(1) == 256 and p.stage_stride(1) == 768
    layout = tf.SharedLayout([p])
    assert {q.name: q.nbytes for q in layout.placements}["ab_b"] == 3 * 768
    with pytest.raises(tf.LayoutError, match=r"tile 'b' has boxes=0; give \(spec, n\) with n an int in \[1, 16\]"):
        tf.Pipeline("ab", stages=3, tiles={"b": (SMALL, 0)})


def test_multicast_4x1():
    p = tf.Pipeline("w", stages=2, tiles=[A], consumers=4, cluster=(4, 1, 1), multicast=["x"])
    assert all(p.group_mask(0, r) == 0b1111 for r in range(4))
    assert p.empty_arrivals == 16 and p.is_leader(0, 0) and not p.is_leader(0, 3)


@pytest.mark.parametrize("kwargs,msg", [
    (dict(stages=0), r"stages=0 must be an int in \[1, 32\]"),
    (dict(consumers=0), r"consumers=0 must be an int in \[1, 1024\]"),
    (dict(tiles=[]), r"tiles is empty"),
    (dict(multicast=["z"], cluster=(2, 1, 1)), r"multicast\[0\]='z' must be None, 'x' or 'y'"),
    (dict(multicast=["x"]), r"multicast\[0\]='x' but cluster=\(1, 1, 1\) has one CTA along x"),
    (dict(multicast=["x", "x"], cluster=(2, 1, 1)), r"multicast=\('x', 'x'\) has 2 entries for 1 tiles"),
    (dict(cluster=(4, 4, 2)), r"cluster=\(4, 4, 2\) must have at most 16 CTAs"),
    (dict(name="a-b"), r"Pipeline name='a-b' must be a C identifier"),
])
def test_pipeline_errors(kwargs, msg):
    args = dict(name="p", stages=2, tiles=[A])
    args.update(kwargs)
    with pytest.raises(tf.LayoutError, match=msg):
        tf.Pipeline(**args)


def test_stage_over_tx_limit():
    big = TensorMapSpec.tiled("float32", (1024, 1024), (200, 256))  # 200 KB
    with pytest.raises(tf.LayoutError, match=r"one stage carries 1228800 B, over the mbarrier tx-count limit"):
        tf.Pipeline("p", stages=1, tiles=[big] * 6)
    tf.Pipeline("p", stages=1, tiles=[big] * 5)


def test_barrier_limits():
    with pytest.raises(tf.LayoutError, match=r"arrivals=0 must be an int in \[1, 1048575\]"):
        tf.Barrier("b", arrivals=0)
    with pytest.raises(tf.LayoutError, match=r"tx_bytes=1048576 must be an int in \[0, 1048575\]"):
        tf.Barrier("b", tx_bytes=1 << 20)
    tf.Barrier("b", arrivals=(1 << 20) - 1, tx_bytes=(1 << 20) - 1)


def test_layout_over_the_limit_names_every_item():
    with pytest.raises(tf.LayoutError, match=r"(?s)needs 262272 B of shared memory, over the 232448 B.*ab_tile0: 8 x 32768 B"):
        tf.SharedLayout([tf.Pipeline("ab", stages=8, tiles=[B])])
    tf.SharedLayout([tf.Pipeline("ab", stages=6, tiles=[B])])


def test_duplicate_names():
    with pytest.raises(tf.LayoutError, match=r"name 'x' is used twice"):
        tf.SharedLayout([tf.Barrier("x"), tf.Buffer("x", 16)])


def test_layout_header_compiles_into_a_kernel():
    pipe = tf.Pipeline("ab", stages=2, tiles=[A, B], consumers=4, cluster=(2, 1, 1), multicast=[None, "x"])
    layout = tf.SharedLayout([pipe, tf.Barrier("done", tx_bytes=128)])
    src = r'''
    #include "tmaflow_layout.cuh"
    extern "C" __global__ void k(const __grid_constant__ CUtensorMap a, const __grid_constant__ CUtensorMap b) {
      extern __shared__ __align__(1024) uint8_t smem[];
      tmaflow_layout::Smem S(smem);
      auto pipe = S.ab();
      if (threadIdx.x == 0) { pipe.init(); S.done().init(); }
      tmaflow::cluster::sync();
      decltype(pipe)::Cursor c;
      pipe.producer_acquire(c);
      pipe.producer_commit(c);
      tmaflow::tma::load(S.ab_tile0(c.stage), &a, pipe.barrier(c), 0, 0);
      if (tmaflow_layout::ab::tile1_leader(tmaflow::cluster::rank()))
        tmaflow::tma::load_multicast(S.ab_tile1(c.stage), &b, pipe.barrier(c), tmaflow_layout::ab::tile1_mask(tmaflow::cluster::rank()), 0, 0);
      pipe.consumer_wait(c);
      pipe.consumer_release(c);
      S.done().wait(0);
    }'''
    k = tf.Kernel(src, "k", layout=layout)
    assert k.cubin[:4] == b"\x7fELF"


def test_buffer_of_a_spec_takes_its_size_and_alignment():
    spec = tf.TensorMapSpec.tiled("bfloat16", (64, 64), (64, 64), swizzle="128B")
    b = tf.Buffer("tile", spec)
    assert (b.nbytes, b.align) == (spec.smem_bytes, 1024)
    layout = tf.SharedLayout([tf.Buffer("pad", 16), b])
    assert layout.offset("tile") % 1024 == 0
    with pytest.raises(tf.LayoutError, match=r"Buffer 'tile': align=128 is below the 1024 B its 128B box needs"):
        tf.Buffer("tile", spec, align=128)
    with pytest.raises(tf.LayoutError, match=r"Buffer 'x': nbytes=1.5 must be an int"):
        tf.Buffer("x", 1.5)
    assert tf.Buffer("x", 100).align == 128



def test_buffer_count_places_copies_one_stride_apart_under_one_name():
    spec = tf.TensorMapSpec.tiled("float32", (64, 64), (3, 16))  # 192 B, 128 B aligned
    pair = tf.Buffer("tile", spec, count=2)
    assert (pair.nbytes, pair.align, pair.stride, pair.total_bytes) == (192, 128, 256, 448)
    layout = tf.SharedLayout([pair, tf.Buffer("single", 100), tf.Barrier("bar")])
    assert [(p.name, p.offset, p.nbytes) for p in layout.placements] == \
        [("tile", 0, 448), ("single", 512, 100), ("bar", 616, 8)]
    assert "tile: 2 x buffer 192 B" in layout.describe()
    header = layout.header()
    assert "namespace tile { constexpr int count = 2; constexpr uint32_t stride = 256; }" in header
    assert "void* tile(uint32_t i) const { return base + 0 + i * tile::stride; }" in header
    # a single buffer keeps its accessor and gets no namespace
    assert "void* single() const { return base + 512; }" in header
    assert "namespace single" not in header
    src = r'''#include "tmaflow_layout.cuh"
extern "C" __global__ void k(float* out) {
  extern __shared__ __align__(1024) uint8_t smem[];
  tmaflow_layout::Smem S(smem);
  static_assert(tmaflow_layout::tile::count == 2, "count");
  float* t = static_cast<float*>(S.tile(threadIdx.x % tmaflow_layout::tile::count));
  out[threadIdx.x] = t[0] + *static_cast<float*>(S.single());
}'''
    assert tf.Kernel(src, "k", layout=layout).cubin[:4] == b"\x7fELF"


@pytest.mark.parametrize("count", [0, 1025, 1.0, True, "2"])
def test_buffer_count_must_be_an_int_in_range(count):
    with pytest.raises(tf.LayoutError, match=rf"Buffer 'b': count={re.escape(repr(count))} must be "
                       r"an int in \[1, 1024\]"):
        tf.Buffer("b", 64, count=count)


# --- a layout's plan against the launch (Kernel._fit, the rules bind / launcher / launch apply) ---

LAYOUT_SOURCE = '#include "tmaflow_layout.cuh"\nextern "C" __global__ void k() {}'


def fitted(layout, compiled_cluster=(0, 0, 0), **config):
    """The configuration ``Kernel(layout=layout).bind(**config)`` would launch, checked against
    a stand-in for the loaded module (no GPU): no __cluster_dims__ unless given, room for any
    smem."""
    module = types.SimpleNamespace(compiled_cluster=compiled_cluster, max_threads=1024,
                                   ensure_smem=lambda smem: None, allow_non_portable=lambda: None)
    return tf.Kernel(LAYOUT_SOURCE, "k", layout=layout)._fit(tf.LaunchConfig(**config), module)


def multicast_layout(cluster=(2, 1, 1)):
    return tf.SharedLayout([tf.Pipeline("rows", stages=2, tiles=[SMALL]),
                            tf.Pipeline("w", stages=2, tiles=[A], consumers=4, cluster=cluster,
                                        multicast=["x"])])


@pytest.mark.parametrize("cluster", [1, (4, 1, 1), (1, 2, 1)])
def test_launch_with_another_cluster_than_the_plan_is_refused(cluster):
    layout = multicast_layout()
    assert layout.cluster == (2, 1, 1)
    launched = tf.LaunchConfig((4, 2), 128, cluster).cluster
    with pytest.raises(tf.LaunchError, match=rf"k: launched with cluster={re.escape(str(launched))}, "
                       r"but its layout's Pipeline 'w' was planned for cluster=\(2, 1, 1\) .* launch "
                       r"with cluster=\(2, 1, 1\) or plan the Pipeline with cluster="):
        fitted(layout, grid=(4, 2), block=128, cluster=cluster)


def test_launch_with_the_planned_cluster_passes_and_takes_the_layout_size():
    layout = multicast_layout()
    config = fitted(layout, grid=4, block=128, cluster=2)
    assert config.cluster == (2, 1, 1) and config.smem == layout.total_bytes
    # __cluster_dims__ fills in a cluster left out; it is checked against the plan too
    assert fitted(layout, (2, 1, 1), grid=4, block=128).cluster == (2, 1, 1)
    with pytest.raises(tf.LaunchError, match=r"launched with cluster=\(4, 1, 1\), but"):
        fitted(layout, (4, 1, 1), grid=4, block=128)


def test_default_cluster_pipelines_hold_in_any_cluster():
    layout = tf.SharedLayout([tf.Pipeline("rows", stages=2, tiles=[SMALL])])
    assert layout.cluster is None
    assert fitted(layout, grid=4, block=128, cluster=2).cluster == (2, 1, 1)


def test_pipelines_planned_for_two_clusters_are_refused():
    with pytest.raises(tf.LayoutError, match=r"Pipeline 'a' plans cluster=\(2, 1, 1\) but Pipeline "
                       r"'b' plans cluster=\(1, 2, 1\); a launch has one cluster"):
        tf.SharedLayout([tf.Pipeline("a", stages=2, tiles=[SMALL], cluster=(2, 1, 1)),
                         tf.Pipeline("b", stages=2, tiles=[SMALL], cluster=(1, 2, 1))])


def test_smem_below_the_layout_is_refused():
    layout = multicast_layout()
    total = layout.total_bytes
    with pytest.raises(tf.LaunchError, match=rf"k: smem={total - 1} B is below the {total} B its "
                       rf"layout places \(layout.total_bytes\); leave smem out .* smem >= {total}"):
        fitted(layout, grid=2, block=128, cluster=2, smem=total - 1)
    for smem in (total, total + 4096):
        assert fitted(layout, grid=2, block=128, cluster=2, smem=smem).smem == smem
