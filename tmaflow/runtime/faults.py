"""Sticky faults, reported once: which kernels ran, that the context is dead, what to do.

A kernel that touches a wild address (or traps, or asserts) leaves its CUDA context unusable:
the driver returns the same error from every later call, whatever it is about. ``driver.check``
turns the first such result into one :class:`KernelFaultError` naming the kernels launched on
that context since its last successful synchronize; ``driver.call`` raises it again up front
for every later call on that context, until ``Device.reset()`` calls :func:`forget`.

The record costs one append per launch: the Python launch paths append (the launcher's
:class:`Site`, its driver launch config, the packed argument bytes) to a ring of the last
``RING`` launches per device; nothing in it keeps a launcher or an array alive. The C launch
path (``_launch.c``) never returns to Python per launch: launchers that build a C plan are
remembered, and each plan's ``launches`` counter is compared with its value at the last
synchronize. Arguments are described from the packed bytes (pointers, scalars) and, for tensor
maps, from tmaflow's encode cache (dtype, shape, box, address).
"""
from __future__ import annotations

import struct
import threading
import weakref
from collections import defaultdict, deque
from typing import NamedTuple

from ..errors import KernelFaultError

RING = 64

# Codes the driver documents as leaving the context (or the process) unusable, with what
# happened, for the first line of the report.
STICKY = {
    226: "the GPU contained an error (an invalid access of peer memory over NVLink or a "
         "hardware error)",
    700: "a kernel loaded or stored at an invalid address",
    702: "a kernel ran past the launch timeout",
    710: "a device-side assert fired",
    714: "a kernel hit a stack error (corrupt or overflowing stack)",
    715: "a kernel executed an illegal instruction",
    716: "a kernel loaded or stored at a misaligned address",
    717: "a kernel used an address outside the state space its instruction allows",
    718: "a kernel's program counter wrapped its address space",
    719: "a kernel faulted (an invalid pointer, out-of-bounds shared memory, or a trap)",
    721: "a kernel exited without deallocating its tensor memory",
    810: "the MPS server terminated this client",
}

# Calls that still work on a faulted context and are needed to recover from one (device
# queries, primary context reset/retain, making a context current) or touch no context.
_UNGUARDED = frozenset({"cuInit", "cuDriverGetVersion", "cuGetErrorName", "cuGetErrorString",
                        "cuGetProcAddress", "cuCtxGetCurrent", "cuCtxSetCurrent"})
# A synchronous copy to pageable host memory returns once the legacy stream's work before it is done.
SYNCHRONIZE = frozenset({"cuCtxSynchronize", "cuStreamSynchronize", "cuMemcpyDtoH"})

_rings: dict[int, deque] = defaultdict(lambda: deque(maxlen=RING))
_native: dict[int, weakref.WeakSet] = defaultdict(weakref.WeakSet)  # launchers with a C plan
# launcher -> {id(plan): its launches at the last synchronize}; no plan is held (a plan holds
# its launcher, which would then never leave this weak dictionary)
_at_sync: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()
faulted: dict[int, KernelFaultError] = {}  # device ordinal -> the first report of its fault
_lock = threading.Lock()


# --- recording ----------------------------------------------------------------------------------

def ring(ordinal: int) -> deque:
    """The launch ring of device ``ordinal`` (cleared in place, never replaced: the generated
    launch functions bind its ``append``)."""
    return _rings[ordinal]


class Site(NamedTuple):
    """What the report says of a launcher: its kernel, configuration and parameter table."""

    name: str
    grid: tuple
    block: tuple
    cluster: tuple
    smem: int | None
    stream: int | None  # the configured stream; None: the arrays' current stream
    params: tuple


def site(launcher) -> Site:
    c = launcher.config
    name = getattr(launcher.kernel, "name", None) or "<unnamed kernel>"
    return Site(name, c.grid, c.block, c.cluster, c.smem, c.stream, tuple(launcher.packer.params))


def note(launcher, cfg) -> None:
    """Record one launch the driver accepted on the Python path."""
    _rings[launcher.ordinal].append((site(launcher), cfg, launcher.packer.buffer.raw))


