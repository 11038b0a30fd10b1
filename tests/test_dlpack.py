"""DLPack and the CUDA array interface without a GPU: struct layouts against numpy's own
DLPack, the export's stream rules (which stream waits for which) through a recording driver,
capsules built with ctypes, duck arrays built from dicts, and every refusal by its message."""
import ctypes
import gc

import numpy as np
import pytest

import tmaflow as tf
from tmaflow.runtime import dlpack, memory
from tmaflow.dtypes import as_dtype

PRODUCER = 0x5000  # a stream handle the fake allocation is ordered on


class FakeDevice:
    ordinal, generation = 0, 0

    def __init__(self, calls=None):
        self.calls = calls if calls is not None else []

    def activate(self):
        self.calls.append(("activate",))
        return self

    def release(self, ptr, size, stream):
        pass


def pool_array(shape=(4, 8), dtype="float32", stream=PRODUCER, device=None, ptr=0x10000):
    """A DeviceArray backed by an ``_Allocation`` on ``stream``, with no driver behind it."""
    device = device or FakeDevice()
    alloc = memory._Allocation.__new__(memory._Allocation)
    alloc.live, alloc.device, alloc._stream_owner, alloc.stream = True, device, stream, stream
    alloc.generation, alloc.size, alloc.ptr = 0, 512, ptr
    dt = as_dtype(dtype)
    return memory.DeviceArray._view(ptr, tuple(shape), dt, memory._contiguous_strides(tuple(shape), dt.itemsize),
                                    alloc, device, None, alloc)


@pytest.fixture
def waits(monkeypatch):
    """Every stream_wait(device, waiter, producer) the code asks for, in order."""
    seen = []
    monkeypatch.setattr(dlpack, "stream_wait", lambda device, waiter, producer: seen.append((waiter, producer)))
    return seen


def managed_of(capsule):
    """(name, managed struct, capsule): the struct lives only as long as the capsule is kept."""
    name = dlpack.capsule_name(capsule)
    ptr = dlpack._get_pointer(capsule, name)
    kind = dlpack.DLManagedTensorVersioned if name == dlpack.VERSIONED_NAME else dlpack.DLManagedTensor
    return name, kind.from_address(ptr), capsule


# --- struct layouts: numpy's capsules read through ours, ours read by numpy ----------------------

@pytest.mark.parametrize("max_version", [None, (1, 0), (1, 1)])
def test_numpy_capsules_read_through_our_structs(rng, max_version):
    host = rng.integers(-100, 100, (3, 5)).astype(np.int32).T  # strided: a transposed view
    kwargs = {} if max_version is None else {"max_version": max_version}
    capsule = host.__dlpack__(**kwargs)
    name, managed, capsule = managed_of(capsule)
    assert name == (dlpack.LEGACY_NAME if max_version is None else dlpack.VERSIONED_NAME)
    if max_version is not None:
        assert managed.version.major == 1
    t = managed.dl_tensor
    assert t.data + t.byte_offset == host.ctypes.data
    assert (t.device.device_type, t.ndim) == (dlpack.DLDeviceType.kDLCPU, 2)
    assert (t.dtype.code, t.dtype.bits, t.dtype.lanes) == (0, 32, 1)
    assert [t.shape[i] for i in range(2)] == [5, 3]
    assert [t.strides[i] * 4 for i in range(2)] == list(host.strides)


@pytest.mark.parametrize("versioned", [False, True])
@pytest.mark.parametrize("dtype", ["float32", "int16", "uint8", "float64", "bool"])
def test_numpy_reads_our_capsules(rng, versioned, dtype):
    host = (rng.standard_normal((6, 10)) * 50).astype(dtype)
    view = host[1:5, ::3]  # offset and strided
    arr = memory.DeviceArray(view.ctypes.data, view.shape, dtype, view.strides, owner=host)
    version = (1, 1) if versioned else None
    live = len(dlpack._live)

    class HostExporter:  # our capsule, labelled as host memory so numpy takes it
        def __dlpack__(self, **kwargs):
            return dlpack.make_capsule(arr, (dlpack.DLDeviceType.kDLCPU, 0),
                                       dlpack.dl_dtype(arr.dtype, version), version, 0, None)

        def __dlpack_device__(self):
            return (dlpack.DLDeviceType.kDLCPU, 0)

    got = np.from_dlpack(HostExporter())
    np.testing.assert_array_equal(got, view)
    assert got.ctypes.data == view.ctypes.data and got.strides == view.strides
    assert len(dlpack._live) == live + 1
    del got
    gc.collect()
    assert len(dlpack._live) == live  # numpy called our deleter


