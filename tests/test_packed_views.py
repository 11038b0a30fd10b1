"""Arrays torch calls contiguous whose extent-1 dims carry other strides (a transpose or
unsqueeze leaves them) are taken as the contiguous arrays they are (no GPU): ``entry.packed``
gives the same bytes under row-major strides; layouts that are not packed still get refused."""
import itertools

import numpy as np
import pytest

from tmaflow import kernels
from tmaflow.dtypes import as_dtype
from tmaflow.errors import TmaflowError
from tmaflow.kernels.entry import packed
from tmaflow.runtime.memory import DeviceArray, _contiguous_strides

from test_streams import current, fake_states  # noqa: F401  (fixtures)

_addresses = itertools.count(1)


def view(shape, strides=None, dtype="bfloat16"):
    """A fake torch-origin device array on its own 1 GiB-aligned range."""
    dt = as_dtype(dtype)
    strides = _contiguous_strides(shape, dt.itemsize) if strides is None else strides
    return DeviceArray._view(next(_addresses) << 30, tuple(shape), dt, tuple(strides), None, None, "torch")


def odd_strides(shape, itemsize, rng):
    """Row-major strides except that every extent-1 dim gets a random (even negative) one."""
    return tuple(int(rng.integers(-2**20, 2**20)) if n == 1 else s
                 for n, s in zip(shape, _contiguous_strides(shape, itemsize)))


def test_packed_rewrites_only_the_strides_of_extent_one_dims(rng):
    for _ in range(200):
        shape = tuple(int(rng.choice([1, 1, 2, 3, 7])) for _ in range(int(rng.integers(1, 5))))
        arr = view(shape, odd_strides(shape, 2, rng))
        got = packed(arr)
        assert got.ptr == arr.ptr and got.shape == arr.shape and got.dtype is arr.dtype
        assert got.strides == _contiguous_strides(shape, 2)
        assert got._alloc is arr._alloc and got.owner is arr.owner


def test_packed_leaves_contiguous_and_unpacked_layouts_alone():
    a = view((2, 3, 4))
    assert packed(a) is a
    b = view((2, 3, 4), (24, 2, 6))  # the last two dims swapped: not packed
    assert packed(b) is b
    c = view((2, 1, 4), (8, 8, 4))   # a dim of 4 with the wrong stride beside an extent-1 dim
    assert packed(c) is c


@pytest.mark.parametrize("which", ["q", "k", "v", "out"])
def test_attention_takes_torch_contiguous_operands_with_odd_unit_strides(fake_states, current, rng, which):
    _, calls = fake_states
    shapes = {"q": (2, 1, 128, 64), "k": (2, 1, 128, 64), "v": (2, 1, 128, 64), "out": (2, 1, 128, 64)}
    args = {name: view(shape) for name, shape in shapes.items()}
    args[which] = view(shapes[which], odd_strides(shapes[which], 2, rng))
    kernels.attention(args["q"], args["k"], args["v"], args["out"])
    assert len(calls) == 1
    bent = view((2, 1, 128, 64), (64, 2 * 128 * 64 * 2, 128, 2))  # batch stride wrong: not packed
    args[which] = bent
    with pytest.raises(TmaflowError, match=rf"{which} must be contiguous"):
        kernels.attention(args["q"], args["k"], args["v"], args["out"])
