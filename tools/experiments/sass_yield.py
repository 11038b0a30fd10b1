"""Experiment (used by tools/experiments/fp8_ab.py; a module, no command line of its own): edit the scheduling bits ptxas set on a kernel's FFMA
runs in its CUBIN, as DeepGEMM does to its fp8 promotion.

A Hopper instruction is 16 bytes; the high 64-bit word carries its control bits (stall cycles,
yield, scoreboards, wait mask, operand reuse). DeepGEMM found that letting the warp scheduler
switch warps inside the long FFMA runs that promote fp8 partial sums lets the other
warpgroup's wgmma issue sooner. Switching invalidates the operand reuse cache, so an
instruction that yields must not set a reuse flag. Neither bit changes what an instruction
computes: only when it issues and where an operand is read from.

Measured on H200 (session 8, block-scaled 4096x7168x16384): ptxas 13 already alternates the
yield bit along the promotion's FFMAs; more yields (9/16, all) ran 2-6% slower and none (every
FFMA holding the warp) 6% slower, so tmaflow ships no such patch.
"""
from __future__ import annotations

import struct

from tmaflow import TmaflowError

INSTRUCTION_BYTES = 16
_OPCODE_MASK = 0xFFF       # low word: the opcode of the register form
_FFMA = 0x223              # FFMA Rd, Ra, Rb, Rc (every operand a register)
_YIELD = 1 << 45           # high word: 1 keeps issuing this warp, 0 lets the scheduler switch
_REUSE = 0xF << 58         # high word: operand reuse-cache flags (slots a, b, c, d)


def text_section(cubin: bytes, symbol: str) -> tuple[int, int]:
    """(file offset, size) of the ``.text.<symbol>`` section of an ELF64 CUBIN."""
    if len(cubin) < 64 or cubin[:4] != b"\x7fELF" or cubin[4] != 2:
        raise TmaflowError("sass_yield: the CUBIN is not a 64-bit ELF file")
    shoff, = struct.unpack_from("<Q", cubin, 0x28)
    shentsize, shnum, shstrndx = struct.unpack_from("<HHH", cubin, 0x3A)
    headers = [struct.unpack_from("<IIQQQQ", cubin, shoff + i * shentsize) for i in range(shnum)]
    names = headers[shstrndx][4]
    wanted = f".text.{symbol}".encode()
    for name, _type, _flags, _addr, offset, size in headers:
        end = cubin.index(b"\0", names + name)
        if cubin[names + name:end] == wanted:
            return offset, size
    raise TmaflowError(f"sass_yield: the CUBIN has no section .text.{symbol}")


def ffma_runs(code: bytes, min_run: int) -> list[tuple[int, int]]:
    """(first, count) of each run of at least ``min_run`` consecutive register FFMAs."""
    runs, start = [], None
    n = len(code) // INSTRUCTION_BYTES
    for i in range(n + 1):
        is_ffma = i < n and (struct.unpack_from("<Q", code, i * INSTRUCTION_BYTES)[0] & _OPCODE_MASK) == _FFMA
        if is_ffma and start is None:
            start = i
        elif not is_ffma and start is not None:
            if i - start >= min_run:
                runs.append((start, i - start))
            start = None
    return runs


def _edit_ffma_runs(cubin: bytes, symbol: str, fraction: float, min_run: int, edit) -> tuple[bytes, int]:
    """The CUBIN with ``edit(high word)`` (None: unchanged) applied to the first ``fraction``
    of each run of at least ``min_run`` FFMAs, and how many instructions changed."""
    offset, size = text_section(cubin, symbol)
    out, changed = bytearray(cubin), 0
    for first, count in ffma_runs(cubin[offset:offset + size], min_run):
        for i in range(first, first + int(count * fraction)):
            at = offset + i * INSTRUCTION_BYTES + 8
            high = edit(struct.unpack_from("<Q", out, at)[0])
            if high is not None:
                struct.pack_into("<Q", out, at, high)
                changed += 1
    return bytes(out), changed


def yield_in_ffma_runs(cubin: bytes, symbol: str, *, fraction: float = 9 / 16,
                       min_run: int = 32) -> tuple[bytes, int]:
    """The CUBIN with every reuse-flagged FFMA in the first ``fraction`` of each run of at
    least ``min_run`` FFMAs turned into one that yields and reuses nothing (DeepGEMM's
    interleave), and how many instructions changed."""
    if not 0 < fraction <= 1:
        raise TmaflowError(f"sass_yield: fraction={fraction!r} must be in (0, 1]")
    return _edit_ffma_runs(cubin, symbol, fraction, min_run,
                           lambda high: high & ~(_REUSE | _YIELD) if high & _REUSE and high & _YIELD else None)


def hold_in_ffma_runs(cubin: bytes, symbol: str, min_run: int = 32) -> tuple[bytes, int]:
    """The CUBIN with every FFMA of each long run marked to keep issuing from its warp (yield
    bit set), and how many instructions changed."""
    return _edit_ffma_runs(cubin, symbol, 1.0, min_run, lambda high: None if high & _YIELD else high | _YIELD)