def test_an_unconsumed_capsule_frees_its_tensor():
    live = len(dlpack._live)
    capsule = pool_array().__dlpack__(stream=-1, max_version=(1, 0))
    assert len(dlpack._live) == live + 1
    del capsule
    assert len(dlpack._live) == live


# --- export: versions, flags, devices, dtypes ------------------------------------------------------

@pytest.mark.parametrize("max_version,name,version", [
    (None, dlpack.LEGACY_NAME, None), ((0, 9), dlpack.LEGACY_NAME, None),
    ((1, 0), dlpack.VERSIONED_NAME, (1, 0)), ((1, 7), dlpack.VERSIONED_NAME, (1, 1)),
    ((2, 0), dlpack.VERSIONED_NAME, (1, 1)), (np.array([1, 0]), dlpack.VERSIONED_NAME, (1, 0))])
def test_the_capsule_version_follows_max_version(max_version, name, version):
    arr = pool_array((3, 4), "bfloat16")
    got_name, managed, capsule = managed_of(arr.__dlpack__(stream=-1, max_version=max_version))
    assert got_name == name
    t = managed.dl_tensor
    assert (t.data, t.ndim, t.byte_offset) == (arr.ptr, 2, 0)
    assert (t.device.device_type, t.device.device_id) == (dlpack.DLDeviceType.kDLCUDA, 0)
    assert (t.dtype.code, t.dtype.bits, t.dtype.lanes) == (4, 16, 1)
    assert [t.shape[i] for i in range(2)] == [3, 4] and [t.strides[i] for i in range(2)] == [4, 1]
    if version is not None:
        assert (managed.version.major, managed.version.minor) == version and managed.flags == 0


@pytest.mark.parametrize("dtype,code,bits", [("float16", 2, 16), ("float32", 2, 32), ("int8", 0, 8),
                                             ("uint16", 1, 16), ("int64", 0, 64), ("bool", 6, 8),
                                             ("float8_e4m3fn", 10, 8)])
def test_dtype_codes(dtype, code, bits):
    _, managed, capsule = managed_of(pool_array((2, 2), dtype).__dlpack__(stream=-1, max_version=(1, 1)))
    assert (managed.dl_tensor.dtype.code, managed.dl_tensor.dtype.bits) == (code, bits)


@pytest.mark.parametrize("max_version", [None, (1, 0)])
def test_fp8_needs_dlpack_1_1(max_version):
    with pytest.raises(dlpack.DLPackError, match=r"float8_e4m3fn arrays are not exported through DLPack before version 1.1"):
        pool_array((2, 2), "float8_e4m3fn").__dlpack__(max_version=max_version)


def test_dlpack_device():
    device = pool_array().__dlpack_device__()
    assert device == (2, 0) and device[0] is dlpack.DLDeviceType.kDLCUDA


@pytest.mark.parametrize("dl_device", [(1, 0), (2, 1), (13, 0)])
def test_another_device_is_a_buffer_error(dl_device):
    with pytest.raises(dlpack.DLPackError, match=r"dl_device=.* is not the array's device \(2, 0\)") as info:
        pool_array().__dlpack__(dl_device=dl_device)
    assert isinstance(info.value, BufferError)


def test_its_own_device_is_fine(waits):
    assert dlpack.capsule_name(pool_array().__dlpack__(dl_device=(2, 0), copy=False)) == dlpack.LEGACY_NAME


