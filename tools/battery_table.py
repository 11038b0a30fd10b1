"""Render the bad-input battery (tests/battery.py) as docs/bad-input-battery.md."""
from __future__ import annotations

import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests"))

from battery import CASES  # noqa: E402


def main() -> None:
    lines = ["# The bad-input battery", "",
             f"{len(CASES)} cases (`tests/battery.py`, run by `tests/test_battery.py`). Each must raise "
             "the error below with a message matching the pattern, without crashing or hanging "
             "the process; on a Hopper GPU every case is followed by a correct launch that must "
             "give the right answer. Cases marked GPU need a device; the rest also run in CI.", "",
             "| # | area | input | error | message (regex) | GPU |", "| --- | --- | --- | --- | --- | --- |"]
    for i, c in enumerate(CASES, 1):
        pattern = c.match.replace("|", "\\|")
        lines.append(f"| {i} | {c.area} | {c.what} | `{c.error.__name__}` | `{pattern}` | "
                     f"{'yes' if c.gpu else ''} |")
    (ROOT / "docs" / "bad-input-battery.md").write_text("\n".join(lines) + "\n")
    print(f"wrote {len(CASES)} cases")


if __name__ == "__main__":
    main()
