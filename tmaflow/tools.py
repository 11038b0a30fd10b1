"""Disassembly through the NVIDIA tool wheels (the ``tools`` extra) or a CUDA toolkit."""
from __future__ import annotations

import os
import shutil
import subprocess
import tempfile

from .errors import TmaflowError


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
