"""GPU tier: tf.reference.tma_store against the hardware, byte for byte over whole allocations.

A randomized sweep of TMA stores (1/2/4/8-byte types, ranks 1-5, every swizzle, element
strides, rows mostly not a multiple of 16 B, boxes hanging off the tensor, extent-1 dims with
any stride, interleaved rows), each into its own tensor with a poisoned guard region on both
sides: the elements, the spill past each row's end and everything the store must not touch
are compared together. Stores are launched in batches with one synchronize per batch."""
import json
import os
import warnings

import numpy as np
import pytest

import tmaflow as tf
from kernel_sources import source
from tmaflow.tma.reference import tma_store
from tmaflow.tma.spec import TensorMapSpec

pytestmark = pytest.mark.gpu

STORES = int(os.environ.get("TMAFLOW_STORE_SWEEP", "6000"))
BATCH = 500
GUARD = 128                      # poisoned bytes before each tensor, at least as many after
MAX_IMAGE = 32 * 1024            # shared-memory bytes one box may take
SMEM = MAX_IMAGE + 896 + 1024    # the box, its largest base offset, the kernel's alignment
TYPES = {1: ("uint8",), 2: ("uint16", "bfloat16", "float16"), 4: ("int32", "float32", "uint32"),
         8: ("int64", "float64", "uint64")}
SWIZZLES = ("none", "32B", "64B", "128B")
INNER_BOX_BYTES = {"none": 256, "32B": 32, "64B": 64, "128B": 128}
# strides of extent-1 dims as torch makes them (0 after expand, anything after unsqueeze or
# slicing) and ones the driver would refuse: the map encodes a legal stand-in
ODD_STRIDES = (0, 4, 8, 40, 2**41, -16, 4096)


