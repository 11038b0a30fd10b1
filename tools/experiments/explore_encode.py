"""Map cuTensorMapEncodeTiled's acceptance region one field at a time (GPU machine).

    python tools/experiments/explore_encode.py OUT.json

Replays the cases where TensorMapSpec and the driver disagreed (tests/data), mutating one
field at a time, and sweeps the interleave and box-volume rules. Results feed the rules in
tmaflow/tma/spec.py.
"""
from __future__ import annotations

import itertools
import json
import sys

import tmaflow as tf
from tmaflow import driver
from tmaflow.dtypes import BY_NAME
from tmaflow.tensormap import TensorMapSpec

IL = {"none": 0, "16B": 1, "32B": 2}
SW = {"none": 0, "32B": 1, "64B": 2, "128B": 3}
L2 = {"none": 0, "64B": 1, "128B": 2, "256B": 3}


def driver_ok(c) -> bool:
    cu = driver.cu()
    strides = [cu.cuuint64_t(v) for v in reversed(c["strides"][:-1])] or \
        [cu.cuuint64_t(-(-c["shape"][0] * BY_NAME[c["dtype"]].itemsize // 16) * 16)]
    err = cu.cuTensorMapEncodeTiled(
        cu.CUtensorMapDataType(BY_NAME[c["dtype"]].tma_code), len(c["shape"]), c["address"],
        [cu.cuuint64_t(v) for v in reversed(c["shape"])], strides,
        [cu.cuuint32_t(v) for v in reversed(c["box"])],
        [cu.cuuint32_t(v) for v in reversed(c["estrides"])],
        cu.CUtensorMapInterleave(IL[c["interleave"]]), cu.CUtensorMapSwizzle(SW[c["swizzle"]]),
        cu.CUtensorMapL2promotion(L2[c["l2"]]),
        cu.CUtensorMapFloatOOBfill({"zero": 0, "nan": 1}[c["oob"]]))[0]
    return int(err) == 0


def spec_verdict(c):
    try:
        TensorMapSpec.tiled(c["dtype"], c["shape"], c["box"], strides=c["strides"],
                            element_strides=c["estrides"], swizzle=c["swizzle"],
                            interleave=c["interleave"], l2_promotion=c["l2"], oob_fill=c["oob"],
                            address=c["address"])
        return None
    except tf.TensorMapError as exc:
        return str(exc)


def contiguous(shape, itemsize, align=16):
    strides, acc = [itemsize], itemsize * shape[-1]
    for n in reversed(shape[:-1]):
        acc = -(-acc // align) * align
        strides.insert(0, acc)
        acc *= n
    return strides


def main(path):
    base_mem = tf.empty(1 << 24, "uint8")
    base = (base_mem.ptr + 255) // 256 * 256
    rows = []

    def record(tag, c):
        c = dict(c, address=base + c.get("offset", 0))
        c.pop("offset", None)
        rows.append({"tag": tag, "case": c, "driver": driver_ok(c), "tmaflow": spec_verdict(c)})

    # 1. the disagreements seen by the fuzz, each mutated one field at a time
    seen = [
        dict(dtype="float64", shape=[246, 261, 67], box=[62, 45, 36], strides=[150336, 576, 8],
             estrides=[3, 1, 1], swizzle="none", interleave="none", l2="128B", oob="zero", offset=16),
        dict(dtype="float16", shape=[88, 258, 227, 251], box=[16, 47, 20, 32],
             strides=[29985824, 116224, 512, 2], estrides=[1, 3, 1, 1], swizzle="64B",
             interleave="none", l2="64B", oob="zero", offset=0),
        dict(dtype="int16", shape=[117, 298, 67], box=[61, 58, 64], strides=[47712, 160, 2],
             estrides=[1, 1, 1], swizzle="none", interleave="none", l2="none", oob="zero", offset=0),
    ]
    for i, c in enumerate(seen):
        record(f"seen{i}", c)
        r = len(c["shape"])
        record(f"seen{i}:estrides1", dict(c, estrides=[1] * r))
        record(f"seen{i}:l2none", dict(c, l2="none"))
        record(f"seen{i}:swnone", dict(c, swizzle="none"))
        record(f"seen{i}:offset0", dict(c, offset=0))
        for d in range(r):
            for v in (1, 2, 8, 16, 32, 64, 128, 256):
                box = list(c["box"])
                box[d] = v
                record(f"seen{i}:box{d}={v}", dict(c, box=box))
            shape = list(c["shape"])
            shape[d] = 256
            record(f"seen{i}:shape{d}=256", dict(c, shape=shape,
                                                  strides=contiguous(shape, BY_NAME[c["dtype"]].itemsize)))

    # 2. box volume: float32 rank 3, inner box 32 (128 B)
    for b1, b2 in itertools.product((1, 8, 32, 64, 128, 256), repeat=2):
        shape = [256, 256, 64]
        record(f"volume:{b2}x{b1}x32", dict(dtype="float32", shape=shape, box=[b2, b1, 32],
                                             strides=contiguous(shape, 4), estrides=[1, 1, 1],
                                             swizzle="none", interleave="none", l2="none",
                                             oob="zero", offset=0))
    # the footprint limit exactly at 227 KB, and floor vs ceil of box / element stride:
    # [227, 64, 4] fp32 = 232448 B, [228, 64, 4] = 233472 B; [227, 64, 8] with stride 2 on the
    # outer dim is 113 x 2048 = 231424 B by floor, 114 x 2048 = 233472 B by ceil.
    for tag, box, e0 in (("227KB", [227, 64, 4], 1), ("228KB", [228, 64, 4], 1),
                         ("floor-vs-ceil", [227, 64, 8], 2)):
        shape = [512, 64, 8]
        record(f"footprint:{tag}", dict(dtype="float32", shape=shape, box=box,
                                        strides=contiguous(shape, 4), estrides=[e0, 1, 1],
                                        swizzle="none", interleave="none", l2="none", oob="zero",
                                        offset=0))
    # box vs shape per dim
    for bx, sx in itertools.product((8, 16, 32, 64, 128, 256), (7, 8, 60, 67, 64, 128, 300)):
        shape = [40, sx, 64]
        record(f"boxshape:{bx}/{sx}", dict(dtype="int16", shape=shape, box=[4, bx, 64],
                                           strides=contiguous(shape, 2), estrides=[1, 1, 1],
                                           swizzle="none", interleave="none", l2="none",
                                           oob="zero", offset=0))

    # 3. interleave grid
    for dtype, il, sw, b0, s0, off in itertools.product(
            ("uint8", "uint16", "float32", "float64"), ("16B", "32B"), ("none", "32B", "64B", "128B"),
            (1, 2, 4, 8, 16, 32), (8, 64, 67), (0, 16)):
        shape = [6, 10, s0]
        E = BY_NAME[dtype].itemsize
        record(f"il:{dtype}:{il}:{sw}:b0={b0}:s0={s0}:off={off}",
               dict(dtype=dtype, shape=shape, box=[2, 4, b0], strides=contiguous(shape, E, 32),
                    estrides=[1, 1, 1], swizzle=sw, interleave=il, l2="none", oob="zero",
                    offset=off))

    # 4. l2 promotion x inner box bytes, element strides x box
    for l2, b0 in itertools.product(L2, (8, 16, 32, 64, 128, 256)):
        shape = [16, 16, 256]
        record(f"l2:{l2}:b0={b0}", dict(dtype="float32", shape=shape, box=[4, 4, b0],
                                        strides=contiguous(shape, 4), estrides=[1, 1, 1],
                                        swizzle="none", interleave="none", l2=l2, oob="zero",
                                        offset=0))
    for e, b in itertools.product(range(1, 9), (1, 3, 7, 8, 16, 45, 62, 256)):
        shape = [256, 16, 64]
        record(f"estride:{e}:box={b}", dict(dtype="float32", shape=shape, box=[b, 4, 32],
                                            strides=contiguous(shape, 4), estrides=[e, 1, 1],
                                            swizzle="none", interleave="none", l2="none",
                                            oob="zero", offset=0))
    with open(path, "w") as f:
        json.dump(rows, f)
    bad = [r for r in rows if r["driver"] != (r["tmaflow"] is None)]
    print(f"{len(rows)} cases, {len(bad)} where tmaflow and the driver differ")


if __name__ == "__main__":
    main(sys.argv[1])