def track_native(launcher) -> None:
    """Remember a launcher whose launches may take the C path (its plans count them)."""
    _native[launcher.ordinal].add(launcher)


def _plan_counts(launcher) -> dict:
    counts = {}
    for plan in list(launcher._plans.values()):
        launches = getattr(plan, "launches", None)  # exposed by _launch.c's plans
        if launches is not None:
            counts[id(plan)] = int(launches)
    return counts


def synchronized(call: str, args: tuple) -> None:
    """A synchronize succeeded: the launches it waited for did not fault."""
    if not any(_rings.values()) and not any(_native.values()):
        return  # nothing recorded: no need to ask the driver which context this was
    ordinal = _context_ordinal()
    launches = _rings.get(ordinal)
    if call == "cuCtxSynchronize":
        if launches:
            launches.clear()
        for launcher in list(_native.get(ordinal, ())):
            _at_sync[launcher] = _plan_counts(launcher)
    elif launches:  # only that stream's launches are known to be done
        stream = int(args[0]) if call == "cuStreamSynchronize" else 0
        kept = [entry for entry in list(launches) if _stream_of(entry[1]) != stream]
        launches.clear()
        launches.extend(kept)


def forget(ordinal: int) -> None:
    """Device ``ordinal``'s context was reset: its fault and its launch record are gone."""
    with _lock:
        faulted.pop(ordinal, None)
        _rings[ordinal].clear()
        for launcher in list(_native.pop(ordinal, ())):
            _at_sync.pop(launcher, None)


# --- raising --------------------------------------------------------------------------------------

def refuse(call: str) -> None:
    """Raise the fault of the current context before ``call`` runs, if that context faulted."""
    if call in _UNGUARDED or call.startswith("cuDevice"):
        return
    first = faulted.get(_context_ordinal())
    if first is not None:
        raise _again(first, call, "was not run")


def fault(call: str, code: int, name: str, ordinal: int | None = None) -> KernelFaultError:
    """The error for sticky ``code`` returned by ``call``: the full report the first time the
    context of ``ordinal`` (default: the current one) faulted, a pointer back to it later."""
    if ordinal is None:
        ordinal = _context_ordinal()
    with _lock:
        first = faulted.get(ordinal)
        if first is None:
            kernels, lines = _launches(ordinal)
            what = STICKY.get(code, "a kernel faulted")
            detail = _report(ordinal, what, lines)
            first = faulted[ordinal] = KernelFaultError(call, code, name, detail, kernels)
            return first
    return _again(first, call, "failed")


def _again(first: KernelFaultError, call: str, verb: str) -> KernelFaultError:
    return KernelFaultError(
        call, first.code, first.name, first.detail, first.kernels,
        message=f"{call} {verb}: this context faulted earlier in {_where(first.kernels)} "
                f"({first.name} ({first.code}), first reported by {first.call}): {first.detail}")


def _where(kernels: tuple) -> str:
    names = list(dict.fromkeys(kernels))
    if not names:
        return "a kernel tmaflow did not launch"
    if len(names) == 1:
        return names[0]
    return "one of " + ", ".join(names)


def _report(ordinal: int, what: str, lines: list) -> str:
    if lines:
        launched = ("Kernels launched on it since its last successful synchronize (oldest first; "
                    "the fault is in one of them):\n" + "\n".join(f"  {line}" for line in lines))
    else:
        launched = ("tmaflow launched nothing on it since its last successful synchronize: the "
                    "fault is in another library's kernel (torch, cupy) or in work tmaflow did not see.")
    return (f"{what}. The CUDA context of device {ordinal} is unusable: every later CUDA call on "
            "it fails, in tmaflow, torch or any other library sharing it.\n" + launched + "\n"
            "What to do:\n"
            "  - restart the process (always works; the only way when torch or cupy share the device);\n"
            f"  - or, when nothing else in this process uses the device, tf.Device({ordinal}).reset(): "
            "every array and loaded kernel of the device is lost (kernels reload on their next launch); "
            "it recovers from traps and launch failures, but the driver keeps an illegal address (700) "
            "until the process exits, and reset() then says so;\n"
            "  - to locate the access: run under `compute-sanitizer --tool memcheck python script.py` "
            "(build the kernel with options=['-lineinfo'] or debug=True for file:line), or build it "
            "with debug=True (TMAFLOW_DEBUG=1), which synchronises after every launch so the fault "
            "names the launch that made it.")


