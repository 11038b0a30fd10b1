"""Render docs/device-library.md from the device headers (tmaflow/include/tmaflow/*.cuh).

Every function, type, constant, variable and macro the headers declare is found by a small C++
tokenizer and declaration parser (multi-line signatures, templates, struct members and the
functions that macros define included), and documented by the `//` block right above it:

    // What it does (one or more lines).
    // ptx: the instructions it issues
    // who: one thread / a warp / a warpgroup / the CTA / the cluster
    // order: its memory-ordering and proxy rules
    TMAFLOW_DEVICE void f(...);

Functions need all four parts; types, constants, variables and macros the first. A block that
starts with `ditto:` takes the parts it leaves out from the function above it (overloads and
shape families). A struct field is documented by its trailing comment.

    python tools/device_reference.py           # write the page
    python tools/device_reference.py --check   # exit 1 if an entry is undocumented or the page is stale
"""
from __future__ import annotations

import re
import sys
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
HEADERS = ROOT / "tmaflow" / "include" / "tmaflow"
PAGE = ROOT / "docs" / "device-library.md"
ORDER = ["prelude", "mbarrier", "pipeline", "tma", "bulk", "cp_async", "cluster", "fence", "warp",
         "wgmma", "mma", "math", "tensormap", "griddep", "signal", "chain", "trace", "debug"]
TAGS = ("ptx", "who", "order")
FUNCTION_PARTS = ("does",) + TAGS
QUALIFIERS = {"TMAFLOW_DEVICE", "__device__", "__forceinline__", "__host__", "inline"}
COORDS = "int c0, ... (coordinates, innermost first)"

_TOKEN = re.compile(r"""
    (?P<comment>//[^\n]*|/\*.*?\*/)
  | (?P<string>"(?:\\.|[^"\\\n])*")
  | (?P<char>'(?:\\.|[^'\\\n])*')
  | (?P<ident>[A-Za-z_]\w*)
  | (?P<number>\.?\d[\w.']*)
  | (?P<punct>\#\#|::|->|<<=?|>>=?|[-+*/%&|^!=<>]=|&&|\|\||\+\+|--|\.\.\.|\S)
""", re.X | re.S)


@dataclass
class Token:
    kind: str    # comment, directive, string, char, ident, number, punct
    text: str
    line: int
    own_line: bool = False  # only whitespace before it on its line (a full-line comment)
    spaced: bool = False    # whitespace before it (rendering keeps one space there)


def tokenize(text: str, first_line: int = 1) -> list[Token]:
    """Tokens of C++ source; a preprocessor directive (its continuation lines joined, a trailing
    comment dropped) is one token."""
    tokens, pos, line = [], 0, first_line
    line_start, spaced = True, False
    while pos < len(text):
        ws = re.match(r"[ \t\r\f\v]*(\n?)", text[pos:])
        if ws.end():
            pos += ws.end()
            spaced = True
            if ws.group(1):
                line, line_start = line + 1, True
            continue
        if line_start and text[pos] == "#":
            end = pos
            while True:
                nl = text.find("\n", end)
                nl = len(text) if nl < 0 else nl
                if not text[end:nl].rstrip().endswith("\\"):
                    break
                end = nl + 1
            raw = text[pos:nl]
            body = re.sub(r"\\\n", " ", raw)
            tokens.append(Token("directive", _drop_comment(body).strip(), line))
            line += raw.count("\n")
            pos, line_start = nl, False
            continue
        m = _TOKEN.match(text, pos)
        tokens.append(Token(m.lastgroup, m.group(), line, line_start, spaced))
        line += m.group().count("\n")
        pos, line_start, spaced = m.end(), False, False
    return tokens


def _drop_comment(line: str) -> str:
    """``line`` without a trailing // comment (string literals respected)."""
    for m in _TOKEN.finditer(line):
        if m.lastgroup == "comment":
            return line[:m.start()]
    return line


