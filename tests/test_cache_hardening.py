"""The compile cache and the cached C launcher under hostile files: FIFOs, truncated, empty,
garbage or malformed entries, another format, an unusable cache directory, a compiler that
"succeeds" without output, and the env knobs that choose them (no GPU)."""
import hashlib
import json
import os
import platform
import stat
import struct
import sys
import threading
import warnings

import pytest

import tmaflow as tf
from tmaflow.launch import cache, native

SOURCE = "__global__ void k(int* p) { p[0] = %d; }"


def checksummed(header: bytes, *blobs: bytes, magic=cache._MAGIC) -> bytes:
    """An entry whose checksum is right whatever its header says."""
    payload = header + b"".join(blobs)
    return magic + struct.pack("<Q", len(header)) + hashlib.sha256(payload).digest() + payload


def entry_path(key: str):
    return cache.cache_dir() / key[:2] / f"{key}.tfbin"


def load_with_timeout(key: str):
    """cache.load(key), failing the test instead of hanging it."""
    got = []
    reader = threading.Thread(target=lambda: got.append(cache.load(key)), daemon=True)
    reader.start()
    reader.join(10)
    assert not reader.is_alive(), "cache.load blocked"
    return got[0]


# --- compile-cache entries ---------------------------------------------------------------------

KEY = "ab" + "0" * 62
META = {"log": "", "lowered_name": "k", "resources": None}
BLOBS = {"cubin": b"\x7fELF cubin", "ptx": b".version 8.0"}


def test_a_fifo_in_an_entrys_place_is_a_miss_and_is_replaced(tmp_cache):
    path = entry_path(KEY)
    path.parent.mkdir(parents=True)
    os.mkfifo(path)
    assert load_with_timeout(KEY) is None
    cache.store(KEY, META, BLOBS)
    cache.clear_memory()
    assert stat.S_ISREG(path.stat().st_mode) and load_with_timeout(KEY) == (META | {"blobs": {
        "cubin": len(BLOBS["cubin"]), "ptx": len(BLOBS["ptx"])}}, BLOBS, "disk")


@pytest.mark.parametrize("header,blobs", [
    (b"[1, 2]", ()),                                        # meta not an object
    (b'{"log": ""}', ()),                                   # no blob table
    (b'{"blobs": [1]}', (b"x",)),                           # blob table not an object
    (b'{"blobs": {"cubin": -1}}', ()),                      # negative size
    (b'{"blobs": {"cubin": "3"}}', (b"abc",)),              # size not an int
    (b'{"blobs": {"cubin": true}}', (b"a",)),               # a bool for a size
    (b'{"blobs": {"cubin": 2}}', (b"abc",)),                # sizes do not cover the payload
    (b"\xff\xfe", ()),                                      # not UTF-8
    (b"[" * 100000 + b"]" * 100000, ()),                    # nested past the recursion limit
])
def test_an_intact_entry_with_malformed_contents_does_not_decode(header, blobs):
    assert cache.decode_entry(checksummed(header, *blobs)) is None


def test_an_entry_of_another_format_version_is_a_miss_and_is_overwritten(tmp_cache):
    path = entry_path(KEY)
    path.parent.mkdir(parents=True)
    header = json.dumps({"blobs": {}, "schema": "future"}).encode()
    path.write_bytes(checksummed(header, magic=b"TMAFLOW2"))
    assert load_with_timeout(KEY) is None
    cache.store(KEY, META, BLOBS)
    cache.clear_memory()
    assert path.read_bytes().startswith(cache._MAGIC) and load_with_timeout(KEY)[2] == "disk"


def malformed(meta: dict, blobs: dict) -> bytes:
    header = json.dumps(dict(meta, blobs={k: len(v) for k, v in blobs.items()}), sort_keys=True)
    return checksummed(header.encode(), *(blobs[k] for k in sorted(blobs)))


GOOD_RESOURCES = {"registers": 8, "spill_stores": 0, "spill_loads": 0, "stack_frame": 0,
                  "static_smem": 0, "constant_bytes": 0}
