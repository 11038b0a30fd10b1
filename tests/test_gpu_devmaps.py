"""GPU tier: tensor maps patched on the device (issue 14's groundwork). A template encoded on
the host is patched per group (address, rows, row pitch) and published to a workspace slot;
each slot equals the host's encode of the same parameters byte for byte, and TMA copies
through the slots (published by an earlier launch, or by the same CTA just before) land the
right data."""
import numpy as np
import pytest

import tmaflow as tf
from kernel_sources import source
from tmaflow.testing import poison

pytestmark = pytest.mark.gpu

COLS, BOX = 96, (8, 32)


def groups(rng):
    """Four arrays of different rows and row pitch (padded views), as (host values, view)."""
    out = []
    for rows, pad in ((40, 0), (17, 32), (64, 8), (9, 4)):
        host = rng.standard_normal((rows, COLS + pad)).astype(np.float32)
        parent = tf.from_numpy(host)
        view = tf.DeviceArray(parent.ptr, (rows, COLS), "float32", strides=((COLS + pad) * 4, 4),
                              owner=parent) if pad else parent
        out.append((host[:, :COLS], view, parent))
    return out


def tables(views):
    addrs = tf.from_numpy(np.array([v.ptr for v in views], np.uint64))
    rows = tf.from_numpy(np.array([v.shape[0] for v in views], np.uint32))
    pitches = tf.from_numpy(np.array([v.strides[0] for v in views], np.uint64))
    return addrs, rows, pitches


def setup(rng):
    """(groups, their views, the template map, a workspace of a slot per group, the tables)."""
    arrays = groups(rng)
    views = [v for _, v, _ in arrays]
    template = tf.TensorMap.tiled(tf.zeros((128, COLS), "float32"), BOX)
    return arrays, views, template, tf.DescriptorWorkspace(len(views)), tables(views)


def spec_of(view):
    return tf.TensorMapSpec.tiled("float32", view.shape, BOX, strides=view.strides).with_address(view.ptr)


def test_patched_slots_match_the_host_encode_and_load_the_right_data(device, rng):
    arrays, views, template, ws, (addrs, rows, pitches) = setup(rng)
    k = tf.Kernel(source("devmaps"), "patch_maps", filename="devmaps.cu")
    k.launch(template, ws, addrs, rows, pitches, grid=len(views), block=32)
    for g, view in enumerate(views):
        ws.check(g, spec_of(view))  # byte-exact against cuTensorMapEncodeTiled
    with pytest.raises(tf.TensorMapError, match=r"slot 1: the device-patched map differs .* bytes"):
        ws.check(1, spec_of(views[2]))  # another group's parameters: caught by name
    wrong = tf.Kernel(source("devmaps"), "patch_maps", filename="devmaps.cu", defines={"BUG_WRONG_ROWS": 1})
    wrong.launch(template, ws, addrs, rows, pitches, grid=len(views), block=32)
    ws.check(0, spec_of(views[0]))
    with pytest.raises(tf.TensorMapError, match=r"slot 1: .* in bytes [\d, -]+ \(shape\[0\]\)"):
        ws.check(1, spec_of(views[1]))  # the planted wrong patch, named: the row count
    k.launch(template, ws, addrs, rows, pitches, grid=len(views), block=32)  # patched right again
    load = tf.Kernel(source("devmaps"), "load_slots", filename="devmaps.cu")
    for patch in (0, 1):  # through slots published by the launch before, then by the same CTA
        out = poison(tf.empty((len(views), *BOX), "float32"))
        for x0, y0 in ((0, 0), (64, 8)):  # the second box runs past the short groups' last rows
            load.launch(template, ws, addrs, rows, pitches, out, x0, y0, patch, grid=len(views), block=64)
            got = out.numpy()
            for g, (host, _, _) in enumerate(arrays):
                want = np.zeros(BOX, np.float32)  # out of bounds: zero fill
                part = host[y0:y0 + BOX[0], x0:x0 + BOX[1]]
                want[:part.shape[0], :part.shape[1]] = part
                np.testing.assert_array_equal(got[g], want, err_msg=f"group {g} box ({x0}, {y0}) patch={patch}")


def test_workspace_checks_its_arguments(device):
    with pytest.raises(tf.TmaflowError, match=r"slots=0 must be an int in \[1, 2\^20\]"):
        tf.DescriptorWorkspace(0)
    ws = tf.DescriptorWorkspace(2)
    assert ws.slot(1) - ws.slot(0) == 128 and ws.ptr % 128 == 0
    with pytest.raises(tf.TmaflowError, match=r"slot 2 is not in \[0, 2\)"):
        ws.read(2)


def test_a_missing_acquire_is_named_by_the_flight_recorder(device, rng):
    arrays, views, template, ws, (addrs, rows, pitches) = setup(rng)
    out = tf.empty((len(views), *BOX), "float32")
    good = tf.Kernel(source("devmaps"), "load_slots", filename="devmaps.cu", debug=True, trace="all")
    good.launch(template, ws, addrs, rows, pitches, out, 0, 0, 1, grid=len(views), block=64)
    np.testing.assert_array_equal(out.numpy()[0], arrays[0][0][:BOX[0], :BOX[1]])
    bad = tf.Kernel(source("devmaps"), "load_slots", filename="devmaps.cu", debug=True, trace="all",
                    defines={"BUG_NO_ACQUIRE": 1})
    with pytest.raises(tf.PipelineError, match=r"\[missing-acquire\] CTA 0 warp 0: TMA load .* without "
                                               r"tensormap::acquire"):
        bad.launch(template, ws, addrs, rows, pitches, out, 0, 0, 1, grid=len(views), block=64)
