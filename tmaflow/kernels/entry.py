"""What every entry point (``kernels.copy``, ``softmax``, ``gemm``, ...) shares.

- ``Prepared``: one launch with everything resolved (launcher, arguments, output). Calling it
  launches and returns the output; ``kernels.softmax.prepare(x)`` hands one to timing loops.
- outputs of the caller's kind: torch in, torch out (allocated by torch on the tensor's
  device); cupy in, cupy out; otherwise a tmaflow array from the stream-ordered pool.
- a per-thread cache of prepared states, keyed by shape, strides, dtype, configuration and
  stream: a repeated call does no planning, validation or encoding, only lookups.
- the stream resolved once, first (``resolve_stream``: ``stream=None`` is torch's or cupy's
  current stream for their arrays, a capturing tf.Graph's stream, else the legacy stream):
  a state, its launcher and what it owns per stream (split-K workspaces, descriptor slots)
  belong to that handle, and outputs are allocated in order on it.
"""
from __future__ import annotations

import contextlib
import functools
from typing import Callable

from ..errors import TmaflowError
from ..launch.launcher import ContextMoved
from ..runtime.device import current_ordinal, framework_stream, on_reset, usable, using
from ..runtime.graph import ACTIVE as CAPTURING, capturing
from ..runtime.memory import (ZERO_SCRATCH, DeviceArray, _contiguous_strides as contiguous_strides, as_array,
                              empty, zero_for_sanitizer)


class Prepared:
    """A launch ready to go: ``prepared()`` launches and returns ``out``, on the stream the
    ``prepare`` call resolved (its resources belong to that stream) and on its device, whatever
    the calling thread's device is then."""

    __slots__ = ("launcher", "args", "out", "ordinal")

    def __init__(self, launcher, args: tuple, out):
        self.launcher, self.args, self.out = launcher, args, out
        self.ordinal = current_ordinal()

    def __call__(self):
        if self.launcher is not None:
            if current_ordinal() == self.ordinal:
                launch_guarded(self.launcher, self.args)
            else:
                with using(self.ordinal):
                    self.launcher(*self.args)
        return self.out


def launch_guarded(launcher, args: tuple) -> None:
    """``launcher(*args)``; refused because another library made another device's context
    current (nothing ran), again under a guard of the launcher's device. The retry runs outside
    the handler: an error of its own is not chained under the refusal."""
    try:
        return launcher(*args)
    except ContextMoved as refused:
        moved = refused.ordinal
    with using(moved):
        launcher(*args)


def on_their_device(call):
    """``call()``; if the arrays it was given live on another (usable) device than the thread's,
    ``call()`` again under a guard of that device (outside the handler, as launch_guarded)."""
    try:
        return call()
    except OnAnotherDevice as refused:
        if not usable(refused.ordinal):
            raise
        moved = refused.ordinal
    with using(moved):
        return call()

    def __repr__(self) -> str:
        return f"Prepared({self.launcher!r}, {len(self.args)} args)"


# Entry points called while torch.compile traces (attention: also while autograd records) run
# as their torch custom op instead (``tmaflow.torch`` fills these in: name -> op adapter, and
# ``torch_route(name, args, kwargs)``: does this call go to the op?).
TORCH_OPS: dict = {}
torch_route: Callable[[str, tuple, dict], bool] = lambda name, args, kwargs: False


class OnAnotherDevice(TmaflowError):
    """The call's arrays live on device ``ordinal``, not the thread's: the entry point runs
    again under a device guard (``runtime.device.using``), as torch's own ops follow their
    tensors' device."""

    def __init__(self, message: str, ordinal: int):
        super().__init__(message)
        self.ordinal = ordinal


def entry_point(prepare):
    """Turn ``prepare(...) -> (launcher, args, out)`` into the entry point ``f(...)`` (launch,
    return the output), with ``f.prepare(...) -> Prepared`` for callers that launch the same
    thing many times. A call whose arrays live on another device than the thread's runs on
    theirs (a device guard: the thread's device and current context are left as they were)."""
    name = prepare.__name__

    def launch(*args, **kwargs):
        launcher, largs, out = prepare(*args, **kwargs)
        if launcher is not None:
            launch_guarded(launcher, largs)
        return out

    @functools.wraps(prepare)
    def run(*args, **kwargs):
        if TORCH_OPS and name in TORCH_OPS and torch_route(name, args, kwargs):
            return TORCH_OPS[name](*args, **kwargs)
        return on_their_device(lambda: launch(*args, **kwargs))

    def prepared(*args, **kwargs) -> Prepared:  # (under a guard, its ordinal is the guard's)
        return on_their_device(lambda: Prepared(*prepare(*args, **kwargs)))

    prepared.__doc__ = f"The launch ``{prepare.__name__}(...)`` would make, ready to repeat."
    run.prepare = prepared
    return run


# Prepared states of every entry point, keyed by (entry name, ..., thread ident): launchers
# belong to one thread. Entry points look up ``STATES[key]`` inline and build on a miss.
STATES: dict = {}
on_reset(STATES.clear)  # a reset context took the launchers' functions with it


def cached_state(key: tuple, build):
    """``STATES[key]``, made by ``build()`` on a miss."""
    try:
        state = STATES.get(key)
    except TypeError:
        raise TmaflowError(f"{key[0]}: an argument is not hashable ({key!r})") from None
    if state is None:
        state = build()
        if len(STATES) >= 512:
            STATES.clear()
        STATES[key] = state
    return state