@dataclass
class Entry:
    kind: str            # function, type, constant, variable, macro
    scope: str           # e.g. tmaflow::mbarrier
    name: str
    signature: str
    header: str
    line: int
    doc: dict = field(default_factory=dict)
    fields: list = field(default_factory=list)  # (declaration, comment) of a struct
    condition: tuple = ()  # the #if conditions it is compiled under

    @property
    def key(self) -> tuple:
        return (self.kind, self.scope, self.name, _param_types(self.signature))

    @property
    def qualified(self) -> str:
        return f"{self.scope}::{self.name}" if self.scope else self.name


def _param_types(signature: str) -> str:
    """The parameter types of a function signature (names and defaults dropped): overloads
    differ here, one function declared in two #if branches does not."""
    m = re.search(r"\((.*)\)", signature)
    if not m:
        return ""
    types = []
    for param in re.split(r",(?![^()<>{}]*[)>}])", m.group(1)):
        words = re.findall(r"::|\w+|[^\w\s]", param.split("=")[0])
        if len(words) > 1 and re.fullmatch(r"[A-Za-z_]\w*", words[-1]) and words[-2] != "::":
            words = words[:-1]
        types.append(" ".join(words))
    return ", ".join(types)


def parse_doc(lines: list[str], previous: dict | None) -> dict:
    """The parts of a doc block: 'does' from the untagged lines, then one per tag."""
    parts: dict[str, list[str]] = {}
    current = "does"
    for line in lines:
        m = re.match(r"(ditto|ptx|who|order):\s*(.*)", line)
        if m:
            current = "does" if m.group(1) == "ditto" else m.group(1)
            if m.group(1) == "ditto":
                parts["ditto"] = []
            line = m.group(2)
        parts.setdefault(current, []).append(line)
    doc = {k: " ".join(v).strip() for k, v in parts.items() if k != "ditto"}
    if "ditto" in parts:
        if previous is None:
            raise ValueError("a 'ditto:' block follows no documented function")
        doc = {**previous, **doc}
    return {k: v for k, v in doc.items() if v}


