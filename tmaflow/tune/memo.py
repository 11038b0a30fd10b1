"""The tuner's memory on disk: one JSON file per tuned function next to the compile cache
(``<cache dir>/autotune/<name>.json``), entries keyed by the call's key and a hash of what was
tuned. Written atomically (a temporary file renamed into place); a file that cannot be read or
parsed is ignored (and replaced at the next write), never an error."""
from __future__ import annotations

import json
import logging
import os
import re
from pathlib import Path

from ..cache import cache_dir

FORMAT = 1
log = logging.getLogger("tmaflow.autotune")


def memo_path(name: str, root: Path | None = None) -> Path:
    """Where ``name``'s choices are kept."""
    safe = re.sub(r"[^A-Za-z0-9_.-]", "_", name)[:100] or "tuned"
    return (root or cache_dir()) / "autotune" / f"{safe}.json"


class Memo:
    """Choices of one tuned function: ``get(key, source)`` / ``put(key, source, entry)``."""

    def __init__(self, path: Path):
        self.path = Path(path)

    def _entries(self) -> dict:
        try:
            data = json.loads(self.path.read_text())
        except FileNotFoundError:
            return {}
        except (OSError, ValueError) as exc:  # unreadable or corrupt: tune again, rewrite it
            log.warning("autotune memo %s ignored: %s", self.path, exc)
            return {}
        if not isinstance(data, dict) or data.get("format") != FORMAT or not isinstance(data.get("entries"), dict):
            log.warning("autotune memo %s ignored: not a format-%d memo", self.path, FORMAT)
            return {}
        return data["entries"]

    def get(self, key: str, source: str) -> dict | None:
        """The entry for ``key`` tuned from ``source`` (a hash), or None."""
        entry = self._entries().get(key)
        if not isinstance(entry, dict) or entry.get("source") != source or not isinstance(entry.get("choice"), int):
            return None
        return entry

    def put(self, key: str, source: str, entry: dict) -> None:
        """Record ``entry`` (its ``choice`` an index into the variants) for ``key``."""
        entries = self._entries()
        entries[key] = dict(entry, source=source)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        tmp = self.path.with_name(f"{self.path.name}.{os.getpid()}.tmp")
        tmp.write_text(json.dumps({"format": FORMAT, "entries": entries}, indent=1) + "\n")
        os.replace(tmp, self.path)

    def __repr__(self) -> str:
        return f"Memo({str(self.path)!r})"