def on_current_device(name: str, arr: DeviceArray) -> int:
    """The current device's ordinal, after checking that ``arr`` lives there (else
    ``OnAnotherDevice``: the entry point runs again on ``arr``'s device)."""
    ordinal = current_ordinal()
    if arr.device is not None and arr.device.ordinal != ordinal:
        raise OnAnotherDevice(f"{name}: the array lives on device {arr.device.ordinal} but the call runs on "
                              f"device {ordinal}; a call's arrays live on one device", arr.device.ordinal)
    return ordinal


def packed(arr: DeviceArray) -> DeviceArray:
    """``arr`` with the row-major strides of its shape when its elements already lie that way
    but an extent-1 dim has another stride (torch's ``is_contiguous()`` ignores those, and a
    transpose or ``unsqueeze`` leaves them): the same bytes, the layout the kernels' checks and
    maps expect. Any other layout comes back as it is, for the caller's check to name."""
    want = contiguous_strides(arr.shape, arr.dtype.itemsize)
    if arr.strides == want or any(n != 1 and s != w for n, s, w in zip(arr.shape, arr.strides, want)):
        return arr
    return arr._as(arr.shape, want)


def new_output(like, like_arr: DeviceArray, shape: tuple, dtype=None, stream: int = 0):
    """(object returned to the caller, its DeviceArray view): a new contiguous array of
    ``like``'s kind, allocated in order on ``stream``, the call's resolved stream: tmaflow's
    from its stream-ordered pool, torch's and cupy's by their allocators from ``stream``'s pool
    (their allocators hand a freed block out again in the order of the stream it belongs to:
    from the current stream's pool, a block whose last use is still queued there could go to
    our kernels on another stream). The view is built directly: its layout is known. Zeroed
    under TMAFLOW_ZERO_SCRATCH (compute-sanitizer's initcheck does not count the TMA stores
    that write it as initialising it)."""
    dt = dtype or like_arr.dtype
    shape = tuple(shape)
    origin = like_arr._origin
    if origin == "torch":
        if isinstance(like, DeviceArray):  # a staged operand, passed on as a view of its tensor
            like = like_arr.owner
        with _on_stream("torch", stream, like_arr):
            obj = like.new_empty(shape) if dt is like_arr.dtype else like.new_empty(shape, dtype=_torch_dtype(dt))
        view = DeviceArray._view(obj.data_ptr(), shape, dt, contiguous_strides(shape, dt.itemsize),
                                 obj, like_arr.device, "torch")
    elif origin == "cupy" and dt.name != "bfloat16":
        import cupy

        with _on_stream("cupy", stream, like_arr):
            obj = cupy.empty(shape, dtype=dt.numpy)
        view = as_array(obj)
    else:
        obj = view = empty(shape, dt, like_arr.device, stream=stream)
    if ZERO_SCRATCH:
        zero_for_sanitizer(view, stream)
    return obj, view


def _on_stream(framework: str, stream: int, like_arr: DeviceArray):
    """A context in which ``framework``'s allocator takes ``stream``'s pool: nothing when it is
    the framework's current stream (stream=None resolves to it), else the framework's
    external-stream context (imported here: optional dependencies)."""
    ordinal = like_arr.device.ordinal if like_arr.device is not None else current_ordinal()
    if stream == framework_stream(framework, ordinal):
        return contextlib.nullcontext()
    if framework == "torch":
        import torch

        return torch.cuda.stream(torch.cuda.ExternalStream(stream, device=torch.device("cuda", ordinal)))
    import cupy

    return cupy.cuda.ExternalStream(stream, ordinal)


def scratch(like, like_arr: DeviceArray, shape: tuple, dtype, stream: int) -> DeviceArray:
    """A call's own scratch (workspaces, staging), freed by the caller right after its launches
    are queued: torch's from torch's pool of ``stream`` (new_output; freed, it is handed out
    again only in ``stream``'s order, after our kernels), which also keeps torch's capture pools
    in charge; inside a capturing tf.Graph, and for other kinds, from tmaflow's pool in order
    on ``stream`` (a tf.Graph owns what is allocated during its capture, for its replays; torch
    would free the block when the call returns). The array holds what keeps the memory alive."""
    if like_arr._origin != "torch" or (CAPTURING and capturing() is not None):
        arr = empty(tuple(shape), dtype or like_arr.dtype, like_arr.device, stream=stream)
        if ZERO_SCRATCH:
            zero_for_sanitizer(arr, stream)
        return arr
    return new_output(like, like_arr, shape, dtype, stream)[1]


def given_output(name: str, out, shape: tuple, dtype, bits_only: bool = False,
                 field: str = "out") -> DeviceArray:
    """The DeviceArray view of ``out`` after checking shape, element type and liveness. Kernels
    that only move bits (``bits_only``) take any element type of the same size; the others need
    ``dtype`` itself (bf16 results in an fp16 array would read as garbage). ``field``: the
    argument's name in messages."""
    arr = as_array(out)
    same = arr.dtype.itemsize == dtype.itemsize if bits_only else arr.dtype is dtype
    if arr.shape != shape or not same:
        raise TmaflowError(f"{name}: {field} must be a {tuple(shape)} {dtype} array (got "
                           f"{arr.shape} {arr.dtype})")
    if not arr._alloc.live:
        raise TmaflowError(f"{name}: {field} {arr!r} was freed")
    return arr


def _torch_dtype(dtype):
    import torch

    return getattr(torch, dtype.name)


def output_strides(out_arr: DeviceArray | None, shape: tuple, itemsize: int) -> tuple:
    """The strides an output will have: ``out``'s, or those of a new contiguous array."""
    return out_arr.strides if out_arr is not None else contiguous_strides(tuple(shape), itemsize)
