"""Slots for tensor maps that kernels patch on the device (``tmaflow::tensormap`` in the
device library): ``DescriptorWorkspace(n)`` holds ``n`` 128-byte slots, 128-B aligned (the PTX
asks 64 B of a global tensor map; 128 keeps every slot on its own line), and proves a patched
slot against the host's encode of the same parameters, byte for byte."""
from __future__ import annotations

import numpy as np

from ..errors import TensorMapError, TmaflowError
from ..runtime import driver
from ..runtime.device import stream_handle
from ..runtime.memory import DeviceArray, empty, zero_for_sanitizer
from .tensormap import encode

SLOT_BYTES = 128


class DescriptorWorkspace:
    """``slots`` tensor-map slots in device memory. ``ws.slot(i)`` is slot i's address (pass
    ``ws`` itself for a ``CUtensorMap*`` parameter); ``ws.read(i)`` its 128 bytes;
    ``ws.check(i, spec)`` raises unless they equal the host encode of ``spec``. The slots are
    allocated (and freed) in order on ``stream``, the stream of the launches that patch them."""

    def __init__(self, slots: int, device=None, stream=None):
        if isinstance(slots, bool) or not isinstance(slots, (int, np.integer)) or not 1 <= slots <= 1 << 20:
            raise TmaflowError(f"DescriptorWorkspace: slots={slots!r} must be an int in [1, 2^20]")
        self.slots = int(slots)
        self.array = empty((self.slots * SLOT_BYTES,), "uint8", device, stream=stream)
        if self.array.ptr % SLOT_BYTES:  # the pool hands out 512-B aligned blocks; say so if not
            raise TmaflowError(f"DescriptorWorkspace: memory at 0x{self.array.ptr:x} is not "
                               f"{SLOT_BYTES}-B aligned")
        # Zeroed once, in order on its stream: kernels write the slots through the tensormap
        # proxy, which compute-sanitizer's initcheck does not count as initialising them.
        driver.call("cuMemsetD8Async", self.array.ptr, 0, self.array.nbytes, stream_handle(stream))
        zero_for_sanitizer(self.array, stream_handle(stream))

    @property
    def ptr(self) -> int:
        """The device address of slot 0 (the slots follow, 128 B apart)."""
        return self.array.ptr

    @property
    def __cuda_array_interface__(self) -> dict:
        return self.array.__cuda_array_interface__

    def slot(self, i: int) -> int:
        """The device address of slot ``i`` (a ``CUtensorMap*`` kernel argument)."""
        self._index(i)
        return self.array.ptr + SLOT_BYTES * i

    def read(self, i: int) -> bytes:
        """Slot i's 128 bytes, copied to the host after the work on the default stream."""
        return self._view(i).numpy().tobytes()

    def write(self, i: int, tmap) -> None:
        """Put a host-encoded map (a TensorMap, or 128 bytes) into slot i."""
        raw = bytes(tmap)
        if len(raw) != SLOT_BYTES:
            raise TmaflowError(f"DescriptorWorkspace.write: {len(raw)} bytes given; a map is {SLOT_BYTES}")
        self._view(i).copy_from(np.frombuffer(raw, np.uint8))

    def check(self, i: int, spec) -> None:
        """Raise TensorMapError unless slot i holds exactly what the host encodes for ``spec``
        (a TensorMapSpec with its address), naming the bytes that differ."""
        got, want = self.read(i), encode(spec)
        if got != want:
            diff = [k for k in range(SLOT_BYTES) if got[k] != want[k]]
            fields = _fields_at(spec, diff)
            where = f" ({', '.join(fields)})" if fields else ""
            raise TensorMapError(
                f"DescriptorWorkspace slot {i}: the device-patched map differs from the host encode "
                f"of {spec!r} (address 0x{spec.address or 0:x}) in bytes {_ranges(diff)}{where}: "
                f"device {got[diff[0]:diff[-1] + 1].hex()} vs host {want[diff[0]:diff[-1] + 1].hex()}. "
                "A field was patched with another value (or not at all), or the slot is stale: "
                "published before this launch, or read before its release fence")

    def _view(self, i: int) -> DeviceArray:
        return DeviceArray(self.slot(i), (SLOT_BYTES,), "uint8", owner=self.array,
                           device=self.array.device)

    def _index(self, i) -> None:
        if isinstance(i, bool) or not isinstance(i, (int, np.integer)) or not 0 <= i < self.slots:
            raise TmaflowError(f"DescriptorWorkspace: slot {i!r} is not in [0, {self.slots})")

    def __repr__(self) -> str:
        return f"DescriptorWorkspace({self.slots} slots at 0x{self.array.ptr:x})"


def _fields_at(spec, differing: list[int]) -> list[str]:
    """The fields of ``spec`` whose encoding covers the differing bytes, found by encoding
    ``spec`` again with one field changed at a time (the descriptor's layout is not public)."""
    from dataclasses import replace

    base = encode(spec)
    trials = [("global address", replace(spec, address=(spec.address or 0) + 256))]
    for d in range(len(spec.shape)):  # numpy order, as the spec is written
        shape = list(spec.shape)
        shape[d] += 1
        trials.append((f"shape[{d}]", replace(spec, shape=tuple(shape))))
    for d in range(len(spec.shape) - 1):  # the innermost stride is the element size: not encoded
        strides = list(spec.strides)
        strides[d] += 16
        trials.append((f"strides[{d}]", replace(spec, strides=tuple(strides))))
    named = []
    for name, variant in trials:
        try:
            changed = {k for k, (x, y) in enumerate(zip(base, encode(variant))) if x != y}
        except Exception:  # a variant the encoder refuses: no evidence either way
            continue
        if changed & set(differing):
            named.append(name)
    return named


def _ranges(indices: list[int]) -> str:
    out, start = [], None
    for k, v in enumerate(indices):
        if start is None:
            start = v
        if k + 1 == len(indices) or indices[k + 1] != v + 1:
            out.append(f"{start}" if start == v else f"{start}-{v}")
            start = None
    return ", ".join(out)