@pytest.mark.parametrize("kwargs,match", [
    ({"dl_device": "cuda"}, r"dl_device='cuda' must be None or a \(device type, device id\) pair"),
    ({"dl_device": (2.0, 0)}, r"dl_device\[0\]=2.0 must be an int"),
    ({"max_version": "1.0"}, r"max_version='1.0' must be None or a \(major, minor\) pair"),
    ({"max_version": (1,)}, r"max_version=\(1,\) must be None"),
    ({"max_version": (True, 0)}, r"max_version\[0\]=True must be an int"),
    ({"copy": "yes"}, r"copy='yes' must be True or False"),
    ({"copy": 1}, r"copy=1 must be True or False"),
    ({"stream": 0}, r"stream=0 is disallowed for CUDA by the array API standard"),
    ({"stream": -2}, r"stream=-2 must be in \[-1, 18446744073709551615\]"),
    ({"stream": 2**64}, r"stream=18446744073709551616 must be in \[-1, "),
    ({"stream": True}, r"stream=True must be an int"),
    ({"stream": "s"}, r"stream='s' must be an int")])
def test_bad_export_arguments(kwargs, match):
    with pytest.raises(tf.TmaflowError, match=match):
        pool_array().__dlpack__(**kwargs)


def test_a_freed_array_is_not_exported():
    arr = pool_array()
    arr._alloc.live = False
    with pytest.raises(tf.TmaflowError, match=r"__dlpack__: the array at 0x10000 was freed"):
        arr.__dlpack__()


def test_the_arguments_are_keyword_only():
    with pytest.raises(TypeError):
        pool_array().__dlpack__(1)


# --- export: the stream rules ------------------------------------------------------------------------

@pytest.mark.parametrize("stream,expected", [
    (None, [(1, PRODUCER)]),        # None: the legacy default stream waits
    (1, [(1, PRODUCER)]),
    (2, [(2, PRODUCER)]),           # the per-thread default stream
    (0x7000, [(0x7000, PRODUCER)]),
    (np.int64(0x7000), [(0x7000, PRODUCER)]),
    (PRODUCER, []),                 # the same stream is ordered already
    (-1, [])])                      # the consumer asked for no synchronisation
def test_the_consumer_stream_waits_for_the_producer(waits, stream, expected):
    capsule = pool_array().__dlpack__(stream=stream, max_version=(1, 0))
    assert waits == expected
    del capsule


@pytest.mark.parametrize("producer,stream,waited", [(0, None, False), (0, 1, False), (0, 2, True),
                                                    (0, 0x7000, True), (1, 0x7000, True)])
def test_the_legacy_stream_is_0_to_the_driver_and_1_to_the_standard(waits, producer, stream, waited):
    pool_array(stream=producer).__dlpack__(stream=stream)
    assert bool(waits) == waited


def test_releasing_the_capsule_orders_the_producer_after_the_consumer(waits):
    capsule = pool_array().__dlpack__(stream=0x7000, max_version=(1, 0))
    assert waits == [(0x7000, PRODUCER)]
    del capsule  # the memory may be freed and reused on PRODUCER from now on
    assert waits == [(0x7000, PRODUCER), (PRODUCER, 0x7000)]


def test_a_release_after_the_producer_stream_closed_orders_the_legacy_stream(waits):
    class Owner:
        _handle = object()

    arr = pool_array()
    arr._alloc._stream_owner = Owner()
    capsule = arr.__dlpack__(stream=0x7000)
    Owner._handle = None  # tf.Stream.close(): later frees are ordered on the legacy stream
    del capsule
    assert waits == [(0x7000, PRODUCER), (0, 0x7000)]


def test_a_consumer_releases_through_the_deleter(waits):
    for max_version, kind in (((1, 0), dlpack.DLManagedTensorVersioned), (None, dlpack.DLManagedTensor)):
        waits.clear()
        capsule = pool_array().__dlpack__(stream=0x7000, max_version=max_version)
        name = dlpack.capsule_name(capsule)
        ptr = dlpack._get_pointer(capsule, name)
        dlpack._set_name(capsule, dlpack._USED[name])  # what a consumer does when it takes it
        del capsule
        assert waits == [(0x7000, PRODUCER)] and ptr in dlpack._live
        managed = kind.from_address(ptr)
        managed.deleter(ctypes.cast(ptr, ctypes.POINTER(kind)))
        assert waits == [(0x7000, PRODUCER), (PRODUCER, 0x7000)] and ptr not in dlpack._live


