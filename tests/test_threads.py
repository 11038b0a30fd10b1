"""Several Python threads compiling and launching at once."""
import threading

import numpy as np
import pytest

import tmaflow as tf
from kernel_sources import source


def _in_threads(fn, n=8):
    errors, threads = [], []

    def run(i):
        try:
            fn(i)
        except BaseException as exc:  # collected and re-raised in the main thread
            errors.append(exc)

    for i in range(n):
        threads.append(threading.Thread(target=run, args=(i,)))
        threads[-1].start()
    for t in threads:
        t.join(timeout=600)
    if errors:
        raise errors[0]


def test_threads_compile_one_kernel_and_distinct_kernels(tmp_cache):
    shared = tf.Kernel("__global__ void k(int* p) { p[0] = 123; }", "k")
    cubins = {}

    def work(i):
        cubins[("shared", i)] = shared.cubin
        own = tf.Kernel(f"__global__ void k(int* p) {{ p[0] = {i}; }}", "k")
        cubins[("own", i)] = own.cubin

    _in_threads(work)
    assert len({v for k, v in cubins.items() if k[0] == "shared"}) == 1
    assert len({v for k, v in cubins.items() if k[0] == "own"}) == 8


@pytest.mark.gpu
def test_threads_launch_concurrently(device):
    k = tf.Kernel(source("probe"), "big_smem", filename="probe.cu")

    def work(i):
        stream = tf.Stream()
        for rep in range(50):
            out = tf.empty(256, "uint32").fill_bytes(0xFF)
            seed = i * 1000 + rep
            k.launch(out, 1024, seed, grid=1, block=64, smem=1024, stream=stream)
            stream.synchronize()
            assert out.numpy()[0] == (255 * 2654435761 & 0xFFFFFFFF) ^ seed
        stream.close()

    _in_threads(work)


@pytest.mark.gpu
def test_every_visible_gpu(rng):
    from tmaflow.runtime import driver

    if not driver.driver_available():
        pytest.skip("no driver")
    count = driver.call("cuDeviceGetCount")
    k = tf.Kernel(source("probe"), "tma_load_probe", filename="probe.cu")
    for ordinal in range(count):
        dev = tf.set_device(ordinal)
        if not dev.is_hopper:
            continue
        host = rng.standard_normal((32, 64)).astype(np.float32)
        a = tf.from_numpy(host)
        assert a.device is dev
        tmap = tf.TensorMap.tiled(a, (8, 32))
        out, addr = tf.empty(tmap.spec.smem_bytes, "uint8"), tf.empty(1, "uint32")
        coords = tf.from_numpy(np.array([[32, 8, 0, 0, 0]], np.int32))
        k.launch(tmap, out, addr, coords, 2, 0, tmap.spec.smem_bytes, tmap.spec.tx_bytes, grid=1,
                 block=64, smem=tmap.spec.smem_bytes + 1024)
        np.testing.assert_array_equal(out.numpy().view(np.float32).reshape(8, 32), host[8:16, 32:64])
        assert k._modules[ordinal].device is dev  # one module per device
    tf.set_device(0)
    print(f"ran on {count} GPU(s)")


def test_a_thread_takes_the_device_of_its_current_context_once(monkeypatch):
    """A thread that never called tf.set_device takes the device whose context is current on it
    (torch.cuda.set_device(1) before tmaflow's first call), else device 0, and keeps it."""
    import types

    from tmaflow.runtime import device as devices

    context = {"ctx": 0, "device": 0}  # what the driver says is current on every thread here
    cu = types.SimpleNamespace(cuCtxGetCurrent=lambda: (0, context["ctx"]),
                               cuCtxGetDevice=lambda: (0, context["device"]))

    class Device:
        def __init__(self, ordinal):
            self.ordinal = ordinal

        def activate(self):
            return self

    monkeypatch.setattr(devices.driver, "init", lambda: None)
    monkeypatch.setattr(devices.driver, "cu", lambda: cu)
    monkeypatch.setattr(devices, "Device", Device)
    monkeypatch.setattr(devices, "_switched", [False])
    seen = []

    def first_use(ctx, ordinal, then):
        context.update(ctx=ctx, device=ordinal)
        seen.append(devices.current_device().ordinal)
        context.update(ctx=then, device=then)  # a switch after the first use is not followed
        seen.append(devices.current_device().ordinal)

    for args in ((0xc0, 1, 2), (0, 3, 1), (0xc1, 2, 0)):
        t = threading.Thread(target=first_use, args=args)
        t.start()
        t.join()
    assert seen == [1, 1, 0, 0, 2, 2]
    assert devices._switched[0], "Kernel.launch's C key takes the ordinal once a thread is off device 0"