class Parser:
    """Declarations of one header, with the doc block above each."""

    def __init__(self, header: str, text: str):
        self.header, self.entries = header, []
        self.undefined = set(re.findall(r"^\s*#\s*undef\s+(\w+)", text, re.M))
        self.conditions: list[str] = []
        self.previous_doc: dict | None = None
        self.structs: dict[tuple, Entry] = {}
        self.walk(tokenize(text), [])

    def walk(self, toks: list[Token], scopes: list[str]) -> None:
        i = 0
        while i < len(toks):
            t = toks[i]
            if t.kind == "comment":
                i += 1
            elif t.kind == "directive":
                self.directive(toks, i, scopes)
                i += 1
            elif t.text == "}":
                scopes.pop()
                i += 1
                if i < len(toks) and toks[i].text == ";":
                    i += 1
            else:
                i = self.declaration(toks, i, scopes)

    def directive(self, toks: list[Token], i: int, scopes: list[str]) -> None:
        text = toks[i].text
        word = re.match(r"#\s*(\w*)", text).group(1)
        rest = text[text.index(word) + len(word):].strip() if word else ""
        if word in ("if", "ifdef", "ifndef"):
            self.conditions.append({"if": rest, "ifdef": f"defined({rest})",
                                    "ifndef": f"!defined({rest})"}[word])
        elif word in ("else", "elif"):
            self.conditions[-1] = f"!({self.conditions[-1]})" if word == "else" else rest
        elif word == "endif":
            self.conditions.pop()
        elif word == "define":
            m = re.match(r"(\w+)(\([^)]*\))?\s*(.*)", rest, re.S)
            name, params, body = m.groups()
            doc = self.doc_above(toks, i)
            if re.search(r"\bTMAFLOW_DEVICE\b", body):
                self.macro_functions(body, toks[i].line, scopes, doc)
            elif name not in self.undefined:
                self.add("macro", scopes, name, f"#define {name}{params or ''}", toks[i].line, doc)

    def macro_functions(self, body: str, line: int, scopes: list[str], doc: list[str]) -> None:
        """Functions a macro defines (a family, one per rank or op): documented by the block
        above the #define, named with ``##X`` shown as ``<x>``."""
        body = re.sub(r"TMAFLOW_UNPAREN\s+PARAMS", COORDS, body)
        toks = tokenize(body, line)
        i = next(k for k, t in enumerate(toks) if t.text == "TMAFLOW_DEVICE")
        decl, _ = self.collect(toks, i)
        self.function(decl, scopes, line, doc)

    @staticmethod
    def collect(toks: list[Token], i: int) -> tuple[list[Token], int]:
        """Tokens of the declaration starting at ``i`` up to its `{` or `;` (outside
        parentheses), and the index of that terminator."""
        depth, j = 0, i
        while j < len(toks):
            t = toks[j]
            if t.kind == "punct":
                depth += {"(": 1, "[": 1, ")": -1, "]": -1}.get(t.text, 0)
                if depth == 0 and t.text in "{;":
                    break
            elif t.kind == "directive" and depth == 0:
                break  # a macro invocation such as TMAFLOW_TMA_RANKS(TMAFLOW_LOAD) ends here
            j += 1
        return [t for t in toks[i:j] if t.kind != "comment"], j

    @staticmethod
    def skip_body(toks: list[Token], j: int) -> int:
        """Index after the `}` matching the `{` at ``j`` (and a `;` after it)."""
        depth = 0
        while True:
            if toks[j].kind == "punct":
                depth += {"{": 1, "}": -1}.get(toks[j].text, 0)
            j += 1
            if depth == 0:
                return j + (j < len(toks) and toks[j].text == ";")

    def declaration(self, toks: list[Token], i: int, scopes: list[str]) -> int:
        decl, j = self.collect(toks, i)
        words = [t.text for t in decl]
        term = toks[j].text if j < len(toks) else ";"
        if j == len(toks) or toks[j].kind == "directive":
            return j  # a macro invocation at namespace scope (one that expands to functions)
        line, after = decl[0].line, j + 1
        trailing = (toks[after].text[2:].strip() if after < len(toks) and toks[after].kind == "comment"
                    and toks[after].line == toks[j].line and not toks[after].own_line else "")
        doc = self.doc_above(toks, i) or [trailing]  # a block above, else a trailing comment
        lead = [w for w in words if w not in QUALIFIERS]
        if lead[:1] == ["template"]:
            lead = lead[lead.index(">") + 1:]
        if lead[:1] == ["namespace"]:
            scopes.append(lead[1])
            return after
        if lead[:2] == ["extern", '"C"'] and term == "{":
            scopes.append(scopes[-1] if scopes else "")
            return after
        if lead[:1] in (["struct"], ["enum"]):
            self.add("type", scopes, lead[1], _render(decl), line, doc)
            entry = self.entries[-1]
            if lead[0] == "enum":
                body_end = self.skip_body(toks, j)
                entry.fields = [(t.text, "") for k, t in enumerate(toks[j:body_end])
                                if t.kind == "ident" and toks[j + k - 1].text in "{,"]
                return body_end
            scopes.append(lead[1])
            self.structs[tuple(scopes)] = entry
            return after
        if lead[:1] == ["using"]:
            if "=" in lead:
                self.add("type", scopes, lead[1], _render(decl), line, doc)
            return after
        if "(" in words:
            self.function(decl, scopes, line, doc)
            return self.skip_body(toks, j) if term == "{" else after
        if "constexpr" in words:
            self.add("constant", scopes, _last_ident(decl), _render(decl), line, doc)
        elif {"__device__", "__shared__", "__constant__"} & set(words):
            self.add("variable", scopes, _last_ident(decl), _render(decl), line, doc)
        elif tuple(scopes) in self.structs:
            # a field's own trailing comment first: a comment line above it may continue the
            # previous field's
            self.structs[tuple(scopes)].fields.append((_render(decl), trailing or " ".join(doc)))
        else:
            raise ValueError(f"{self.header}:{line}: cannot classify the declaration "
                             f"{_render(decl)!r}")
        return after

    def function(self, decl: list[Token], scopes: list[str], line: int, doc: list[str]) -> None:
        k = next(k for k, t in enumerate(decl) if t.text == "(")
        start = k - 1
        while start > 0 and decl[start - 1].text == "##":
            start -= 2
        name = re.sub(r"##(\w+)", lambda m: f"<{m.group(1).lower()}>",
                      "".join(t.text for t in decl[start:k]))
        signature = re.sub(r"##(\w+)", lambda m: f"<{m.group(1).lower()}>", _render(decl, strip=True))
        self.add("function", scopes, name, signature, line, doc)

    def add(self, kind, scopes, name, signature, line, doc_lines) -> None:
        doc_lines = [d for d in doc_lines if d]
        try:
            doc = parse_doc(doc_lines, self.previous_doc if kind == "function" else None)
        except ValueError as exc:
            raise ValueError(f"{self.header}:{line}: {exc}") from None
        if kind == "function" and doc:
            self.previous_doc = doc
        scope = "" if kind == "macro" else "::".join(s for s in scopes if s)  # macros know none
        self.entries.append(Entry(kind, scope, name, signature,
                                  self.header, line, doc, condition=tuple(self.conditions)))

    @staticmethod
    def doc_above(toks: list[Token], i: int) -> list[str]:
        """The full-line // comments right above token ``i`` (no blank line between)."""
        lines, line, k = [], toks[i].line, i - 1
        while k >= 0 and toks[k].kind == "comment" and toks[k].own_line and \
                toks[k].text.startswith("//") and toks[k].line == line - 1:
            lines.insert(0, toks[k].text[2:].strip())
            line, k = toks[k].line, k - 1
        return lines