MALFORMED = {
    "no cubin": (META, {"ptx": b"x"}),
    "no ptx": (META, {"cubin": b"x"}),
    "empty cubin": (META, {"cubin": b"", "ptx": b"x"}),
    "ptx not utf-8": (META, {"cubin": b"x", "ptx": b"\xff"}),
    "no lowered name": ({"log": "", "resources": None}, BLOBS),
    "empty lowered name": (META | {"lowered_name": ""}, BLOBS),
    "lowered name an int": (META | {"lowered_name": 7}, BLOBS),
    "log a list": (META | {"log": ["x"]}, BLOBS),
    "no resources": ({"log": "", "lowered_name": "k"}, BLOBS),
    "resources a list": (META | {"resources": [1]}, BLOBS),
    "resources unknown": (META | {"resources": GOOD_RESOURCES | {"bogus": 1}}, BLOBS),
    "resources missing": (META | {"resources": {"registers": 8}}, BLOBS),
    "resources a float": (META | {"resources": GOOD_RESOURCES | {"registers": 8.5}}, BLOBS),
    "resources negative": (META | {"resources": GOOD_RESOURCES | {"registers": -1}}, BLOBS),
}


@pytest.mark.parametrize("case", MALFORMED)
def test_an_intact_entry_that_holds_no_kernel_is_rebuilt_and_overwritten(tmp_cache, case, rng):
    src = SOURCE % int(rng.integers(1, 2**31))
    first = tf.Kernel(src, "k").program
    assert first.cache_hit == ""
    path = entry_path(first.key)
    path.write_bytes(malformed(*MALFORMED[case]))
    cache.clear_memory()
    again = tf.Kernel(src, "k").program
    assert again.cache_hit == "" and again.cubin == first.cubin  # a miss: compiled afresh
    cache.clear_memory()
    assert tf.Kernel(src, "k").program.cache_hit == "disk"  # and the entry was overwritten


# --- the cache directory -----------------------------------------------------------------------

def test_tilde_in_the_cache_dir_is_the_home_directory(tmp_path, monkeypatch):
    monkeypatch.setenv("HOME", str(tmp_path))
    monkeypatch.setenv("TMAFLOW_CACHE_DIR", "~/tfc")
    assert cache.cache_dir() == tmp_path / "tfc"
    cache.clear_memory()
    cache.store(KEY, META, BLOBS)
    assert (tmp_path / "tfc" / "ab" / f"{KEY}.tfbin").is_file()
    cache.clear_memory()


