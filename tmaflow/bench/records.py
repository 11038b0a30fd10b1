"""Bench JSON files: the figures of one area (``bench/results/<area>.json``) with the device,
driver, commit, command and date they were measured with; ``tools/docs/benchmarks_page.py``
renders them into BENCHMARKS.md."""
from __future__ import annotations

import datetime
import json
import os
import subprocess
import sys
from pathlib import Path

from ..runtime.device import current_device
from .internals import call

FORMAT = 1


def commit(root: Path | None = None) -> str:
    """The COMMIT file a copied tree carries (the device machine's copy can hold a stale git
    HEAD: records taken there named the session's starting commit), else the checkout's."""
    root = Path(__file__).resolve().parents[2] if root is None else root
    marker = root / "COMMIT"
    if marker.exists():
        return marker.read_text().strip() or "unknown"
    try:
        return subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=root, capture_output=True,
                              text=True, check=True).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return "unknown"


def environment() -> dict:
    """Device, driver, commit, command line and date of this run."""
    driver = call("cuDriverGetVersion")
    env = {"device": current_device().name, "driver": f"{driver // 1000}.{driver % 1000 // 10}",
           "commit": commit(), "command": " ".join(["python", *sys.argv]),
           "date": datetime.date.today().isoformat()}
    try:
        import torch  # optional: the peer's version where there is one
        env["torch"] = torch.__version__
    except ImportError:
        pass
    return env


def write(path: str | os.PathLike, area: str, title: str, columns: list[str], rows: list[dict],
          **extra) -> None:
    """Write one area's figures: ``rows`` of ``columns`` (a table), with the environment."""
    record = {"format": FORMAT, "area": area, "title": title, **environment(), **extra,
              "columns": columns, "rows": rows}
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + f".{os.getpid()}.tmp")
    tmp.write_text(json.dumps(record, indent=1) + "\n")
    os.replace(tmp, path)
