"""Render the bad-input battery as docs/bad-input-battery.md: the generated table (every
public parameter x every hostile kind, tests/hostile_*.py run by tests/test_hostile.py) and
the rule cases (tests/battery.py, run by tests/test_battery.py):
    PYTHONPATH=tests python tools/docs/battery_table.py           # write the page
    PYTHONPATH=tests python tools/docs/battery_table.py --check   # exit 1 if the page is out of date (CI test)"""
from __future__ import annotations

import sys
from pathlib import Path

from battery import CASES  # tests/ on PYTHONPATH, as pytest has it
from hostile_kinds import KINDS
from test_hostile import PARAMS, expected

ROOT = Path(__file__).resolve().parents[2]

MARK = {"valid": "ok", "skip": "·"}  # anything else: the error's initial letters


def _short(name: str) -> str:
    return "".join(c for c in name if c.isupper()) or name


def _escape(text: str) -> str:
    return text.replace("|", "\\|")


def table() -> list[str]:
    functions = list(dict.fromkeys(p.function for p in PARAMS))
    errors = sorted({p.error.__name__ for p in PARAMS})
    cases = sum(expected(p, k) != "skip" for p in PARAMS for k in KINDS)
    lines = [f"## The generated table: {len(PARAMS)} parameters x {len(KINDS)} kinds = {cases} cases", "",
             "Each row is one public parameter (`tests/hostile_*.py`), each column one kind of value "
             "(`tests/hostile_kinds.py`), given with every other argument valid. `ok`: a valid "
             "spelling, accepted; `·`: not meaningful here (the module says why); otherwise the "
             "error raised, whose message must name the parameter: "
             + ", ".join(f"{_short(e)} = `{e}`" for e in errors) + ". Rows marked GPU run on a "
             "Hopper GPU only.", "",
             "Kinds: " + ", ".join(f"`{k}` = `{_kind_repr(k)}`" for k in KINDS) + ".", ""]
    header = "| parameter | " + " | ".join(KINDS) + " |"
    rule = "| --- |" + " --- |" * len(KINDS)
    for function in functions:
        lines += [f"### {function}", "", header, rule]
        for p in (p for p in PARAMS if p.function == function):
            cells = [MARK.get(expected(p, k)) or _short(expected(p, k)) for k in KINDS]
            lines.append(f"| `{p.name}`{' (GPU)' if p.gpu else ''} | " + " | ".join(cells) + " |")
        lines.append("")
    return lines


def _kind_repr(kind: str) -> str:
    value = KINDS[kind]()
    return "a generator of (8, 8)" if kind == "generator" else \
        "object()" if kind == "object" else _escape(repr(value).replace("\n", " "))


def rules() -> list[str]:
    lines = [f"## The rule cases: {len(CASES)}", "",
             "Values of the right type that break a rule (`tests/battery.py`). Each must raise the "
             "error below with a message matching the pattern, without crashing or hanging the "
             "process; on a Hopper GPU every case is followed by a correct launch that must give "
             "the right answer. Cases marked GPU need a device; the rest also run in CI.", "",
             "| # | area | input | error | message (regex) | GPU |", "| --- | --- | --- | --- | --- | --- |"]
    for i, c in enumerate(CASES, 1):
        lines.append(f"| {i} | {c.area} | {_escape(c.what)} | `{c.error.__name__}` | "
                     f"`{_escape(c.match)}` | {'yes' if c.gpu else ''} |")
    return lines


def render() -> str:
    return "\n".join(["# The bad-input battery", ""] + table() + rules()) + "\n"


def main(argv: list[str]) -> int:
    page = ROOT / "docs" / "bad-input-battery.md"
    text = render()
    if "--check" in argv:
        if not page.exists() or page.read_text() != text:
            print("docs/bad-input-battery.md is out of date: run PYTHONPATH=tests python tools/docs/battery_table.py")
            return 1
        return 0
    page.write_text(text)
    print(f"wrote {len(PARAMS)} parameters x {len(KINDS)} kinds and {len(CASES)} rule cases")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