def test_a_copy_is_made_on_the_producer_stream_before_the_wait(waits, monkeypatch):
    order = []
    copy = pool_array(ptr=0x20000)
    monkeypatch.setattr(dlpack, "stream_wait", lambda d, waiter, producer: order.append(("wait", waiter, producer)))

    def copy_on(self, stream):
        order.append(("copy", stream))
        return copy

    monkeypatch.setattr(memory.DeviceArray, "_copy_on", copy_on)
    _, managed, capsule = managed_of(pool_array().__dlpack__(stream=0x7000, max_version=(1, 0), copy=True))
    assert order == [("copy", PRODUCER), ("wait", 0x7000, PRODUCER)]
    assert managed.dl_tensor.data == 0x20000 and managed.flags == dlpack.IS_COPIED


def test_copy_false_and_none_never_copy(waits, monkeypatch):
    monkeypatch.setattr(memory.DeviceArray, "_copy_on", lambda self, stream: pytest.fail("copied"))
    for copy in (False, None, np.bool_(False)):
        _, managed, capsule = managed_of(pool_array().__dlpack__(max_version=(1, 0), copy=copy))
        assert managed.dl_tensor.data == 0x10000 and managed.flags == 0


class RecordingDriver:
    def __init__(self, fail=None):
        self.calls, self.fail = [], fail

    def __call__(self, name, *args):
        self.calls.append((name, *args))
        if name == self.fail:
            raise tf.CudaError(name, 400, "CUDA_ERROR_INVALID_HANDLE")
        return "event" if name == "cuEventCreate" else None


def test_stream_wait_is_an_event_not_a_host_sync(monkeypatch):
    pytest.importorskip("cuda.bindings")
    fake = RecordingDriver()
    monkeypatch.setattr(dlpack.driver, "call", fake)
    device = FakeDevice()
    dlpack.stream_wait(device, 0x7000, PRODUCER)
    assert device.calls == [("activate",)]
    assert fake.calls == [("cuEventCreate", 2), ("cuEventRecord", "event", PRODUCER),
                          ("cuStreamWaitEvent", 0x7000, "event", 0), ("cuEventDestroy", "event")]
    fake = RecordingDriver(fail="cuStreamWaitEvent")
    monkeypatch.setattr(dlpack.driver, "call", fake)
    with pytest.raises(tf.CudaError, match="cuStreamWaitEvent"):
        dlpack.stream_wait(device, 0x7000, PRODUCER)
    assert fake.calls[-1] == ("cuEventDestroy", "event")


def test_copy_on_issues_2d_copies_on_the_stream(monkeypatch):
    pytest.importorskip("cuda.bindings")
    fake = RecordingDriver()
    monkeypatch.setattr(memory.driver, "call", fake)
    made = []

    def empty(shape, dtype, device, stream):
        made.append(stream)
        return pool_array(shape, dtype, stream, ptr=0x90000)

    monkeypatch.setattr(memory, "empty", empty)
    src = pool_array((4, 6), "float32")._as((4, 3), (24, 8))  # every other column
    out = src._copy_on(PRODUCER)
    assert made == [PRODUCER] and out.ptr == 0x90000
    [(name, copy, stream)] = fake.calls
    assert (name, stream) == ("cuMemcpy2DAsync", PRODUCER)
    assert (int(copy.srcDevice), copy.srcPitch, int(copy.dstDevice), copy.dstPitch) == (0x10000, 8, 0x90000, 4)
    assert (copy.WidthInBytes, copy.Height) == (4, 12)


# --- the CUDA array interface we export ---------------------------------------------------------