# --- describing the record ------------------------------------------------------------------------

def _launches(ordinal: int) -> tuple[tuple, list]:
    """(kernel names, one line per launch): the ring's launches, then the C path's."""
    names, lines = [], []
    maps = _encoded_maps()
    entries = list(_rings.get(ordinal, ()))
    if len(entries) == RING:
        lines.append(f"(only the last {RING} Python-path launches are kept)")
    for where, cfg, raw in entries:
        names.append(where.name)
        lines.append(_describe(where, _stream_text(_stream_of(cfg)), raw, maps))
    for launcher, count in _native_launches(ordinal):
        where = site(launcher)
        names.append(where.name)
        stream = "current" if where.stream is None else _stream_text(where.stream)
        text = _describe(where, stream, None, maps)
        lines.append(f"{text} [C launch path: {count} launch{'es' if count != 1 else ''}]")
    return tuple(names), lines


def _native_launches(ordinal: int) -> list:
    out = []
    for launcher in list(_native.get(ordinal, ())):
        before = _at_sync.get(launcher, {})
        moved = 0
        for key, now in _plan_counts(launcher).items():
            then = before.get(key, 0)
            moved += now - then if now >= then else now  # below: a new plan at a freed one's id
        if moved > 0:
            out.append((launcher, moved))
    return out


def _describe(where: Site, stream: str, raw: bytes | None, maps: dict) -> str:
    """One launch; ``raw=None`` for the C path, which packs each call's arguments on its own
    stack and records none of them."""
    if raw is None:
        args = "arguments not recorded on the C launch path"
    else:
        args = ", ".join(_argument(p, raw[p.offset:p.offset + p.size], maps) for p in where.params)
    return (f"{where.name} grid={where.grid} block={where.block} cluster={where.cluster} "
            f"smem={where.smem} stream={stream} ({args})")


_FLOATS = {2: "<e", 4: "<f", 8: "<d"}


def _argument(param, data: bytes, maps: dict) -> str:
    label = " ".join((param.ctype or f"argument {param.index}").split())
    if param.kind == "tensormap" or len(data) == 128 and data in maps:
        spec = maps.get(data)
        if spec is None:
            return f"{label}: a tensor map not in tmaflow's encode cache"
        where = "" if spec.address is None else f" at 0x{spec.address:x}"
        return f"{label}: {spec.dtype.name} shape {spec.shape} box {spec.box}{where}"
    if param.kind == "float" and len(data) in _FLOATS:
        return f"{label}={struct.unpack(_FLOATS[len(data)], data)[0]!r}"
    if param.kind == "int":
        return f"{label}={int.from_bytes(data, 'little', signed=param.signed is not False)}"
    if len(data) == 8:  # pointers, 64-bit words, untyped 8-byte values
        return f"{label}=0x{int.from_bytes(data, 'little'):x}"
    return f"{label}=0x{data.hex()}" if len(data) <= 16 else f"{label}: {len(data)} bytes"


def _encoded_maps() -> dict:
    from ..tma.tensormap import _encode_cache  # a circle: tensormap -> driver -> faults

    return {raw: spec for spec, raw in list(_encode_cache.values())}


def _stream_of(cfg) -> int | None:
    stream = getattr(cfg, "hStream", None)
    return None if stream is None else int(stream)


def _stream_text(stream: int | None) -> str:
    return "?" if stream is None else f"0x{stream:x}"


def _context_ordinal() -> int:
    """The tmaflow device whose primary context is current on this thread (asked of the
    driver: torch may have made another current), else the thread's tmaflow device."""
    from .device import _devices, current_ordinal  # a circle: device -> faults
    from .driver import cu  # a circle: driver -> faults

    try:
        err, context = cu().cuCtxGetCurrent()
    except Exception:  # no driver library: nothing can be current
        return current_ordinal()
    if int(err) == 0 and int(context):
        for ordinal, dev in list(_devices.items()):
            if int(dev.context) == int(context):
                return ordinal
    return current_ordinal()
