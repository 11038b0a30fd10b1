"""Disassembly through the NVIDIA tool wheels (the ``tools`` extra) or a CUDA toolkit."""
from __future__ import annotations

import os
import re
import shutil
import subprocess
import tempfile

from ..errors import TmaflowError


def find_tool(name: str) -> str | None:
    try:
        import cuda.pathfinder as pf

        found = pf.find_nvidia_binary_utility(name)
        if found:
            return str(found)
    except Exception:  # not installed, or pathfinder's own not-found errors
        pass
    return shutil.which(name)


def disassemble(cubin: bytes) -> str:
    """SASS of a CUBIN via ``cuobjdump --dump-sass`` (falls back to ``nvdisasm``)."""
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "kernel.cubin")
        with open(path, "wb") as f:
            f.write(cubin)
        for tool, args in (("cuobjdump", ["--dump-sass"]), ("nvdisasm", [])):
            exe = find_tool(tool)
            if exe:
                out = subprocess.run([exe, *args, path], capture_output=True, text=True)
                if out.returncode == 0:
                    return out.stdout
        raise TmaflowError("no disassembler found: install the tools extra "
                           "(pip install 'tmaflow[tools]') or put cuobjdump on PATH")


_SASS_LINE = re.compile(r"\s*/\*([0-9a-f]{4,})\*/\s+(.*?);")
_BRANCH = re.compile(r"\bBRA\b.*?(0x[0-9a-f]+)")


def sass_opcodes(sass: str) -> set[str]:
    """Opcodes (first token after the address comment) appearing in SASS text."""
    ops = set()
    for line in sass.splitlines():
        line = line.strip()
        if line.startswith("/*") and "*/" in line:
            body = line.split("*/", 1)[1].strip()
            if body and not body.startswith("/*"):
                token = body.split()[0].rstrip(";")
                if token.startswith("@"):
                    parts = body.split()
                    token = parts[1] if len(parts) > 1 else token
                ops.add(token.split(".")[0])
    return ops


def sass_instructions(sass: str) -> list[tuple[int, str]]:
    """(address, instruction text without the ';') of every instruction in SASS text."""
    out = []
    for line in sass.splitlines():
        m = _SASS_LINE.match(line)
        if m:
            out.append((int(m.group(1), 16), m.group(2).strip()))
    return out


def sass_loops(sass: str) -> list[list[str]]:
    """The body of every loop in SASS text (a backward branch to an instruction of the same
    function), innermost first: how many instructions a kernel's main loop issues each trip."""
    ins = sass_instructions(sass)
    index = {address: i for i, (address, _) in enumerate(ins)}
    loops = []
    for i, (address, text) in enumerate(ins):
        m = _BRANCH.search(text)
        if m and int(m.group(1), 16) < address and int(m.group(1), 16) in index:
            loops.append([t for _, t in ins[index[int(m.group(1), 16)]:i + 1]])
    return sorted(loops, key=len)
