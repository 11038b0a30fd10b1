"""GPU tier: DLPack and CUDA-array-interface handoffs between streams are ordered by events,
not by luck. Each producer spins ~30 ms before writing, and each consumer reads on another
non-blocking stream right away without a host sync: a missing wait reads the poison."""
import functools

import numpy as np
import pytest

import tmaflow as tf
from tmaflow.runtime import dlpack

pytestmark = pytest.mark.gpu

N = 1 << 20
SPIN = 50_000_000  # clock cycles (~30 ms at 1.7 GHz) before the producer writes

SOURCE = r"""
#include <tmaflow.cuh>

__device__ void spin(uint64_t cycles) {
  long long start = clock64();
  while (clock64() - start < (long long)cycles) {}
}

// out[i] = i * 2654435761 ^ seed, written only after `cycles` clocks.
extern "C" __global__ void late_fill(uint32_t* out, uint32_t n, uint32_t seed, uint64_t cycles) {
  spin(cycles);
  for (uint32_t i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += gridDim.x * blockDim.x)
    out[i] = i * 2654435761u ^ seed;
}

extern "C" __global__ void copy_words(const uint32_t* src, uint32_t* dst, uint32_t n) {
  for (uint32_t i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += gridDim.x * blockDim.x)
    dst[i] = src[i];
}
"""


@functools.lru_cache(maxsize=None)
def kernel(name):
    return tf.Kernel(SOURCE, name, filename="dlpack_probe.cu")


def pattern(seed: int) -> np.ndarray:
    i = np.arange(N, dtype=np.uint64)
    return ((i * 2654435761) & 0xFFFFFFFF).astype(np.uint32) ^ np.uint32(seed)


def late_array(device, seed: int, stream: tf.Stream) -> tf.DeviceArray:
    """An int32 array on ``stream`` whose pattern lands ~30 ms after this returns."""
    a = tf.empty(N, "int32", stream=stream).fill_bytes(0xFF)
    device.synchronize()  # the poison is in place before the producer stream starts
    kernel("late_fill").launch(a, N, seed, SPIN, grid=64, block=256, stream=stream)
    return a


class Spy:
    """Only the DLPack protocol of ``obj``, recording each call's arguments and capsule."""

    def __init__(self, obj, **extra):
        self.obj, self.extra, self.calls = obj, extra, []

    def __dlpack__(self, **kwargs):
        capsule = self.obj.__dlpack__(**{**kwargs, **self.extra})
        name = dlpack.capsule_name(capsule)
        flags = None
        if name == dlpack.VERSIONED_NAME:
            flags = dlpack.DLManagedTensorVersioned.from_address(dlpack._get_pointer(capsule, name)).flags
        self.calls.append((kwargs, name, flags))
        return capsule

    def __dlpack_device__(self):
        return self.obj.__dlpack_device__()


def test_torch_reads_a_tmaflow_array_written_on_a_side_stream(device, rng):
    torch = pytest.importorskip("torch")
    seed = int(rng.integers(0, 2**32))
    producer = tf.Stream()
    a = late_array(device, seed, producer)
    consumer = torch.cuda.Stream()
    spy = Spy(a)
    with torch.cuda.stream(consumer):
        t = torch.from_dlpack(spy)
        got = t.clone()  # on the consumer stream: ordered by the export's event alone
    consumer.synchronize()
    [(kwargs, name, flags)] = spy.calls
    assert kwargs["stream"] == consumer.cuda_stream
    if kwargs.get("max_version") is not None and kwargs["max_version"][0] >= 1:
        assert name == dlpack.VERSIONED_NAME and flags == 0
    assert t.data_ptr() == a.ptr and t.dtype == torch.int32 and tuple(t.shape) == (N,)
    np.testing.assert_array_equal(got.cpu().numpy().view(np.uint32), pattern(seed))
    del t, got
    producer.close()


def _late_torch_source(torch, rng):
    """(the words wanted, a zeroed torch tensor a side stream fills only after a spin, that side
    stream, a tf.Stream to read on, a poisoned output allocated on it)."""
    want = pattern(int(rng.integers(0, 2**32)))
    src = torch.from_numpy(want.view(np.int32)).cuda()
    x = torch.zeros(N, dtype=torch.int32, device="cuda")
    reader = tf.Stream()
    out = tf.empty(N, "int32", stream=reader).fill_bytes(0xFF)
    torch.cuda.synchronize()
    side = torch.cuda.Stream()
    with torch.cuda.stream(side):
        torch.cuda._sleep(SPIN)
        x.copy_(src)
    return want, x, side, reader, out


def test_tmaflow_reads_a_torch_tensor_written_on_a_side_stream(device, rng):
    torch = pytest.importorskip("torch")
    want, x, side, reader, out = _late_torch_source(torch, rng)
    spy = Spy(x)
    with torch.cuda.stream(side):
        view = tf.as_array(spy, stream=reader)  # torch orders `reader` after `side`
    kernel("copy_words").launch(view, out, N, grid=64, block=256, stream=reader)
    reader.synchronize()
    [(kwargs, _, _)] = spy.calls
    assert kwargs["stream"] == reader.handle and view.ptr == x.data_ptr()
    np.testing.assert_array_equal(out.numpy().view(np.uint32), want)
    del view
    out.free()
    reader.close()


def test_a_cai_stream_is_waited_for(device, rng):
    torch = pytest.importorskip("torch")
    want, x, side, reader, out = _late_torch_source(torch, rng)

    class Duck:
        __cuda_array_interface__ = {"shape": (N,), "typestr": "<i4", "data": (x.data_ptr(), False),
                                    "version": 3, "stream": side.cuda_stream}

    view = tf.as_array(Duck(), stream=reader)
    kernel("copy_words").launch(view, out, N, grid=64, block=256, stream=reader)
    reader.synchronize()
    np.testing.assert_array_equal(out.numpy().view(np.uint32), want)
    out.free()
    reader.close()


def test_copy_true_exports_an_independent_copy(device, rng):
    torch = pytest.importorskip("torch")
    host = rng.standard_normal((48, 80)).astype(np.float32)
    a = tf.from_numpy(host)
    strided = a._as((80, 48), (4, 320))  # the transpose: copied by 2-D copies
    for source, want in ((a, host), (strided, host.T)):
        spy = Spy(source, copy=True)
        t = torch.from_dlpack(spy)
        torch.cuda.synchronize()
        [(kwargs, name, flags)] = spy.calls
        if name == dlpack.VERSIONED_NAME:
            assert flags == dlpack.IS_COPIED
        assert t.data_ptr() != a.ptr and t.is_contiguous()
        a.fill_bytes(0)
        device.synchronize()
        np.testing.assert_array_equal(t.cpu().numpy(), want)
        a.copy_from(host)


def test_cupy_reads_a_tmaflow_array_written_on_a_side_stream(device, rng):
    cupy = pytest.importorskip("cupy")
    for via in ("dlpack", "cai"):
        seed = int(rng.integers(0, 2**32))
        producer = tf.Stream()
        a = late_array(device, seed, producer)
        consumer = cupy.cuda.Stream(non_blocking=True)
        with consumer:
            x = cupy.from_dlpack(Spy(a)) if via == "dlpack" else cupy.asarray(a)
            got = x.copy()
        consumer.synchronize()
        np.testing.assert_array_equal(cupy.asnumpy(got).view(np.uint32), pattern(seed), err_msg=via)
        del x, got
        producer.close()