@pytest.mark.parametrize("producer,key", [(0, 1), (PRODUCER, PRODUCER)])
def test_cai_names_the_producer_stream(producer, key):
    cai = pool_array(stream=producer).__cuda_array_interface__
    assert cai["version"] == 3 and cai["stream"] == key and cai["data"] == (0x10000, False)


def test_cai_of_a_closed_stream_names_the_legacy_stream():
    class Closed:
        _handle = None

    arr = pool_array()
    arr._alloc._stream_owner = Closed()
    assert arr.__cuda_array_interface__["stream"] == 1


def test_cai_of_a_foreign_view_names_the_legacy_stream():
    arr = memory.DeviceArray(0x1000, (4,), "float32")
    assert arr.__cuda_array_interface__["stream"] == 1


# --- copies of strided layouts (planned on the host, checked against numpy) ---------------------

def _gathered(base: np.ndarray, view: np.ndarray) -> np.ndarray:
    buf = base.view(np.uint8).reshape(-1)
    offset = view.ctypes.data - base.ctypes.data
    out = np.full(view.nbytes, 0xAB, np.uint8)
    for src, dst, width, rows, pitch in memory.gather_copies(view.shape, view.strides, view.itemsize):
        for r in range(rows):
            out[dst + r * width:dst + (r + 1) * width] = buf[offset + src + r * pitch:offset + src + r * pitch + width]
    return out.view(view.dtype).reshape(view.shape)


def test_gather_copies_equal_numpy_on_random_layouts(rng):
    for _ in range(200):
        ndim = int(rng.integers(1, 5))
        base = rng.integers(0, 2**15, tuple(int(n) for n in rng.integers(1, 7, ndim))).astype(
            rng.choice([np.int8, np.int16, np.float32, np.float64]))
        slices = tuple(slice(int(rng.integers(0, n)), None, int(rng.integers(1, 3))) for n in base.shape)
        view = base[slices].transpose(rng.permutation(ndim))
        np.testing.assert_array_equal(_gathered(base, view), np.ascontiguousarray(view))


def test_a_compact_array_is_one_copy():
    assert memory.gather_copies((3, 4, 5), (80, 20, 4), 4) == [(0, 0, 240, 1, 240)]
    assert memory.gather_copies((0, 4), (16, 4), 4) == []


@pytest.mark.parametrize("shape,strides,match", [
    ((4, 4), (0, 4), r"every dimension of extent > 1 needs a positive stride"),
    ((4,), (-4,), r"every dimension of extent > 1 needs a positive stride"),
    ((4, 4), (8, 4), r"rows of 16 B overlap at a pitch of 8 B")])
def test_gather_copies_refuse_broadcast_reversed_and_overlapping(shape, strides, match):
    with pytest.raises(tf.TmaflowError, match=match):
        memory.gather_copies(shape, strides, 4)


# --- import: capsules built with ctypes ----------------------------------------------------------

class Built:
    """A capsule of our own making (no destructor): its structs, and the deleter calls seen."""

    def __init__(self, versioned=True, device_type=2, code=2, bits=32, lanes=1, shape=(2, 3),
                 strides=None, data=0x1000, byte_offset=0, version=(1, 0), name=None):
        self.deleted = 0
        n = len(shape)
        self.shape = (ctypes.c_int64 * max(n, 1))(*shape)
        self.strides = (ctypes.c_int64 * max(n, 1))(*strides) if strides is not None else None
        tensor = dlpack.DLTensor(data, dlpack.DLDevice(device_type, 0), n,
                                 dlpack.DLDataType(code, bits, lanes), self.shape, self.strides, byte_offset)
        if versioned:
            self.deleter = dlpack._VersionedDeleter(self._delete)
            self.managed = dlpack.DLManagedTensorVersioned(dlpack.DLPackVersion(*version), None,
                                                           self.deleter, 0, tensor)
        else:
            self.deleter = dlpack._Deleter(self._delete)
            self.managed = dlpack.DLManagedTensor(tensor, None, self.deleter)
        name = name or (dlpack.VERSIONED_NAME if versioned else dlpack.LEGACY_NAME)
        self.capsule = dlpack._new_capsule(ctypes.addressof(self.managed), name, None)

    def _delete(self, _ptr):
        self.deleted += 1