def _draw(rng):
    """One store: a tensor layout, a box, options and coordinates (row-major)."""
    E = int(rng.choice([1, 2, 4, 8]))
    q = 16 // E                                   # elements per 16-byte granule
    swizzle = str(rng.choice(SWIZZLES))
    rank = int(rng.integers(1, 6))
    box_inner = q * int(rng.integers(1, INNER_BOX_BYTES[swizzle] // 16 + 1))
    width = int(rng.integers(1, 2 * box_inner + q + 1))
    if width % q == 0 and rng.random() < 0.8:
        width += 1                                # rows not a multiple of 16 B, mostly
    outer = rank - 1
    shape = [1 if rng.random() < 0.15 else int(rng.integers(2, 7)) for _ in range(outer)]
    box = [int(rng.integers(1, 9)) for _ in range(outer)] + [box_inner]
    estrides = [int(rng.integers(2, 4)) if rng.random() < 0.3 else 1 for _ in range(outer)]
    estrides.append(2 if rng.random() < 0.1 else 1)  # ignored by the hardware
    strides = [0] * outer + [E]
    row = width * E
    reach = row
    stepping = [d for d in rng.permutation(outer) if shape[d] > 1]  # memory order, inner first
    if len(stepping) >= 2 and rng.random() < 0.25:
        # an interleaved pair: rows at 0, 32u, 64u and 0, 48u fall between each other's
        a, b, *stepping = stepping
        u = -(-row // 16)
        shape[a], shape[b], strides[a], strides[b] = 3, 2, 32 * u, 48 * u
        reach = 112 * u + row
    interleaved = reach != row
    for d in stepping:
        strides[d] = -(-reach // 16) * 16 + 16 * int(rng.integers(0, 3))
        reach += strides[d] * (shape[d] - 1)
    for d in range(outer):
        if shape[d] == 1:
            strides[d] = int(rng.choice(ODD_STRIDES))
    shape.append(width)
    coords = [int(rng.integers(0, n)) if rng.random() < 0.9 else int(rng.integers(n, n + 3))
              for n in shape[:-1]]
    granules = -(-row // 16)
    coords.append(q * int(rng.integers(0, granules) if rng.random() < 0.95 else granules))
    return dict(dtype=str(rng.choice(TYPES[E])), shape=tuple(shape), strides=tuple(strides),
                box=tuple(box), element_strides=tuple(estrides), swizzle=swizzle,
                coords=tuple(coords), base_offset=128 * int(rng.integers(0, 8)), interleaved=interleaved)


FIXED = [  # the hand-worked cases of tests/test_reference.py
    dict(dtype="int32", shape=(5,), strides=(4,), box=(16,), element_strides=(1,), swizzle="none",
         coords=(0,), base_offset=0),
    dict(dtype="int32", shape=(4, 5), strides=(32, 4), box=(4, 8), element_strides=(1, 1),
         swizzle="none", coords=(0, 0), base_offset=0),
    dict(dtype="uint8", shape=(8, 100), strides=(128, 1), box=(8, 128), element_strides=(1, 1),
         swizzle="128B", coords=(0, 0), base_offset=256),
    dict(dtype="int32", shape=(7, 5), strides=(32, 4), box=(6, 8), element_strides=(2, 1),
         swizzle="none", coords=(1, 0), base_offset=0),
    dict(dtype="float32", shape=(1, 3, 1), strides=(0, 16, 0), box=(1, 2, 4),
         element_strides=(1, 1, 1), swizzle="none", coords=(0, 1, 0), base_offset=0),
]


def _spec(case):
    return TensorMapSpec.tiled(case["dtype"], case["shape"], case["box"], strides=case["strides"],
                               element_strides=case["element_strides"], swizzle=case["swizzle"])


def _cases(rng, n):
    out = []
    while len(out) < n:
        case = _draw(rng)
        try:
            if _spec(case).smem_bytes <= MAX_IMAGE:
                out.append(case)
        except tf.TensorMapError:  # a box past the smem footprint limit: draw again
            pass
    return out


def _span(case):
    """Bytes from the tensor's first element to the end of its last row's last granule."""
    E = tf.as_dtype(case["dtype"]).itemsize
    last = sum((n - 1) * s for n, s in zip(case["shape"][:-1], case["strides"]) if n > 1)
    return last + -(-case["shape"][-1] * E // 16) * 16


def _run_batch(k, cases, rng):
    """Store every case through the hardware into one poisoned arena; return (poison, got,
    shared addresses, tensor offsets, images, specs)."""
    starts, at = [], 0
    for case in cases:
        starts.append(at)
        at += -(-(GUARD + _span(case) + GUARD) // 256) * 256
    poison = rng.integers(0, 256, size=at, dtype=np.uint8)
    arena = tf.from_numpy(poison)
    specs = [_spec(c) for c in cases]
    image_at = np.cumsum([0] + [s.smem_bytes for s in specs])
    images = rng.integers(0, 256, size=int(image_at[-1]), dtype=np.uint8)
    image_hash = hash(images.tobytes())
    dev_images = tf.from_numpy(images)
    coords = np.zeros((len(cases), 5), np.int32)
    for i, case in enumerate(cases):
        coords[i, :len(case["coords"])] = case["coords"][::-1]  # the driver's order
    dev_coords = tf.from_numpy(coords)
    addr = tf.empty(len(cases), "uint32")
    maps = []
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", tf.TmaflowWarning)  # the spill is what is tested
        for i, case in enumerate(cases):
            view = tf.DeviceArray(arena.ptr + starts[i] + GUARD, case["shape"], case["dtype"],
                                  strides=case["strides"], owner=arena)
            tmap = tf.TensorMap.tiled(view, case["box"], element_strides=case["element_strides"],
                                      swizzle=case["swizzle"])
            maps.append(tmap)
            k.launch(tmap, dev_images.ptr + int(image_at[i]), addr.ptr + 4 * i, dev_coords.ptr + 20 * i,
                     len(case["shape"]), case["base_offset"], tmap.spec.smem_bytes,
                     grid=1, block=128, smem=SMEM)
    got = arena.numpy()  # the one synchronize of the batch
    if hash(images.tobytes()) != image_hash:
        raise AssertionError("the host copy of the shared-memory images changed after the upload "
                             "(host memory written by something else in this process)")
    return poison, got, addr.numpy(), starts, [images[image_at[i]:image_at[i + 1]] for i in
                                               range(len(cases))], [m.spec for m in maps]


def _model(poison, case, spec, start, image, smem_base):
    """The whole arena as the model says the store leaves it: elements written into a copy of
    the tensor, the reported spill applied byte range by byte range."""
    want = poison.copy()
    host = np.dtype(f"u{spec.dtype.itemsize}")
    base = start + GUARD
    view = np.ndarray(case["shape"], host, buffer=want, offset=base, strides=case["strides"])
    tensor = view.copy()  # its own memory: the model reports the spill rather than writing it
    spills = tma_store(tensor, spec, case["coords"], image, smem_base=int(smem_base))
    view[...] = tensor
    for spill in spills:
        want[base + spill.offset:base + spill.offset + len(spill.data)] = np.frombuffer(spill.data, np.uint8)
    return want, sum(len(s.data) for s in spills)


def test_tma_store_model_is_byte_exact_with_spill(device, rng):
    k = tf.Kernel(source("probe"), "tma_store_probe", filename="probe.cu")
    failures, seen = [], {"stores": 0, "spill_bytes": 0, "stores_that_spill": 0,
                          "element_strides": 0, "extent_one_dims": 0, "interleaved": 0}
    seen_kinds = set()
    todo = list(FIXED) + _cases(rng, max(0, STORES - len(FIXED)))
    for lo in range(0, len(todo), BATCH):
        cases = todo[lo:lo + BATCH]
        poison, got, addrs, starts, images, specs = _run_batch(k, cases, rng)
        for i, case in enumerate(cases):
            want, spilled = _model(poison, case, specs[i], starts[i], images[i], addrs[i])
            region = slice(starts[i], starts[i + 1] if i + 1 < len(cases) else got.size)
            seen["stores"] += 1
            seen["spill_bytes"] += spilled
            seen["stores_that_spill"] += spilled > 0
            seen["element_strides"] += any(e > 1 for e in case["element_strides"][:-1])
            seen["extent_one_dims"] += 1 in case["shape"][:-1]
            seen["interleaved"] += case.get("interleaved", False)
            seen_kinds.add((specs[i].dtype.itemsize, case["swizzle"], len(case["shape"])))
            bad = np.flatnonzero(got[region] != want[region])
            if bad.size:
                rel = bad - GUARD
                again, _ = _model(poison, case, specs[i], starts[i], images[i], addrs[i])
                failures.append({**case, "smem_base": int(addrs[i]), "bytes_differ": int(bad.size),
                                 "spill_bytes": spilled, "first_offsets": rel[:8].tolist(),
                                 "got": got[region][bad[:8]].tolist(), "want": want[region][bad[:8]].tolist(),
                                 # to tell a host-side model difference from a device one
                                 "poison": poison[region][bad[:8]].tolist(),
                                 "model_again": again[region][bad[:8]].tolist(),
                                 "image": images[i].tolist() if images[i].size <= 1 << 16 else None})
    summary = {**seen, "failures": len(failures)}
    print("store model sweep", summary)
    out = os.environ.get("TMAFLOW_REPORT_DIR")
    if out:
        with open(os.path.join(out, "store_model.json"), "w") as f:
            json.dump({"summary": summary, "failures": failures[:100]}, f, indent=1)
    assert not failures, (f"{len(failures)} of {seen['stores']} stores differ from the model "
                          f"(offsets from the tensor's first element); first ones:\n"
                          + "\n".join(json.dumps(f) for f in failures[:5]))
    assert seen["stores"] >= STORES
    assert seen["stores_that_spill"] > STORES // 4 and seen["element_strides"] > STORES // 10
    assert seen["extent_one_dims"] > STORES // 20 and seen["interleaved"] > STORES // 50
    assert {(E, s, r) for E in (1, 2, 4, 8) for s in SWIZZLES for r in range(1, 6)} <= seen_kinds
