"""Compiled-kernel cache: in-process dict plus an on-disk store of checksummed entries.

An entry is written to a temporary name in its directory and renamed into place, so
concurrent writers leave exactly one complete file. A truncated or corrupted entry fails
its checksum and is rebuilt. ``TMAFLOW_CACHE=0`` turns both levels off.
"""
from __future__ import annotations

import hashlib
import json
import logging
import os
import struct
import tempfile
import threading
from pathlib import Path

from . import env

log = logging.getLogger("tmaflow.cache")

_MAGIC = b"TMAFLOW1"
_memory: dict[str, dict] = {}
_lock = threading.Lock()


def enabled() -> bool:
    return env.flag("TMAFLOW_CACHE", True)


def cache_dir() -> Path:
    env = os.environ.get("TMAFLOW_CACHE_DIR")
    if env:
        return Path(env)
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "tmaflow"


def _path(key: str) -> Path:
    return cache_dir() / key[:2] / f"{key}.tfbin"


def encode_entry(meta: dict, blobs: dict[str, bytes]) -> bytes:
    meta = dict(meta, blobs={k: len(v) for k, v in blobs.items()})
    header = json.dumps(meta, sort_keys=True).encode()
    payload = header + b"".join(blobs[k] for k in sorted(blobs))
    digest = hashlib.sha256(payload).digest()
    return _MAGIC + struct.pack("<Q", len(header)) + digest + payload


def decode_entry(data: bytes) -> tuple[dict, dict[str, bytes]] | None:
    """Return ``(meta, blobs)``, or None when the bytes are not an intact entry."""
    fixed = len(_MAGIC) + 8 + 32
    if len(data) < fixed or not data.startswith(_MAGIC):
        return None
    (hlen,) = struct.unpack_from("<Q", data, len(_MAGIC))
    digest, payload = data[len(_MAGIC) + 8:fixed], data[fixed:]
    if hashlib.sha256(payload).digest() != digest or hlen > len(payload):
        return None
    try:
        meta = json.loads(payload[:hlen])
    except ValueError:
        return None
    blobs, pos = {}, hlen
    for name in sorted(meta["blobs"]):
        n = meta["blobs"][name]
        blobs[name] = payload[pos:pos + n]
        pos += n
    if pos != len(payload):
        return None
    return meta, blobs


def load(key: str):
    """``(meta, blobs, where)`` from memory or disk, where is "memory" | "disk"; else None."""
    if not enabled():
        return None
    with _lock:
        hit = _memory.get(key)
    if hit is not None:
        return hit["meta"], hit["blobs"], "memory"
    path = _path(key)
    try:
        data = path.read_bytes()
    except OSError:
        return None
    entry = decode_entry(data)
    if entry is None:
        log.warning("corrupt cache entry %s: rebuilding", path)
        try:
            path.unlink()
        except OSError:
            pass
        return None
    meta, blobs = entry
    with _lock:
        _memory[key] = {"meta": meta, "blobs": blobs}
    return meta, blobs, "disk"


def store(key: str, meta: dict, blobs: dict[str, bytes]) -> None:
    if not enabled():
        return
    with _lock:
        _memory[key] = {"meta": meta, "blobs": blobs}
    path = _path(key)
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{key[:16]}.", suffix=".tmp")
        try:
            with os.fdopen(fd, "wb") as f:
                f.write(encode_entry(meta, blobs))
            os.replace(tmp, path)
        except BaseException:
            try:
                os.unlink(tmp)
            except OSError:
                pass
            raise
    except OSError as exc:  # a read-only or full cache dir must not break compilation
        log.warning("could not write cache entry %s: %s", path, exc)


def clear_memory() -> None:
    with _lock:
        _memory.clear()


def info() -> dict:
    """Entries and bytes on disk; files removed meanwhile (another process's ``clear``) are
    simply not counted."""
    root = cache_dir()
    entries = size = 0
    for f in (root.glob("*/*.tfbin") if root.exists() else ()):
        try:
            size += f.stat().st_size
            entries += 1
        except OSError:
            continue
    return {"dir": str(root), "enabled": enabled(), "entries": entries, "bytes": size,
            "in_memory": len(_memory)}


def clear() -> int:
    """Delete every on-disk entry and the in-process cache; return how many files went."""
    clear_memory()
    root = cache_dir()
    n = 0
    if root.exists():
        for f in list(root.glob("*/*.tfbin")) + list(root.glob("*/.*.tmp")):
            try:
                f.unlink()
                n += 1
            except OSError:
                pass
    return n