class Exporter:
    """A duck array exporting ``built``'s capsule; records the arguments it was asked with."""

    def __init__(self, built, device=(2, 0)):
        self.built, self.device, self.asked = built, device, []

    def __dlpack__(self, **kwargs):
        self.asked.append(kwargs)
        return self.built.capsule

    def __dlpack_device__(self):
        return self.device


@pytest.mark.parametrize("versioned", [True, False])
def test_a_capsule_is_consumed_once_and_released_with_the_view(versioned):
    built = Built(versioned=versioned, shape=(2, 3), strides=(1, 2), byte_offset=64)
    exporter = Exporter(built)
    view = tf.as_array(exporter)
    assert (view.ptr, view.shape, view.strides, view.dtype.name) == (0x1040, (2, 3), (4, 8), "float32")
    assert exporter.asked == [{"max_version": (1, 1)}]  # no stream named: the producer keeps its order
    assert dlpack.capsule_name(built.capsule).startswith(b"used_") and built.deleted == 0
    with pytest.raises(tf.TmaflowError, match=r"capsule named b'used_dltensor.*already consumed"):
        tf.as_array(exporter)
    del view
    gc.collect()
    assert built.deleted == 1


def test_our_stream_is_passed_to_the_producer():
    exporter = Exporter(Built())
    tf.as_array(exporter, stream=0x7000)
    assert exporter.asked == [{"max_version": (1, 1), "stream": 0x7000}]


def test_a_producer_without_max_version_gets_the_old_call():
    built = Built(versioned=False)

    class Old:
        def __init__(self):
            self.asked = []

        def __dlpack__(self, stream=None):
            self.asked.append(stream)
            return built.capsule

        def __dlpack_device__(self):
            return (2, 0)

    old = Old()
    assert tf.as_array(old).shape == (2, 3) and old.asked == [None]


def test_null_strides_mean_compact_and_newer_minor_versions_are_read():
    view = tf.as_array(Exporter(Built(shape=(3, 4, 5), code=0, bits=16, version=(1, 3))))
    assert view.strides == (40, 10, 2) and view.dtype.name == "int16"


@pytest.mark.parametrize("code,bits,name", [(10, 8, "float8_e4m3fn"), (4, 16, "bfloat16"), (6, 8, "bool"),
                                            (1, 64, "uint64"), (0, 8, "int8"), (2, 16, "float16")])
def test_capsule_dtypes(code, bits, name):
    assert tf.as_array(Exporter(Built(code=code, bits=bits))).dtype.name == name


def test_a_null_pointer_is_fine_for_an_empty_array():
    assert tf.as_array(Exporter(Built(data=0, shape=(0, 3)))).shape == (0, 3)


@pytest.mark.parametrize("built,match", [
    (dict(device_type=1), r"device_type=1 \(kDLCPU\); kernels need kDLCUDA or kDLCUDAManaged memory \(host memory"),
    (dict(device_type=3), r"device_type=3 \(kDLCUDAHost\)"),
    (dict(device_type=10), r"device_type=10 \(unknown\)"),
    (dict(code=12, bits=8), r"code=12 \(float8_e5m2\) bits=8 lanes=1, which tmaflow has no type for"),
    (dict(code=5, bits=64), r"code=5 \(complex\) bits=64"),
    (dict(code=2, bits=8), r"code=2 \(float\) bits=8"),
    (dict(code=2, bits=32, lanes=4), r"lanes=4"),
    (dict(code=17, bits=4), r"float4_e2m1fn"),
    (dict(code=99, bits=8), r"code=99 \(code 99\)"),
    (dict(data=0, shape=(2, 3)), r"NULL data pointer for shape=\(2, 3\)"),
    (dict(shape=(2, -3)), r"shape=\(2, -3\); extents must be >= 0"),
    (dict(version=(2, 0)), r"DLPack version 2.0; tmaflow reads major version 1"),
    (dict(name=b"something_else"), r"capsule named b'something_else', not a DLPack tensor"),
    (dict(name=b"used_dltensor_versioned"), r"already consumed")])
