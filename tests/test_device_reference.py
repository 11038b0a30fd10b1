"""The device reference (docs/device-library.md) covers every declaration of the device headers,
each documented in the header, and is current."""
import importlib.util
import re
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def _load_tool():
    spec = importlib.util.spec_from_file_location("device_reference", ROOT / "tools" / "device_reference.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up there
    spec.loader.exec_module(module)
    return module


dr = _load_tool()
DOC = ("// Does a thing.\n// ptx: nop.x\n// who: one thread\n// order: none\n")


def _parse(text, name="x.cuh"):
    return dr.Parser(name, text).entries


def test_every_declaration_is_documented():
    assert dr.undocumented() == []


def test_the_page_is_current():
    assert dr.main(["--check"]) == 0, "run python tools/device_reference.py"


def test_every_device_function_of_the_headers_is_found():
    # A crude count the parser must match: each TMAFLOW_DEVICE / __device__ function in the
    # headers (a macro family counts once, a function in two #if branches once).
    found = {(e.header, e.qualified) for e in dr.entries() if e.kind == "function"}
    for path in dr.header_paths():
        code = re.sub(r"//[^\n]*|#define TMAFLOW_DEVICE .*", "", path.read_text())
        for name in re.findall(r"(?:TMAFLOW_DEVICE|__device__)[^;{(\n]*?\b(\w+(?:##\w+)?)\s*\(", code):
            name = re.sub(r"##(\w+)", lambda m: f"<{m.group(1).lower()}>", name)
            assert any(h == path.name and q.endswith("::" + name) for h, q in found), (path.name, name)


@pytest.mark.parametrize("qualified", [
    "tmaflow::Pipeline::producer_acquire", "tmaflow::Pipeline::consumer_wait",
    "tmaflow::Pipeline::init", "tmaflow::Pipeline::Cursor::advance", "tmaflow::Pipeline::barrier",
    "tmaflow::Barrier::wait", "tmaflow::mbarrier::wait", "tmaflow::mbarrier::wait_cluster",
    "tmaflow::named_barrier::sync", "tmaflow::named_barrier::sync_or", "tmaflow::named_barrier::arrive",
    "tmaflow::tma::reduce_<op>", "tmaflow::tma::load_multicast", "tmaflow::wgmma::mma_m64n256k32_e4m3",
])
def test_multi_line_and_macro_declarations_are_on_the_page(qualified):
    e = next(e for e in dr.entries() if e.qualified == qualified)
    page = (ROOT / "docs" / "device-library.md").read_text()
    assert f"**`{e.signature}`**" in page
    section = page[page.index(f"## `{e.header}`"):]
    scope = section[section.index(f"### `{e.scope}`"):]
    assert f"**`{e.signature}`**" in scope.split("\n## ")[0]


def test_named_barrier_functions_are_not_in_warp():
    warp = {e.name for e in dr.entries() if e.scope == "tmaflow::warp"}
    assert not {"sync", "sync_or", "arrive"} & warp


def test_a_new_undocumented_function_fails():
    text = ("namespace tmaflow { namespace unit {\n" + DOC + "TMAFLOW_DEVICE void ok() {}\n"
            "TMAFLOW_DEVICE void\nnew_one(int a,\n        int b) { asm volatile(\"{ }\"); }\n}}\n")
    entries = _parse(text)
    assert [e.qualified for e in entries] == ["tmaflow::unit::ok", "tmaflow::unit::new_one"]
    assert entries[1].signature == "void new_one(int a, int b)"
    missing = dr.undocumented(entries)
    assert len(missing) == 1 and re.search(r"x\.cuh:\d+: function tmaflow::unit::new_one has no "
                                           r"does / ptx / who / order", missing[0])


@pytest.mark.parametrize("text,kind,name", [
    ("namespace tmaflow {\nstruct Thing { int a; };\n}\n", "type", "tmaflow::Thing"),
    ("namespace tmaflow {\nconstexpr int kLimit = 3;\n}\n", "constant", "tmaflow::kLimit"),
    ("#define TMAFLOW_KNOB 1\n", "macro", "TMAFLOW_KNOB"),
    ("__device__ int tmaflow_counter;\n", "variable", "tmaflow_counter"),
])
def test_new_undocumented_types_constants_macros_and_variables_fail(text, kind, name):
    entries = _parse(text)
    assert [(e.kind, e.qualified) for e in entries] == [(kind, name)]
    assert re.search(rf"{kind} {name} has no does", dr.undocumented(entries)[0])


def test_a_missing_part_is_named():
    text = "namespace tmaflow {\n// Does it.\n// ptx: nop\n// who: one thread\nTMAFLOW_DEVICE void f() {}\n}\n"
    assert re.search(r"function tmaflow::f has no order", dr.undocumented(_parse(text))[0])


def test_ditto_takes_the_parts_it_leaves_out_from_the_function_above():
    text = ("namespace tmaflow {\n" + DOC + "TMAFLOW_DEVICE void f(float x) {}\n"
            "// ditto: for ints.\n// ptx: nop.y\nTMAFLOW_DEVICE void f(int x) {}\n}\n")
    f_float, f_int = _parse(text)
    assert f_int.doc == {"does": "for ints.", "ptx": "nop.y", "who": "one thread", "order": "none"}
    assert dr.undocumented([f_float, f_int]) == []
    with pytest.raises(ValueError, match=r"x\.cuh:\d+: a 'ditto:' block follows no documented function"):
        _parse("// ditto: nothing above\nTMAFLOW_DEVICE void g() {}\n")


def test_a_comment_separated_by_a_blank_line_documents_nothing():
    text = "namespace tmaflow {\n" + DOC + "\nTMAFLOW_DEVICE void f() {}\n}\n"
    assert dr.undocumented(_parse(text))


def test_an_unclassifiable_declaration_is_an_error():
    with pytest.raises(ValueError, match=r"x\.cuh:2: cannot classify the declaration 'int x = 1'"):
        _parse("namespace tmaflow {\nint x = 1;\n}\n")


def test_a_function_in_two_preprocessor_branches_is_one_entry(tmp_path):
    text = ("#if defined(TMAFLOW_TRACE)\n" + DOC + "TMAFLOW_DEVICE void mark(uint32_t id) {}\n"
            "#else\nTMAFLOW_DEVICE void mark(uint32_t) {}\n#endif\n")
    path = tmp_path / "branches.cuh"
    path.write_text(text)
    (mark,) = dr.entries([path])
    assert mark.condition == () and mark.doc["ptx"] == "nop.x"
