"""Compiled-kernel cache: in-process dict plus an on-disk store of checksummed entries.

An entry is written to a temporary name in its directory, flushed to disk and renamed into
place, so concurrent writers leave exactly one complete file. Reading opens regular files
only (a FIFO in an entry's place would block). An entry that is truncated, corrupted, of
another format or malformed is a miss: it is rebuilt and overwritten. A cache directory that
cannot be used (a regular file, a path too long) is named with the fix: compilation goes on
without the disk with a warning; ``info`` and ``clear`` raise. ``TMAFLOW_CACHE=0`` turns both
levels off.
"""
from __future__ import annotations

import hashlib
import json
import logging
import os
import stat
import struct
import tempfile
import threading
import warnings
from pathlib import Path

from .. import env
from ..errors import TmaflowError, TmaflowWarning

log = logging.getLogger("tmaflow.cache")

_FORMAT = b"TMAFLOW"
_MAGIC = _FORMAT + b"1"  # the format's version is its last byte
_BELOW_ROOT = 96  # the longest relative path tmaflow writes in the cache (entries, native/)
_memory: dict[str, dict] = {}
_lock = threading.Lock()
_warned: set[str] = set()


def enabled() -> bool:
    return env.flag("TMAFLOW_CACHE", True)


def cache_dir() -> Path:
    """``TMAFLOW_CACHE_DIR`` (``~`` expanded), else ``$XDG_CACHE_HOME/tmaflow``, else
    ``~/.cache/tmaflow``."""
    chosen = env.directory("TMAFLOW_CACHE_DIR")
    if chosen is not None:
        return chosen
    return (env.directory("XDG_CACHE_HOME") or Path(os.path.expanduser("~")) / ".cache") / "tmaflow"


def _path_limits() -> tuple[int, int]:
    """(longest path, longest file name) in bytes."""
    try:
        return os.pathconf("/", "PC_PATH_MAX"), os.pathconf("/", "PC_NAME_MAX")
    except (OSError, ValueError, AttributeError):  # no pathconf: the common Linux limits
        return 4096, 255


def usable_dir() -> Path:
    """``cache_dir()`` once it can hold entries (it need not exist yet), else a TmaflowError
    naming ``TMAFLOW_CACHE_DIR`` and the fix."""
    root = cache_dir()
    where = f"the compile cache directory {str(root)!r} (TMAFLOW_CACHE_DIR)"
    path_max, name_max = _path_limits()
    longest = max(len(os.fsencode(part)) for part in root.parts) if root.parts else 0
    if longest > name_max or len(os.fsencode(root)) + _BELOW_ROOT >= path_max:
        raise TmaflowError(f"{where} is too long: names must be at most {name_max} bytes and the "
                           f"whole path under {path_max - _BELOW_ROOT} bytes; set "
                           "TMAFLOW_CACHE_DIR to a shorter directory")
    try:
        mode = os.stat(root).st_mode
    except FileNotFoundError:
        return root  # made when the first entry is written
    except OSError as exc:
        raise TmaflowError(f"{where} cannot be used ({exc.strerror}); set TMAFLOW_CACHE_DIR to a "
                           "writable directory") from None
    if not stat.S_ISDIR(mode):
        raise TmaflowError(f"{where} is not a directory; remove it or set TMAFLOW_CACHE_DIR to a "
                           "directory")
    return root


def _disk_root() -> Path | None:
    """The usable cache directory, or None after a warning (once per problem): compilation
    goes on without the disk."""
    try:
        return usable_dir()
    except TmaflowError as exc:
        text = str(exc)
        if text not in _warned:
            _warned.add(text)
            warnings.warn(f"{text}; compiling without the on-disk cache", TmaflowWarning,
                          stacklevel=4)
        return None


class NotRegularFile(OSError):
    """A FIFO, device, socket or directory where a cached file belongs."""


def read_regular(path: Path) -> bytes:
    """The bytes of ``path`` if it is a regular file: opened without blocking and checked
    before reading (a FIFO would block forever, a device never end). OSError otherwise."""
    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0))
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise NotRegularFile(f"{path} is not a regular file")
        with os.fdopen(fd, "rb", closefd=False) as f:
            return f.read()
    finally:
        os.close(fd)


def write_durably(f, data: bytes) -> None:
    """Write ``data`` to the open file ``f`` and flush it to the disk (before a rename
    publishes it: a crash must not leave a published name on missing bytes)."""
    f.write(data)
    f.flush()
    os.fsync(f.fileno())


def _path(root: Path, key: str) -> Path:
    return root / key[:2] / f"{key}.tfbin"


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
    except (ValueError, RecursionError):
        return None
    sizes = meta.get("blobs") if isinstance(meta, dict) else None
    if not isinstance(sizes, dict) or any(type(n) is not int or n < 0 for n in sizes.values()):
        return None
    blobs, pos = {}, hlen
    for name in sorted(sizes):
        n = sizes[name]
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
    root = _disk_root()
    if root is None:
        return None
    path = _path(root, key)
    try:
        data = read_regular(path)
    except NotRegularFile:
        log.warning("cache entry %s is not a regular file: rebuilding over it", path)
        return None
    except OSError:
        return None
    if data.startswith(_FORMAT) and not data.startswith(_MAGIC):
        log.info("cache entry %s is of another format version: rebuilding", path)
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
    root = _disk_root()
    if root is None:
        return
    path = _path(root, key)
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{key[:16]}.", suffix=".tmp")
        try:
            with os.fdopen(fd, "wb") as f:
                write_durably(f, encode_entry(meta, blobs))
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
    simply not counted. A TmaflowError when the cache directory cannot be used."""
    root = usable_dir()
    entries = size = 0
    for f in (root.glob("*/*.tfbin") if root.is_dir() else ()):
        try:
            size += f.stat().st_size
            entries += 1
        except OSError:
            continue
    return {"dir": str(root), "enabled": enabled(), "entries": entries, "bytes": size,
            "in_memory": len(_memory)}


def clear() -> int:
    """Delete every on-disk entry and the in-process cache; return how many files went. A
    TmaflowError when the cache directory cannot be used."""
    clear_memory()
    root = usable_dir()
    n = 0
    if root.is_dir():
        for f in list(root.glob("*/*.tfbin")) + list(root.glob("*/.*.tmp")):
            try:
                f.unlink()
                n += 1
            except OSError:
                pass
    return n