def test_capsule_refusals_leave_the_capsule_to_its_owner(built, match):
    made = Built(**built)
    name = dlpack.capsule_name(made.capsule)
    with pytest.raises(tf.TmaflowError, match=match):
        tf.as_array(Exporter(made))
    assert dlpack.capsule_name(made.capsule) == name and made.deleted == 0


@pytest.mark.parametrize("result,match", [(42, r"is a int, not a DLPack capsule"),
                                          (None, r"is a NoneType, not a DLPack capsule"),
                                          (b"dltensor", r"is a bytes, not a DLPack capsule")])
def test_dlpack_returning_a_non_capsule(result, match):
    class Liar:
        def __dlpack__(self, **kwargs):
            return result

    with pytest.raises(tf.TmaflowError, match=r"the __dlpack__\(\) result of Liar " + match):
        tf.as_array(Liar())


def test_dlpack_that_raises():
    class Broken:
        def __dlpack__(self, **kwargs):
            raise RuntimeError("the exporter failed")

    with pytest.raises(tf.TmaflowError, match=r"__dlpack__ of Broken failed: RuntimeError: the exporter failed"):
        tf.as_array(Broken())


@pytest.mark.parametrize("device,match", [
    (("cuda", 0), r"returned \('cuda', 0\); the standard asks for a \(device type, device id\) pair"),
    ((2,), r"returned \(2,\)"), ([2, 0], r"returned \[2, 0\]"), ((True, 0), r"returned \(True, 0\)"),
    ((2.0, 0), r"returned \(2.0, 0\)"), (None, r"returned None"),
    ((1, 0), r"device_type=1 \(kDLCPU\)")])
def test_dlpack_device_garbage_is_refused_before_dlpack(device, match):
    exporter = Exporter(Built(), device=device)
    with pytest.raises(tf.TmaflowError, match=r"as_array: Exporter.*" + match):
        tf.as_array(exporter)
    assert exporter.asked == []


def test_dlpack_device_that_raises():
    class Broken(Exporter):
        def __dlpack_device__(self):
            raise OSError("no device")

    with pytest.raises(tf.TmaflowError, match=r"Broken.__dlpack_device__\(\) failed: OSError: no device"):
        tf.as_array(Broken(Built()))


def test_our_export_imports_as_the_same_view(waits):
    arr = pool_array((3, 6), "float16")._as((3, 3), (12, 4))

    class Wrapper:
        def __dlpack__(self, **kwargs):
            return arr.__dlpack__(**kwargs)

        def __dlpack_device__(self):
            return arr.__dlpack_device__()

    live = len(dlpack._live)
    view = tf.as_array(Wrapper(), stream=0x7000)
    assert (view.ptr, view.shape, view.strides, view.dtype) == (arr.ptr, arr.shape, arr.strides, arr.dtype)
    assert waits == [(0x7000, PRODUCER)]
    del view
    gc.collect()
    assert waits == [(0x7000, PRODUCER), (PRODUCER, 0x7000)] and len(dlpack._live) == live


# --- import: duck arrays with a __cuda_array_interface__ -----------------------------------------

class Duck:
    def __init__(self, **iface):
        self.__cuda_array_interface__ = iface


GOOD = dict(shape=(4, 4), typestr="<f4", data=(0x1000, False), version=3)


def test_a_good_duck_array():
    view = tf.as_array(Duck(**dict(GOOD, shape=(np.int64(4), 4), strides=(np.int32(32), 4))))
    assert (view.ptr, view.shape, view.strides, view.dtype.name) == (0x1000, (4, 4), (32, 4), "float32")


