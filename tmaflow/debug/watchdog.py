"""Host side of the debug-build watchdog: hangs become ``DeadlockError``.

A debug kernel (``debug=True`` or ``TMAFLOW_DEBUG=1``) bounds every tmaflow barrier wait.
A wait that times out writes a record into pinned, device-mapped host memory (readable
even if the context later faults), raises a device-wide abort flag so every other bounded
wait gives up at once, and lets the kernel run to its end. The launch is synchronous in
debug builds; afterwards the host reads the records and raises.
"""
from __future__ import annotations

import ctypes

from .. import checks, env
from ..errors import CudaError, DeadlockError, TmaflowError
from ..runtime import driver

SLOTS = 64
NAME_LEN = 32
FILE_LEN = 48
STICKY = {700, 701, 702, 709, 714, 715, 716, 717, 718, 719, 720}


class Record(ctypes.Structure):
    # Mirrors tmaflow::debug::Record in include/tmaflow/debug.cuh.
    _fields_ = [("magic", ctypes.c_uint32), ("block", ctypes.c_uint32 * 3),
                ("thread", ctypes.c_uint32), ("cluster_rank", ctypes.c_uint32),
                ("smem_offset", ctypes.c_uint32), ("stage", ctypes.c_int32),
                ("parity", ctypes.c_uint32), ("tx_bytes", ctypes.c_uint32),
                ("line", ctypes.c_uint32), ("waited_us", ctypes.c_uint32),
                ("rank", ctypes.c_int32), ("peer", ctypes.c_int32), ("signal", ctypes.c_uint32),
                ("expected", ctypes.c_uint32), ("seen", ctypes.c_uint32),
                ("name", ctypes.c_char * NAME_LEN), ("file", ctypes.c_char * FILE_LEN)]


MAGIC = 0x7F10D0C4
RECORDS_BYTES = ctypes.sizeof(Record) * SLOTS


def env_debug() -> bool:
    return env.flag("TMAFLOW_DEBUG", False)


def default_seconds() -> float:
    return check_seconds("TMAFLOW_WATCHDOG_S", env.seconds("TMAFLOW_WATCHDOG_S", 1.0))


def check_seconds(field: str, value) -> float:
    """A wait bound in seconds; the debug build compiles it in as a 64-bit count of
    nanoseconds (``nanoseconds``), which must be in [1, 2^64)."""
    seconds = checks.as_float(field, value)
    if not 1 <= seconds * 1e9 < 2.0 ** 64:
        raise TmaflowError(f"{field}={value!r} must be a positive number of seconds in "
                           f"[1e-9, {2 ** 64 / 1e9:.4g}] (1 ns to 2^64 ns)")
    return seconds


def nanoseconds(seconds: float) -> int:
    """The compiled-in bound of a wait of ``seconds`` (checked by ``check_seconds``)."""
    return max(1, int(seconds * 1e9))


class Watch:
    """Per-module watchdog state: the mapped record buffer and the device state global."""

    def __init__(self, module, device):
        self.device = device
        self._generation = device.generation
        self.state = driver.module_global(module, b"tmaflow_watchdog_state")  # None: no waits, inert
        self.host = None
        if self.state is None:
            return
        self.host, dev_ptr = driver.mapped_host(RECORDS_BYTES)
        # state = {u32 abort, u32 slots, Record* records}
        driver.call("cuMemcpyHtoD", self.state + 8, dev_ptr.to_bytes(8, "little"), 8)
        self.records = (Record * SLOTS).from_address(self.host)

    def close(self) -> None:
        """Free the pinned record buffer (the module it watched is being unloaded)."""
        if self.host is not None and self.device.generation == self._generation:
            driver.call("cuMemFreeHost", self.host)
        self.host, self.state = None, None

    def arm(self) -> None:
        if self.state is not None:
            ctypes.memset(self.host, 0, RECORDS_BYTES)
            driver.call("cuMemsetD32", self.state, 0, 2)

    def check(self, stream: int, kernel, before_reset=None) -> None:
        """Synchronise; raise DeadlockError if any bounded wait timed out. ``before_reset()``
        runs before a fault resets the context (to copy out what the reset would free)."""
        err = driver.cu().cuStreamSynchronize(stream)[0]
        # Copy the records out first: a context reset frees the pinned buffer.
        found = [_as_dict(r) for r in self.records if r.magic == MAGIC] \
            if self.state is not None else []
        # The longest wait started first: most likely the barrier that began the hang.
        found.sort(key=lambda d: -d["waited_us"])
        fault = ""
        if int(err) != 0:
            fault = driver._error_name(err)
            if int(err) in STICKY:
                if before_reset is not None:
                    try:
                        before_reset()
                    except Exception:  # a failed copy must not hide the fault
                        pass
                self.state = None  # the buffer and the module die with the context
                self.device.reset()  # so the process can compile and launch again
            if not found:
                raise CudaError("cuStreamSynchronize", int(err), fault,
                                f"after launching {kernel.name}; the context was reset")
        if found:
            msg = _message(kernel, found)
            if fault:
                msg += f" The kernel then faulted ({fault}); the context was reset."
            raise DeadlockError(msg, found)


def _as_dict(r: Record) -> dict:
    return {"block": tuple(r.block), "thread": r.thread, "cluster_rank": r.cluster_rank,
            "barrier": r.name.decode(errors="replace") or f"smem+{r.smem_offset}",
            "smem_offset": r.smem_offset, "stage": r.stage, "parity": r.parity,
            "tx_bytes": r.tx_bytes, "file": r.file.decode(errors="replace"), "line": r.line,
            "waited_us": r.waited_us, "rank": r.rank, "peer": r.peer, "signal": r.signal,
            "expected": r.expected, "seen": r.seen}


def _message(kernel, recs: list[dict]) -> str:
    """First stuck wait in full, then every other stuck barrier once."""
    first = recs[0]

    def where(d):
        if d["rank"] >= 0:  # a cross-GPU signal wait (signal.cuh)
            return (f"rank {d['rank']}: signal {d['signal']} from rank {d['peer']} (waiting for "
                    f"{d['expected']}, saw {d['seen']}; {d['file']}:{d['line']})")
        stage = f" stage {d['stage']}" if d["stage"] >= 0 else ""
        tx = f", expecting {d['tx_bytes']} tx bytes" if d["tx_bytes"] else ""
        return (f"barrier '{d['barrier']}'{stage} (block {d['block']} thread {d['thread']}, "
                f"parity {d['parity']}{tx}, {d['file']}:{d['line']})")

    others, seen = [], {(first["barrier"], first["stage"], first["signal"])}
    for d in recs[1:]:
        key = (d["barrier"], d["stage"], d["signal"])
        if key not in seen:
            seen.add(key)
            others.append(where(d))
    text = (f"{kernel.name}: {where(first)} never completed within "
            f"{first['waited_us'] / 1e6:.2f} s")
    if others:
        text += "; also stuck: " + "; ".join(others)
    text += f" [{len(recs)} timed-out waits recorded]."
    if first["rank"] >= 0:
        return text + (f" Rank {first['peer']} never put the signal: is it running the same "
                       "collective with the same shapes, or stuck itself (its own DeadlockError)?")
    return text + (" Check the arrival count, the announced transaction bytes, the phase parity "
                   "and the multicast mask.")