def long_path(tmp_path):
    parts = ["d" * 200] * (4096 // 200)
    return str(tmp_path.joinpath(*parts))


@pytest.mark.parametrize("kind,msg", [
    ("file", r"is not a directory; remove it or set TMAFLOW_CACHE_DIR to a directory"),
    ("long name", r"is too long: names must be at most \d+ bytes.*set TMAFLOW_CACHE_DIR to a shorter"),
    ("long path", r"is too long: .*the whole path under \d+ bytes"),
    ("under a file", r"cannot be used \(Not a directory\); set TMAFLOW_CACHE_DIR to a writable"),
])
def test_an_unusable_cache_dir_is_named_with_the_fix(tmp_path, monkeypatch, kind, msg, rng):
    (tmp_path / "file").write_text("not a directory")
    chosen = {"file": tmp_path / "file", "long name": tmp_path / ("x" * 300),
              "long path": long_path(tmp_path), "under a file": tmp_path / "file" / "cache"}[kind]
    monkeypatch.setenv("TMAFLOW_CACHE_DIR", str(chosen))
    monkeypatch.setenv("TMAFLOW_CACHE", "1")
    monkeypatch.setattr(cache, "_warned", set())
    cache.clear_memory()
    for refused in (cache.info, cache.clear, cache.usable_dir):
        with pytest.raises(tf.TmaflowError, match=r"the compile cache directory .* \(TMAFLOW_CACHE_DIR\) " + msg):
            refused()
    with pytest.warns(tf.TmaflowWarning, match="compiling without the on-disk cache") as seen:
        program = tf.Kernel(SOURCE % int(rng.integers(1, 2**31)), "k").program  # compiles
    assert program.cubin[:4] == b"\x7fELF" and len(seen) == 1
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # said once per problem
        cache.clear_memory()
        tf.Kernel(SOURCE % int(rng.integers(1, 2**31)), "k").cubin
    cache.clear_memory()


def test_the_cache_flag_refuses_what_it_does_not_spell(monkeypatch):
    monkeypatch.setenv("TMAFLOW_CACHE", "maybe")
    with pytest.raises(tf.TmaflowError, match=r"TMAFLOW_CACHE='maybe' must be one of 1/true/on/yes or 0/false/off/no"):
        cache.enabled()


# --- the cached C launcher ---------------------------------------------------------------------

@pytest.fixture(scope="module")
def good_build():
    """The bytes of a sound build of _launch.c (the one this process loaded)."""
    module = native.module()
    assert module is not None, native.status()
    return open(module.__file__, "rb").read()


@pytest.fixture
def fresh(tmp_path, monkeypatch):
    """native with no module loaded yet and an empty cache: returns its build folder."""
    monkeypatch.setenv("TMAFLOW_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.delenv("TMAFLOW_NATIVE", raising=False)
    monkeypatch.setattr(native, "_state", {})
    return tmp_path / "cache" / "native"


def prefix():
    return f"launch-{sys.implementation.cache_tag}-{native._tag(native._compiler())}"


def digest(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()[:16]


def fake_builds(monkeypatch, data: bytes) -> list:
    """Make native's build publish ``data`` (as a build would) without compiling; returns the
    list of builds made."""
    builds = []

    def build(command, folder, name):
        folder.mkdir(parents=True, exist_ok=True)
        target = folder / f"{name}-{digest(data)}.so"
        target.write_bytes(data)
        builds.append(target)
        return target

    monkeypatch.setattr(native, "_build", build)
    return builds


def test_a_build_is_flushed_then_published_under_its_checksum_and_not_executable(fresh, monkeypatch):
    monkeypatch.setenv("CC", f"env {native._compiler()[0]}")  # a command line, as ccache gcc is
    events = []
    real_fsync, real_replace = os.fsync, os.replace
    monkeypatch.setattr(os, "fsync", lambda fd: (events.append(("fsync", os.readlink(f"/proc/self/fd/{fd}"))),
                                                 real_fsync(fd))[1])
    monkeypatch.setattr(os, "replace", lambda a, b: (events.append(("replace", str(a))), real_replace(a, b))[1])
    old = os.umask(0o022)
    try:
        module = native.module()
    finally:
        os.umask(old)
    assert module is not None and module.ABI == native.ABI, native.status()
    (built,) = fresh.glob("*.so")
    assert built.name == f"{prefix()}-{digest(built.read_bytes())}.so"
    assert stat.S_IMODE(built.stat().st_mode) == 0o644
    assert not [p for p in fresh.iterdir() if p != built]  # the private build directory is gone
    flushed = events.index(("fsync", next(p for e, p in events if e == "replace")))
    assert flushed < next(i for i, (e, _) in enumerate(events) if e == "replace")
    assert native.status() == "C launch path (tmaflow/launch/_launch.c)"


@pytest.mark.parametrize("damage,problem", [
    ("truncated", r"its \d+ bytes do not match its checksum \(truncated or overwritten\)"),
    ("empty", "it is empty"),
    ("fifo", "is not a regular file"),
    ("not elf", "it is not an ELF shared object"),
    ("garbage elf", r"it does not load \("),
])
def test_an_unsound_cached_build_is_replaced_by_one_rebuild(fresh, monkeypatch, good_build, damage, problem):
    import re

    fresh.mkdir(parents=True)
    bad = fresh / f"{prefix()}-{digest(good_build)}.so"
    if damage == "truncated":
        bad.write_bytes(good_build[:len(good_build) // 2])  # SIGBUS if it were loaded
    elif damage == "empty":
        bad.write_bytes(b"")
    elif damage == "fifo":
        os.mkfifo(bad)
    else:
        junk = (b"MZ" if damage == "not elf" else b"\x7fELF") + os.urandom(4000)
        bad = fresh / f"{prefix()}-{digest(junk)}.so"
        bad.write_bytes(junk)
    builds = fake_builds(monkeypatch, good_build)
    assert native.module() is not None
    assert len(builds) == 1
    assert {p.name: p.read_bytes() for p in fresh.glob("*.so")} == {builds[0].name: good_build}
    assert re.search(rf"^C launch path \(tmaflow/launch/_launch.c\); rebuilt an unsound cached build \("
                     rf"{re.escape(bad.name)}: .*{problem}", native.status())


def test_a_build_of_another_abi_is_rebuilt_and_never_used(fresh, monkeypatch, good_build):
    monkeypatch.setattr(native, "ABI", native.ABI + 1)
    fresh.mkdir(parents=True)
    cached = fresh / f"{prefix()}-{digest(good_build)}.so"
    cached.write_bytes(good_build)
    builds = fake_builds(monkeypatch, good_build)  # the rebuild reports the old number too
    assert native.module() is None and len(builds) == 1 and not list(fresh.glob("*.so"))
    wrong = f"its ABI is {native.ABI - 1}, not {native.ABI}"
    assert native.status() == (f"generated Python launch path (the fresh build {cached.name} is "
                               f"unusable: {wrong}); rebuilt an unsound cached build ({cached.name}: {wrong})")


WRITES_GARBAGE = "sh -c 'for a; do last=$a; done; printf garbage > \"$last\"' sh"


@pytest.mark.parametrize("cc,reason", [
    ("true", r"true reported success but wrote no shared object"),
    (WRITES_GARBAGE, r"sh -c .* reported success but wrote no shared object"),
    ("no-such-compiler-here -O2", r"no C compiler \('no-such-compiler-here -O2' not found\)"),
    ("false", r"false failed"),
])
def test_a_compiler_that_writes_no_library_leaves_the_python_path_and_says_why(fresh, monkeypatch, cc, reason):
    import re

    monkeypatch.setenv("CC", cc)
    assert native.module() is None
    assert re.fullmatch(rf"generated Python launch path \({reason}.*\)", native.status())
    assert not list(fresh.glob("*.so")) and not list(fresh.glob(".build-*"))


def test_the_build_tag_names_the_machine_the_extension_suffix_and_the_compiler(monkeypatch):
    base = native._tag(["cc"])
    assert native._tag(["ccache", "cc"]) != base
    monkeypatch.setattr(platform, "machine", lambda: "riscv64")
    assert native._tag(["cc"]) != base
    monkeypatch.undo()
    real = native.sysconfig.get_config_var
    monkeypatch.setattr(native.sysconfig, "get_config_var",
                        lambda name: ".other.so" if name == "EXT_SUFFIX" else real(name))
    assert native._tag(["cc"]) != base


def test_an_unusable_cache_dir_leaves_the_python_path_and_says_why(fresh, monkeypatch, tmp_path):
    (tmp_path / "file").write_text("")
    monkeypatch.setenv("TMAFLOW_CACHE_DIR", str(tmp_path / "file"))
    assert native.module() is None
    assert "(TMAFLOW_CACHE_DIR) is not a directory" in native.status()


def test_the_native_flag_refuses_what_it_does_not_spell(fresh, monkeypatch):
    monkeypatch.setenv("TMAFLOW_NATIVE", "maybe")
    for refused in (native.module, native.status):
        with pytest.raises(tf.TmaflowError, match=r"TMAFLOW_NATIVE='maybe' must be one of "
                                                  r"1/true/on/yes or 0/false/off/no"):
            refused()
    monkeypatch.setenv("TMAFLOW_NATIVE", "off")
    assert native.module() is None and native.status() == "generated Python launch path (TMAFLOW_NATIVE=off)"
    assert native.plan((), dry=True, function=0, size=0, config=0, current_stream=None, ordinal=0,
                       capturing=[], on_error=print, keep=None) is None