def _render(decl: list[Token], strip: bool = False) -> str:
    """A declaration as source text on one line (its spacing kept, runs of whitespace made one
    space); ``strip``: without the inlining qualifiers."""
    kept = [t for t in decl if not (strip and t.text in QUALIFIERS)]
    return "".join((" " if t.spaced else "") + t.text for t in kept).strip()


def _last_ident(decl: list[Token]) -> str:
    """The declared name: the last identifier before an initializer or array bound."""
    names = []
    for t in decl:
        if t.text in ("=", "["):
            break
        if t.kind == "ident":
            names.append(t.text)
    return names[-1]


def header_paths() -> list[Path]:
    return sorted(HEADERS.glob("*.cuh"), key=lambda p: (ORDER.index(p.stem) if p.stem in ORDER
                                                        else len(ORDER), p.stem))


def entries(paths=None) -> list[Entry]:
    """Every declaration of the headers, one per function (overloads apart), type, constant,
    variable and macro: a name declared in two #if branches appears once, with the condition
    both share."""
    out: dict[tuple, Entry] = {}
    for path in paths or header_paths():
        for e in Parser(path.name, path.read_text()).entries:
            seen = out.get(e.key)
            if seen is None:
                out[e.key] = e
                continue
            shared = 0
            while shared < min(len(seen.condition), len(e.condition)) and \
                    seen.condition[shared] == e.condition[shared]:
                shared += 1
            seen.condition = seen.condition[:shared]
            if not seen.doc and e.doc:
                seen.doc = e.doc
    return list(out.values())


def undocumented(all_entries=None) -> list[str]:
    """One line per entry whose doc lacks a part it needs."""
    missing = []
    for e in all_entries if all_entries is not None else entries():
        need = FUNCTION_PARTS if e.kind == "function" else ("does",)
        lacks = [p for p in need if not e.doc.get(p)]
        if lacks:
            missing.append(f"{e.header}:{e.line}: {e.kind} {e.qualified} has no "
                           f"{' / '.join(lacks)} (a `// {lacks[-1]}: ...` line above it)")
    return missing


_CODE = re.compile(r"(?<![`\w])((?:\w+::)+[\w<>]+(?:\(\))?|__\w+(?:\(\))?|\w+\(\))")