@pytest.mark.parametrize("iface,match", [
    ({k: v for k, v in GOOD.items() if k != "shape"}, r"has no 'shape'"),
    ({k: v for k, v in GOOD.items() if k != "typestr"}, r"has no 'typestr'"),
    ({k: v for k, v in GOOD.items() if k != "data"}, r"has no 'data'"),
    (dict(GOOD, data=None), r"data=None must be a \(pointer, read_only\) pair"),
    (dict(GOOD, data=0x1000), r"data=4096 must be a \(pointer, read_only\) pair"),
    (dict(GOOD, data=[0x1000]), r"data=\[4096\] must be"),
    (dict(GOOD, data=("0x1000", False)), r"data=\('0x1000', False\) must be"),
    (dict(GOOD, data=(-16, False)), r"data=\(-16, False\) must be .*an int in \[0, 2\*\*64\)"),
    (dict(GOOD, data=(2**64, False)), r"data=\(18446744073709551616, False\) must be a \(pointer, read_only\) pair"),
    (dict(GOOD, data=(0x1000, "no")), r"data=\(4096, 'no'\) must be .*and a bool"),
    (dict(GOOD, data=(True, False)), r"data=\(True, False\) must be"),
    (dict(GOOD, data=(0, False)), r"data=\(0, False\) is a NULL pointer for shape=\(4, 4\)"),
    (dict(GOOD, data=(None, False)), r"data=\(None, False\) is a NULL pointer for shape=\(4, 4\)"),
    (dict(GOOD, typestr=""), r"typestr='' is not a numpy type string"),
    (dict(GOOD, typestr=4), r"typestr=4 is not a numpy type string"),
    (dict(GOOD, typestr="<c8"), r"typestr='<c8' unsupported"),
    (dict(GOOD, typestr="<V1"), r"typestr='<V1' unsupported"),
    (dict(GOOD, typestr="<x9"), r"typestr='<x9' unsupported"),
    (dict(GOOD, shape=(-4, 4)), r"shape=\(-4, 4\) must be a tuple of non-negative ints"),
    (dict(GOOD, shape=("4", 4)), r"shape=\('4', 4\) must be"),
    (dict(GOOD, shape=(4.0, 4)), r"shape=\(4.0, 4\) must be"),
    (dict(GOOD, shape=(True, 4)), r"shape=\(True, 4\) must be"),
    (dict(GOOD, shape=4), r"shape=4 must be"),
    (dict(GOOD, strides=(16,)), r"strides=\(16,\) must be 2 ints"),
    (dict(GOOD, strides=(16.0, 4.0)), r"strides=\(16.0, 4.0\) must be 2 ints"),
    (dict(GOOD, mask=object()), r"has a mask"),
    (dict(GOOD, stream=0), r"stream=0 must be None or a stream handle > 0 .*0 is disallowed"),
    (dict(GOOD, stream=-1), r"stream=-1 must be None or a stream handle"),
    (dict(GOOD, stream=True), r"stream=True must be"),
    (dict(GOOD, stream="1"), r"stream='1' must be")])
def test_broken_cuda_array_interfaces(iface, match):
    with pytest.raises(tf.TmaflowError, match=r"as_array: Duck.__cuda_array_interface__ " + match):
        tf.as_array(Duck(**iface))


def test_a_null_pointer_is_fine_for_an_empty_duck_array():
    assert tf.as_array(Duck(**dict(GOOD, shape=(0, 4), data=(0, False)))).shape == (0, 4)


def test_a_cuda_array_interface_that_raises_is_named():
    class Broken:
        @property
        def __cuda_array_interface__(self):
            raise ValueError("not today")

    with pytest.raises(tf.TmaflowError, match=r"Broken.__cuda_array_interface__ failed: ValueError: not today"):
        tf.as_array(Broken())


@pytest.mark.parametrize("producer,ours,waited", [(None, None, []), (1, None, []), (0x5000, None, []),
                                                  (0x5000, 0, [(0, 0x5000)]),
                                                  (0x5000, 0x5000, []), (2, 0x7000, [(0x7000, 2)]),
                                                  (1, 0x7000, [(0x7000, 1)])])
def test_a_cai_stream_is_waited_for_on_ours(monkeypatch, waits, producer, ours, waited):
    monkeypatch.setattr(memory, "current_device", FakeDevice)
    tf.as_array(Duck(**dict(GOOD, stream=producer)), stream=ours)
    assert waits == waited
