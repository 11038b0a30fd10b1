"""Host cost of the entry points' call path on the CPU (issues 30 and 33): every state builder
is replaced by a recorder and every allocation by a fake view, so what is timed is the
Python an entry point runs per call (argument views, options, checks, stream, key, lookup, the
output, the launch arguments). Arrays are tmaflow views at fake addresses, or tensors of a
stand-in ``torch`` module (its types, dtypes, current stream and ``new_empty``). Runs on this
tree or an older checkout (the ae3d113 layout is known), µs per call, best of 3 rounds:

    PYTHONPATH=. python tools/experiments/entry_host_costs.py
    cd /path/to/old/checkout && PYTHONPATH=. python /path/to/tools/experiments/entry_host_costs.py
"""
from __future__ import annotations

import itertools
import sys
import time
import types

import tmaflow  # noqa: F401  (before the stand-in torch: nothing imports the real one)
from tmaflow import kernels
from tmaflow.kernels import attention_entry, entry, examples

try:
    from tmaflow.kernels.matmul import dense, grouped, splitk
    from tmaflow.runtime import device as device_module
    from tmaflow.runtime.memory import DeviceArray, _contiguous_strides
except ImportError:  # ae3d113: one matmul module, runtime modules at the top
    from tmaflow import device as device_module  # type: ignore[no-redef]
    from tmaflow.kernels import matmul as dense  # type: ignore[no-redef]
    from tmaflow.memory import DeviceArray, _contiguous_strides  # type: ignore[no-redef]
    splitk = grouped = dense  # type: ignore[assignment]
from tmaflow.dtypes import as_dtype

addresses = itertools.count(1)


class FakeDevice:
    ordinal = 0
    sm_count = 132


DEVICE = FakeDevice()
device_module._devices[0] = DEVICE  # device_of(0) for torch tensors


def view(shape, dtype="bfloat16", strides=None, device=None):
    dt = as_dtype(dtype)
    return DeviceArray._view(next(addresses) << 30, tuple(shape), dt,
                             strides or _contiguous_strides(tuple(shape), dt.itemsize), None, device, None)


# --- a stand-in torch: what tmaflow reads of tensors and of the module ---------------------------
class Size(tuple):
    pass


class FakeDtype:
    def __init__(self, name):
        self.name = name

    def __str__(self):
        return f"torch.{self.name}"


FakeDtype.__module__ = "torch"


class Tensor:
    def __init__(self, shape, dtype="bfloat16"):
        self.shape, self.dtype = Size(shape), TORCH_DTYPES[dtype]
        self._ptr = next(addresses) << 30
        self._stride = tuple(s // as_dtype(dtype).itemsize
                             for s in _contiguous_strides(tuple(shape), as_dtype(dtype).itemsize))

    def get_device(self):
        return 0

    def data_ptr(self):
        return self._ptr

    def stride(self):
        return self._stride

    def new_empty(self, shape, dtype=None):
        return Tensor(shape, dtype.name if dtype is not None else self.dtype.name)


Tensor.__module__ = "torch"
TORCH_DTYPES = {name: FakeDtype(name) for name in ("bfloat16", "float32", "float8_e4m3fn", "int32")}
torch = types.ModuleType("torch")
torch.Tensor = Tensor
torch._C = types.SimpleNamespace(_cuda_getCurrentRawStream=lambda ordinal: 0)
torch.__dict__.update(TORCH_DTYPES)
sys.modules["torch"] = torch


# --- states and allocations faked ----------------------------------------------------------------
class Recorder:
    def __call__(self, *args):
        pass


class Template:
    def bind(self, arr):
        return arr


def fake_state():
    launcher = Recorder()
    if hasattr(splitk, "_with_split_k"):  # gemm launches through the split-K guard
        launcher, _ = splitk._with_split_k(launcher, True, DEVICE, 0)
    t = Template()
    return types.SimpleNamespace(launcher=launcher, ta=t, tb=t, tc=t, ts=None, src=t, dst=t, tq=t,
                                 tk=t, tv=t, extra=(), flat=False, tail=(), workspace=None, split=1,
                                 slots=types.SimpleNamespace(array=0))


