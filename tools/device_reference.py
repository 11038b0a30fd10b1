"""Render docs/device-library.md from the device headers (tmaflow/include/tmaflow/*.cuh): every
function with its signature and the comment above it, grouped by namespace and header.

    python tools/device_reference.py           # write the page
    python tools/device_reference.py --check   # exit 1 if the page is out of date (CI test)
"""
from __future__ import annotations

import re
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
HEADERS = ROOT / "tmaflow" / "include" / "tmaflow"
PAGE = ROOT / "docs" / "device-library.md"
ORDER = ["prelude", "mbarrier", "tma", "bulk", "cp_async", "cluster", "fence", "warp", "wgmma",
         "pipeline", "debug"]
_FUNC = re.compile(r"TMAFLOW_DEVICE\s+([\w:<>\s\*&]+?)\s+(\w+)\s*\(([^)]*)\)")


def _entries(text: str):
    """(comment, return type, name, parameters) of each device function, in order; macro
    families (one function per coordinate count) appear once."""
    lines = text.splitlines()
    seen, out, comment = set(), [], []
    for line in lines:
        stripped = line.strip()
        if stripped.startswith("//"):
            comment.append(stripped[2:].strip())
            continue
        m = _FUNC.search(line)
        if m:
            ret, name, params = (" ".join(g.split()) for g in m.groups())
            params = params.replace("TMAFLOW_UNPAREN PARAMS", "int c0, ... (coordinates, innermost first)")
            if (name, params) not in seen:
                seen.add((name, params))
                out.append((" ".join(comment), ret, name, params))
        if (not stripped.startswith(("#define", "template")) or m) and not stripped.endswith("\\"):
            comment = []
    return out


def render() -> str:
    parts = ["# The device library", "",
             "`#include <tmaflow.cuh>` (found on the include path of every tmaflow `Kernel`) brings "
             "in the headers below, one hardware unit each, in namespaces `tmaflow::<unit>`. One "
             "PTX instruction per function, named for its effect; the comment names the "
             "instruction and what is surprising about it.", "",
             "**Coordinates on the device are innermost-first** (PTX order): a box at row-major "
             "element `(row, col)` of a 2-D map is `tma::load(dst, &map, bar, col, row)`. Python "
             "(shapes, boxes, `tf.reference` coordinates) is row-major; the reversal happens in "
             "`TensorMapSpec.driver_order` on the host and at this call on the device.", "",
             "Generated from the headers by `python tools/device_reference.py` (a test keeps it "
             "current).", ""]
    names = sorted(HEADERS.glob("*.cuh"), key=lambda p: (ORDER.index(p.stem) if p.stem in ORDER
                                                         else len(ORDER), p.stem))
    for path in names:
        text = path.read_text()
        head = []
        for line in text.splitlines():
            if not line.startswith("//"):
                break
            head.append(line[2:].strip())
        ns = re.findall(r"namespace\s+tmaflow\s*\{\s*namespace\s+(\w+)", text)
        title = f"`tmaflow::{ns[0]}`" if ns else "`tmaflow`"
        parts += [f"## {title} — `{path.name}`", "", " ".join(head), ""]
        entries = _entries(text)
        if entries:
            parts += ["| function | what it does |", "| --- | --- |"]
            for comment, ret, name, params in entries:
                sig = f"`{ret} {name}({params})`".replace("|", "\\|")
                parts.append(f"| {sig} | {comment.replace('|', chr(92) + '|') or '—'} |")
            parts.append("")
    return "\n".join(parts).rstrip() + "\n"


def main(argv=None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    page = render()
    if "--check" in argv:
        current = PAGE.read_text() if PAGE.exists() else ""
        if current != page:
            print(f"{PAGE.relative_to(ROOT)} is out of date: run python tools/device_reference.py")
            return 1
        return 0
    PAGE.write_text(page)
    print(f"wrote {PAGE.relative_to(ROOT)} ({page.count(chr(10))} lines)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
