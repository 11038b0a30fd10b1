"""Render the bad-input battery (tests/battery.py) as docs/bad-input-battery.md:
    python tools/battery_table.py           # write the page
    python tools/battery_table.py --check   # exit 1 if the page is out of date (CI test)"""
from __future__ import annotations

import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests"))

from battery import CASES  # noqa: E402


def render() -> str:
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
    return "\n".join(lines) + "\n"


def main(argv: list[str]) -> int:
    page = ROOT / "docs" / "bad-input-battery.md"
    text = render()
    if "--check" in argv:
        if not page.exists() or page.read_text() != text:
            print("docs/bad-input-battery.md is out of date: run python tools/battery_table.py")
            return 1
        return 0
    page.write_text(text)
    print(f"wrote {len(CASES)} cases")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