def fake_build(*args, **kwargs):
    return fake_state()


BUILDERS = ((examples, "_softmax_state"), (examples, "_copy_state"), (examples, "_transpose_state"),
            (dense, "_gemm_state"), (grouped, "_grouped_state"), (attention_entry, "_state"))
for module, name in BUILDERS:
    if hasattr(module, name):
        setattr(module, name, fake_build)


def cached_state(key, build):
    state = entry.STATES.get(key)
    if state is None:
        state = entry.STATES[key] = fake_state()
    return state


if not hasattr(examples, "_transpose_state"):  # ae3d113 builds transpose's state inline
    examples.cached_state = cached_state
entry.empty = lambda shape, dtype, device=None, stream=None: view(shape, dtype, device=device)


def cases():
    x, y, yt = view((64, 1024), "float32"), view((64, 1024), "float32"), view((1024, 64), "float32")
    tx, ty = Tensor((64, 1024), "float32"), Tensor((64, 1024), "float32")
    a, b, c = view((256, 256)), view((256, 256)), view((256, 256))
    ta, tb, tc = Tensor((256, 256)), Tensor((256, 256)), Tensor((256, 256))
    f8a, f8b = view((256, 256), "float8_e4m3fn"), view((256, 256), "float8_e4m3fn")
    sa, sb = view((256, 2), "float32"), view((2, 2), "float32")
    ga, gb, gc = view((512, 256)), view((4, 256, 256)), view((512, 256))
    offsets = view((5,), "int32")
    q, k, v, o = (view((2, 8, 1024, 128)) for _ in range(4))
    tq, tk, tv, to = (Tensor((2, 8, 1024, 128)) for _ in range(4))
    return {
        "softmax(x, y)": lambda: kernels.softmax(x, y),
        "softmax(x)": lambda: kernels.softmax(x),
        "softmax(tx, ty)": lambda: kernels.softmax(tx, ty),
        "softmax(tx)": lambda: kernels.softmax(tx),
        "softmax(x, y, stream=7)": lambda: kernels.softmax(x, y, stream=7),
        "copy(x, y)": lambda: kernels.copy(x, y),
        "copy(x)": lambda: kernels.copy(x),
        "copy(tx, ty)": lambda: kernels.copy(tx, ty),
        "transpose(x, y.T)": lambda: kernels.transpose(x, yt),
        "transpose(x)": lambda: kernels.transpose(x),
        "gemm(a, b, c)": lambda: kernels.gemm(a, b, c),
        "gemm(a, b)": lambda: kernels.gemm(a, b),
        "gemm(ta, tb, tc)": lambda: kernels.gemm(ta, tb, tc),
        "gemm(ta, tb)": lambda: kernels.gemm(ta, tb),
        "gemm fp8 scales 0.5, 2": lambda: kernels.gemm(f8a, f8b, c, scale_a=0.5, scale_b=2.0),
        "gemm fp8 block scales": lambda: kernels.gemm(f8a, f8b, c, scale_a=sa, scale_b=sb),
        "grouped_gemm(a, b, offs, c)": lambda: kernels.grouped_gemm(ga, gb, offsets, gc),
        "attention(q, k, v, o)": lambda: kernels.attention(q, k, v, o),
        "attention(q, k, v)": lambda: kernels.attention(q, k, v),
        "attention(tq, tk, tv, to)": lambda: kernels.attention(tq, tk, tv, to),
    }


def main():
    for name, fn in cases().items():
        try:
            fn()
        except Exception as e:  # an entry point the older tree lacks
            print(f"{name:28s} skip: {type(e).__name__}: {e}")
            continue
        n, best = 20000, 1e9
        for _ in range(3):
            t0 = time.perf_counter()
            for _ in range(n):
                fn()
            best = min(best, (time.perf_counter() - t0) / n * 1e6)
        print(f"{name:28s} {best:.2f} us")


if __name__ == "__main__":
    main()