def _md(text: str) -> str:
    """Prose for markdown: C++ names (a::b, __x, f()) as code, `<` escaped outside code."""
    out = []
    for k, part in enumerate(text.split("`")):
        if k % 2:
            out.append(f"`{part}`")
            continue
        pos = 0
        for m in _CODE.finditer(part):
            out += [part[pos:m.start()].replace("<", "\\<"), f"`{m.group(1)}`"]
            pos = m.end()
        out.append(part[pos:].replace("<", "\\<"))
    return "".join(out)


def _ptx(text: str) -> str:
    """PTX mnemonics (and %registers) as code."""
    return _md(re.sub(r"(?<![`\w])((?:[a-z_][\w:]*(?:\.[\w:<>{},]*[\w:>}])+|%[a-z_.{},]*[a-z}]))", r"`\1`", text))


def _condition(e: Entry) -> str:
    conds = [c for c in e.condition if "__has_builtin" not in c]
    return f" *(compiled when `{' && '.join(conds)}`)*" if conds else ""


def render() -> str:
    all_entries = entries()
    parts = ["# The device library", "",
             "`#include <tmaflow.cuh>` (found on the include path of every tmaflow `Kernel`) brings "
             "in the headers below, one hardware unit each, in namespaces `tmaflow::<unit>`. One "
             "PTX instruction per function, named for its effect.", "",
             "**Coordinates on the device are innermost-first** (PTX order): a box at row-major "
             "element `(row, col)` of a 2-D map is `tma::load(dst, &map, bar, col, row)`. Python "
             "(shapes, boxes, `tf.reference` coordinates) is row-major; the reversal happens in "
             "`TensorMapSpec.driver_order` on the host and at this call on the device.", "",
             "Each function says what it does, the PTX it issues, **who** calls it (one thread, a "
             "warp, a warpgroup of 4 warps, the CTA, every CTA of the cluster) and its **order**ing "
             "rules: which fence, barrier or wait must come before or after it, and between which "
             "proxies (the generic proxy of ordinary loads and stores, the async proxy of TMA, "
             "bulk copies and wgmma, the tensor-map proxy). How the pipeline pieces fit together: "
             "[pipelines.md](pipelines.md); a guided tour: [tutorial.md](tutorial.md).", "",
             "Generated from the comments in the headers by `python tools/device_reference.py` "
             "(`tests/test_device_reference.py` fails when a declaration is undocumented or this "
             "page is stale).", ""]
    for path in header_paths():
        here = [e for e in all_entries if e.header == path.name]
        head = []
        for line in path.read_text().splitlines():
            if not line.startswith("//"):
                break
            head.append(line[2:].strip())
        parts += [f"## `{path.name}`", "", _md(" ".join(head)), ""]
        scopes = list(dict.fromkeys(e.scope for e in here))
        for scope in scopes:
            parts += [f"### `{scope}`" if scope else "### Macros and globals", ""]
            for e in (e for e in here if e.scope == scope):
                parts += _render_entry(e)
            parts.append("")
    return "\n".join(parts).rstrip() + "\n"


def _render_entry(e: Entry) -> list[str]:
    does = e.doc.get("does", "—")
    lines = [f"- **`{e.signature}`**{_condition(e)} — {_md(does)}"]
    if e.kind == "function":
        lines += [f"  - PTX: {_ptx(e.doc['ptx'])}", f"  - who: {_md(e.doc['who'])}",
                  f"  - order: {_md(e.doc['order'])}"]
    elif e.kind == "type" and e.fields:
        if e.signature.startswith("enum"):
            lines.append(f"  - values: {', '.join(f'`{n}`' for n, _ in e.fields)}")
        else:
            lines += [f"  - `{d}`" + (f" — {_md(c)}" if c else "") for d, c in e.fields]
    return lines


def main(argv=None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    missing = undocumented()
    if missing:
        print("undocumented device declarations:\n  " + "\n  ".join(missing))
        return 1
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
