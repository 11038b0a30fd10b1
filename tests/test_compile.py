"""Compilation to CUBIN with no GPU: libcu++ under NVRTC, errors, the cache, SASS checks."""
import os
import re
import subprocess
import sys
import textwrap
import warnings

import pytest

import tmaflow as tf
from tmaflow.launch import cache
from kernel_sources import source
from tmaflow.kernels import examples
from tmaflow.launch.sass import disassemble, sass_opcodes

LIBCUXX = r'''
#include <cuda.h>
#include <cuda/barrier>
#include <cuda/ptx>
#include <cooperative_groups.h>
namespace ptx = cuda::ptx;
__global__ void uses_everything(const __grid_constant__ CUtensorMap map, int* out) {
  #pragma nv_diag_suppress static_var_with_dynamic_init
  __shared__ cuda::barrier<cuda::thread_scope_block> bar;
  auto block = cooperative_groups::this_thread_block();
  if (block.thread_rank() == 0) { init(&bar, block.size()); ptx::fence_proxy_async(ptx::space_shared); }
  block.sync();
  out[threadIdx.x] = sizeof(map);
}
'''


def _elf_arch(cubin: bytes) -> int:
    assert cubin[:4] == b"\x7fELF"
    return cubin[48] & 0xFF  # e_flags low byte holds the SM number on CUDA ELF


def test_libcuxx_and_cuda_h_compile_to_sm90a_cubin(tmp_cache):
    k = tf.Kernel(LIBCUXX, "uses_everything")
    assert k.cubin[:4] == b"\x7fELF"
    assert ".target sm_90a" in k.ptx
    assert k.resources.registers > 0 and k.resources.spills == 0
    assert "uses_everything" in k.program.lowered_name


def test_compile_error_names_lines_and_log(tmp_cache):
    src = "__global__ void k(int* p) {\n  int x = 1;\n  p[0] = y;\n}\n"
    with pytest.raises(tf.CompileError, match=r"NVRTC failed to compile kernel.cu \(1 error\)") as info:
        tf.Kernel(src, "k").cubin
    err = info.value
    assert 'identifier "y" is undefined' in err.log
    assert ">>     3 |   p[0] = y;" in err.excerpt


def test_missing_kernel_name(tmp_cache):
    with pytest.raises(tf.CompileError, match=r"kernel name='nope' is not a __global__ function of kernel.cu; kernels found: real"):
        tf.Kernel("__global__ void real(int* p) { p[0] = 1; }", "nope").cubin


def test_templated_kernel_by_name_expression(tmp_cache):
    src = "template <int N> __global__ void fill(int* p) { p[threadIdx.x] = N; }\n" \
          "template __global__ void fill<7>(int*);\n"
    k = tf.Kernel(src, "fill<7>")
    assert k.program.lowered_name.startswith("_Z")


def test_defines_and_debug_change_the_binary(tmp_cache):
    src = "__global__ void k(int* p) { p[0] = VALUE; }"
    a = tf.Kernel(src, "k", defines={"VALUE": 1})
    b = tf.Kernel(src, "k", defines={"VALUE": 2})
    assert a.program.key != b.program.key and a.cubin != b.cubin
    assert tf.Kernel(src, "k", defines={"VALUE": 1}, debug=True).program.key != a.program.key


_CHILD = textwrap.dedent("""
    import sys, tmaflow as tf
    k = tf.Kernel("__global__ void k(int* p) { p[0] = TAG; }", "k", defines={"TAG": sys.argv[1]})
    k.cubin
    print(k.program.cache_hit or "compiled")
""")


def _child(tag, cache_dir):
    env = dict(os.environ, TMAFLOW_CACHE_DIR=str(cache_dir), TMAFLOW_CACHE="1")
    return subprocess.run([sys.executable, "-c", _CHILD, tag], env=env, capture_output=True,
                          text=True, check=True).stdout.strip()


def test_second_process_hits_disk_cache(tmp_cache):
    assert _child("11", tmp_cache) == "compiled"
    assert _child("11", tmp_cache) == "disk"


def test_corrupted_entry_is_rebuilt(tmp_cache):
    assert _child("12", tmp_cache) == "compiled"
    (entry,) = list(tmp_cache.glob("*/*.tfbin"))
    data = bytearray(entry.read_bytes())
    data[len(data) // 2] ^= 0xFF
    entry.write_bytes(bytes(data))
    assert _child("12", tmp_cache) == "compiled"  # checksum failed: rebuilt
    assert _child("12", tmp_cache) == "disk"


def test_concurrent_processes_leave_one_valid_entry(tmp_cache):
    env = dict(os.environ, TMAFLOW_CACHE_DIR=str(tmp_cache), TMAFLOW_CACHE="1")
    procs = [subprocess.Popen([sys.executable, "-c", _CHILD, "13"], env=env, stdout=subprocess.PIPE,
                              text=True) for _ in range(8)]
    outs = [p.communicate()[0].strip() for p in procs]
    assert all(p.returncode == 0 for p in procs) and set(outs) <= {"compiled", "disk"}
    entries = list(tmp_cache.glob("*/*.tfbin"))
    assert len(entries) == 1 and not list(tmp_cache.glob("*/.*.tmp"))
    assert cache.decode_entry(entries[0].read_bytes()) is not None


def test_cache_can_be_disabled(tmp_cache, monkeypatch):
    monkeypatch.setenv("TMAFLOW_CACHE", "0")
    k = tf.Kernel("__global__ void k(int* p) { p[0] = 3; }", "k")
    k.cubin
    assert k.program.cache_hit == "" and not list(tmp_cache.glob("*/*.tfbin"))


def test_memory_cache_hit(tmp_cache):
    src = "__global__ void k(int* p) { p[0] = 4; }"
    tf.Kernel(src, "k").cubin
    k = tf.Kernel(src, "k")
    k.cubin
    assert k.program.cache_hit == "memory"


def _ops(kernel):
    return sass_opcodes(disassemble(kernel.cubin))


def test_sass_of_examples_uses_tma():
    copy = examples.get_kernel("tile_copy", *examples.copy_plan("float32", (4096, 4096))[1:])
    assert {"UTMALDG", "UTMASTG", "SYNCS"} <= _ops(copy)
    bcast = examples.get_kernel("broadcast_scale", examples.broadcast_plan(16, 2)[1])
    assert "UTMALDG.2D.MULTICAST" in disassemble(bcast.cubin)
    assert "SYNCS.PHASECHK.TRANS64.TRYWAIT" in disassemble(copy.cubin)


def test_sass_of_device_library_wrappers():
    src = r'''
    #include <tmaflow.cuh>
    using namespace tmaflow;
    extern "C" __global__ void k(const __grid_constant__ CUtensorMap m, float* g, int which) {
      extern __shared__ __align__(1024) uint8_t smem[];
      __shared__ uint64_t bar;
      if (which == 0) tma::load_multicast(smem, &m, &bar, 3, 0, 0);
      if (which == 1) tma::reduce_add(&m, smem, 0, 0);
      if (which == 2) cluster::store_async_u32(cluster::map_shared(smem, 1), 5u, cluster::map_shared(&bar, 1));
      if (which == 3) mbarrier::wait(&bar, 0);
      if (which == 4) bulk::load(smem, g, 128, &bar);
      if (which == 5) cp_async::copy16(smem, g);
      if (which == 6) tma::prefetch(&m, 0, 0);
      if (which == 7) tma::store(&m, smem, 0, 0);
    }'''
    sass = disassemble(tf.Kernel(src, "k").cubin)
    for op in ("UTMALDG.2D.MULTICAST", "UTMAREDG.2D.ADD", "STAS", "SYNCS.PHASECHK.TRANS64.TRYWAIT",
               "UBLKCP.S.G", "LDGSTS", "UTMAPF.L2.2D", "UTMASTG.2D"):
        assert op in sass, op


def test_every_wrapper_compiles_for_sm90a():
    # Instantiate every overload (ranks 1-5, every reduce op) so each PTX string is assembled.
    calls = []
    for n in range(1, 6):
        c = ", ".join(["0"] * n)
        calls += [f"tma::load(smem, &m, &bar, {c});", f"tma::load_multicast(smem, &m, &bar, 1, {c});",
                  f"tma::load_hint(smem, &m, &bar, pol, {c});", f"tma::store(&m, smem, {c});",
                  f"tma::prefetch(&m, {c});"]
        calls += [f"tma::reduce_{op}(&m, smem, {c});"
                  for op in ("add", "min", "max", "inc", "dec", "and", "or", "xor")]
    body = "\n".join(f"if (which == {i}) {{ {c} }}" for i, c in enumerate(calls))
    src = f'''
    #include <tmaflow.cuh>
    using namespace tmaflow;
    extern "C" __global__ void __launch_bounds__(128, 1) k(const __grid_constant__ CUtensorMap m, float* g, int which) {{
      extern __shared__ __align__(1024) uint8_t smem[];
      __shared__ uint64_t bar;
      uint64_t pol = tma::make_policy_evict_first() ^ tma::make_policy_evict_last();
      {body}
      mbarrier::init(&bar, 1); mbarrier::inval(&bar); mbarrier::expect_tx(&bar, 16);
      mbarrier::arrive_expect_tx(&bar, 16); (void)mbarrier::arrive(&bar); mbarrier::arrive_cluster(&bar, 1);
      mbarrier::arrive_cluster_release(&bar, 1); (void)mbarrier::try_wait_cluster(&bar, 0);
      bulk::store(g, smem, 16); bulk::reduce_add(g, reinterpret_cast<float*>(smem), 16);
      bulk::load_multicast(smem, g, 16, &bar, 3);
      cp_async::copy4(smem, g); cp_async::copy8(smem, g); cp_async::commit(); cp_async::wait<1>();
      cp_async::wait_all(); cp_async::arrive_on(&bar);
      tma::commit_group(); tma::wait_group<0>(); tma::wait_group_read<1>(); tma::prefetch_descriptor(&m);
      fence::proxy_async(); fence::proxy_async_shared_cta(); fence::mbarrier_init(); fence::acq_rel_cluster();
      fence::tensormap_acquire(&m);
      cluster::arrive(); cluster::wait(); cluster::arrive_relaxed(); cluster::sync();
      g[0] = cluster::rank() + cluster::size() + cluster::cta_id().x + cluster::dims().y + cluster::cluster_id().z;
      g[1] = cluster::load_u32(cluster::map_shared(smem, 0)); cluster::store_u32(cluster::map_shared(smem, 0), 1);
      cluster::store_async_v4(cluster::map_shared(smem, 1), make_uint4(1, 2, 3, 4), cluster::map_shared(&bar, 1));
      g[2] = *cluster::map(g, 0) + warp::elect_one() + warp::lane() + warp::warp_index();
      if (threadIdx.x < 128) warp::setmaxnreg_inc<232>(); else warp::setmaxnreg_dec<40>();
    }}'''
    k = tf.Kernel(src, "k")
    assert k.cubin[:4] == b"\x7fELF"


def test_release_build_has_no_watchdog_cost():
    """tmaflow's wait in a release build assembles to the same SASS as a bare try_wait loop."""
    def kernel(wait):
        return r'''
        #include <tmaflow.cuh>
        using namespace tmaflow;
        extern "C" __global__ void k(int* out) {
          __shared__ uint64_t bar;
          if (threadIdx.x == 0) mbarrier::init(&bar, blockDim.x);
          __syncthreads();
          mbarrier::arrive(&bar);
          ''' + wait + r'''
          out[threadIdx.x] = 1;
        }'''
    ours = tf.Kernel(kernel("mbarrier::wait(&bar, 0, debug::Site{\"b\", 3, 64});"), "k")
    bare = tf.Kernel(kernel("while (!mbarrier::try_wait(&bar, 0)) {}"), "k")
    strip = lambda s: [ln.split("*/", 1)[1].split("/*")[0].strip() for ln in s.splitlines()  # noqa: E731
                       if ln.strip().startswith("/*") and "*/" in ln]
    assert strip(disassemble(ours.cubin)) == strip(disassemble(bare.cubin))
    debug = tf.Kernel(kernel("mbarrier::wait(&bar, 0);"), "k", debug=True)
    assert "globaltimer" in debug.ptx  # the watchdog really is in the debug build


def test_all_example_kernels_compile():
    plans = [("tile_copy", *examples.copy_plan("bfloat16", (1024, 1024))[1:]),
             ("transpose", examples.transpose_plan((1024, 1024))[2], None),
             ("softmax", *examples.softmax_plan((256, 4096))[1:]),
             ("broadcast_scale", examples.broadcast_plan(8, 4)[1], None),
             ("axpb_ldgsts", None, None), ("axpb_tma", None, None)]
    for name, layout, defines in plans:
        k = examples.get_kernel(name, layout, defines)
        assert k.resources.spills == 0, name


# one test a kernel: each compiles the whole seeds.cu (2-3 s), spread over the xdist workers
@pytest.mark.parametrize("name", ["split_arrive_wait", "producer_consumer_pattern", "without_memcpy_async",
                                  "with_memcpy_async", "with_barrier", "with_single_stage", "with_staging",
                                  "with_specialized_staging_unified<2>", "add_one_kernel", "kernel", "kernel_ptx",
                                  "dsmem_kernel", "tma_multicast_kernel"])
def test_every_seed_kernel_compiles(name):
    assert tf.Kernel(source("seeds"), name, filename="seeds.cu").cubin[:4] == b"\x7fELF"


def test_handoff_probes_compile_and_every_sanitize_set_reaches_one():
    """tools/sanitize.sh's hand-off sets run tools/sanitize_examples.py with flags it reads, on
    probe kernels that compile; the lanes probe releases as gemm.cu does (a local arrival by
    whole warps, remote ones by single lanes) and the one-lane control as before."""
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    script = open(os.path.join(root, "tools", "sanitize.sh")).read()
    tool = open(os.path.join(root, "tools", "sanitize_examples.py")).read()
    sets = dict(re.findall(r"\n\s+(handoff[\w-]*)\) echo \"python3 tools/sanitize_examples.py ([^\"]*)\"", script))
    assert {"handoff", "handoff-warp", "handoff-named", "handoff-lanes", "handoff-quads", "handoff-lanes-warp"} <= set(sets)
    for flags in sets.values():
        assert all(f'"{flag}"' in tool for flag in flags.split()), flags
    for name in ("cp_async_noinc_handoff", "cp_async_lanes_handoff"):
        sass = disassemble(tf.Kernel(source("probe"), name, filename="probe.cu").cubin)
        assert "LDGSTS" in sass and "SYNCS.PHASECHK.TRANS64.TRYWAIT" in sass, name
    assert "SYNCS.ARRIVE.TRANS64.RED.A1T0" in sass and "SYNCS.ARRIVE.TRANS64.A1T0" in sass


def test_every_sanitize_library_id_names_a_test():
    """tools/sanitize.sh runs the ids of tools/sanitize_library.txt; a renamed test or parameter
    would drop out of the sanitizers silently (pytest reports 'not found' in a log)."""
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    with open(os.path.join(root, "tools", "sanitize_library.txt")) as f:
        ids = [line.strip() for line in f if line.strip() and not line.lstrip().startswith("#")]
    r = subprocess.run([sys.executable, "-m", "pytest", "--collect-only", "-q", "-p", "no:cacheprovider", *ids],
                       capture_output=True, text=True, cwd=root, timeout=300)
    assert r.returncode == 0 and f"{len(ids)} tests collected" in r.stdout, r.stdout[-2000:] + r.stderr[-2000:]


def test_missing_nvrtc_says_how_to_install(monkeypatch):
    from tmaflow.launch import compiler
    from tmaflow.runtime import driver

    class NoNVRTC:
        def nvrtcVersion(self):
            raise OSError('Failure finding "libnvrtc.so.13 or libnvrtc.so.12"')

    monkeypatch.setattr(driver, "nvrtc", lambda: NoNVRTC())
    compiler.nvrtc_version.cache_clear()
    try:
        with pytest.raises(tf.TmaflowError, match=r"NVRTC could not be loaded .* pip install 'tmaflow\[cu13\]'"):
            tf.Kernel("__global__ void k() {}", "k").cubin
    finally:
        compiler.nvrtc_version.cache_clear()


@pytest.mark.parametrize("layout,bn,cluster_m,split_k,debug", [
    ("nt", 256, 2, 1, False), ("nt", 128, 2, 1, False), ("nn", 256, 2, 1, False), ("nn", 128, 1, 1, False),
    ("nt", 128, 1, 4, False), ("nt", 256, 2, 4, False), ("nt", 256, 2, 1, True), ("nn", 128, 1, 4, True)])
def test_gemm_compiles_to_hgmma_and_multicast_without_spills(layout, bn, cluster_m, split_k, debug):
    from tmaflow.kernels.matmul import GemmConfig, gemm_plan
    from tmaflow.kernels.registry import get_kernel

    plan = gemm_plan(4096, 4096, 4096, layout, GemmConfig(bn=bn, cluster_m=cluster_m, split_k=split_k))
    k = get_kernel("gemm_bf16", plan.layout, defines=plan.defines, file="gemm", debug=debug)
    sass = disassemble(k.cubin)
    assert f"HGMMA.64x{bn}x16.F32.BF16" in sass
    assert "UTMASTG.2D" in sass
    # split-K: the per-tile counter and the "was it the last split?" barrier reduction
    assert ("ATOMG.E.ADD" in sass and "BAR.RED.OR" in sass) == (split_k > 1)
    assert ("UTMALDG.2D.MULTICAST" in sass) == (cluster_m > 1)
    # Debug builds too: the watchdog's report is inlined, since a call after setmaxnreg fails.
    assert k.resources.spills == 0 and k.resources.stack_frame == 0
    assert plan.layout.total_bytes <= 227 * 1024 and plan.config.stages >= 4


@pytest.mark.parametrize("kwargs,msg", [
    (dict(options="-lineinfo"), r"options='-lineinfo' must be a list or tuple of strings, e.g. \('-lineinfo',\)"),
    (dict(options=["-dlto"]), r"option '-dlto' makes NVRTC emit no CUBIN"),
    (dict(options=[1]), r"option 1 must be a non-empty one-line string"),
    (dict(options=["-DX=1\n-DY"]), r"must be a non-empty one-line string"),
    (dict(defines={"A": "1\n#include <x>"}), r"defines\['A'\]=.* must be one line"),
    (dict(defines={None: 1}), r"defines key None must be a C identifier"),
    (dict(defines={"1X": 1}), r"defines key '1X' must be a C identifier"),
    (dict(defines={"X": [1]}), r"defines\['X'\]=\[1\] must be a str, int, float or None"),
    (dict(defines=[("X", 1)]), r"defines=\[\('X', 1\)\] must be a dict"),
    (dict(debug="yes"), r"debug='yes' must be True, False or None"),
    (dict(watchdog_seconds=-1), r"watchdog_seconds=-1 must be a positive number"),
    (dict(watchdog_seconds=float("nan")), r"watchdog_seconds=nan must be a finite number"),
])
def test_kernel_inputs_are_checked(kwargs, msg):
    with pytest.raises(tf.TmaflowError, match=msg):
        tf.Kernel("extern \"C\" __global__ void k() {}", "k", **kwargs)


def test_nul_in_name_or_source_is_refused():
    with pytest.raises(tf.TmaflowError, match=r"source has a NUL character at offset 5"):
        tf.Kernel("int x\0; extern \"C\" __global__ void k() {}", "k")
    with pytest.raises(tf.TmaflowError, match=r"name='k\\x00x' must name a __global__ function"):
        tf.Kernel("extern \"C\" __global__ void k() {}", "k\0x")


def test_environment_variables_are_parsed_with_named_errors(monkeypatch):
    src = "extern \"C\" __global__ void k() {}"
    monkeypatch.setenv("TMAFLOW_WATCHDOG_S", "abc")
    tf.Kernel(src, "k", debug=False)  # a release build never reads it
    with pytest.raises(tf.TmaflowError, match=r"TMAFLOW_WATCHDOG_S='abc' must be a positive number of seconds"):
        tf.Kernel(src, "k", debug=True)
    monkeypatch.setenv("TMAFLOW_DEBUG", "2")
    with pytest.raises(tf.TmaflowError, match=r"TMAFLOW_DEBUG='2' must be one of 1/true/on/yes or 0/false/off/no"):
        tf.Kernel(src, "k")
    monkeypatch.setenv("TMAFLOW_DEBUG", "off")
    monkeypatch.setenv("TMAFLOW_CACHE", "maybe")
    from tmaflow.launch import cache

    with pytest.raises(tf.TmaflowError, match=r"TMAFLOW_CACHE='maybe' must be one of"):
        cache.enabled()


def test_errors_pickle():
    import pickle

    for err in (tf.CudaError("cuLaunchKernelEx", 719, "CUDA_ERROR_LAUNCH_FAILED", "grid=(1, 1, 1)"),
                tf.CompileError("NVRTC failed", log="x.cu(3): error", excerpt=">> 3 | bad"),
                tf.DeadlockError("stuck", [{"barrier": "full"}]), tf.LaunchError("argument 0: bad")):
        back = pickle.loads(pickle.dumps(err))
        assert type(back) is type(err) and str(back) == str(err)
    assert pickle.loads(pickle.dumps(tf.CudaError("c", 1, "N"))).code == 1


def test_a_bad_option_is_named():
    with pytest.raises(tf.CompileError, match=r"NVRTC refused the compile options of kernel.cu: "
                                              r"unrecognized option --not-an-option"):
        tf.Kernel("extern \"C\" __global__ void k() {}", "k", options=["--not-an-option"]).cubin


def test_a_missing_include_is_a_source_error_not_an_option():
    with pytest.raises(tf.CompileError, match=r"NVRTC failed to compile kernel.cu \(1 error\)\n"
                       r"(?s:.*)cannot open source file \"no_such_header.h\"") as info:
        tf.Kernel("#include <no_such_header.h>\n__global__ void k() {}", "k").cubin
    assert "layout=" not in info.value.message


def test_the_layout_header_without_a_layout_says_to_pass_one():
    source = '#include "tmaflow_layout.cuh"\nextern "C" __global__ void k() {}'
    with pytest.raises(tf.CompileError, match=r"NVRTC failed to compile kernel.cu \(1 error\); "
                       r"tmaflow_layout.cuh is generated from a shared-memory plan: pass "
                       r"layout=tf.SharedLayout\(\[...\]\) to tf.Kernel"):
        tf.Kernel(source, "k").cubin
    plan = tf.SharedLayout([tf.Buffer("scratch", 256)])
    assert tf.Kernel(source, "k", layout=plan).cubin


def test_ptxas_serializing_wgmma_is_a_warning_naming_the_note():
    # The accumulator is read while its wgmma may still run: ptxas injects a wait there.
    src = r'''
#include <tmaflow.cuh>
extern "C" __global__ void reads_in_flight(float* out, unsigned long long da, unsigned long long db) {
  float acc[32];
  for (int i = 0; i < 32; ++i) acc[i] = 0.f;
  tmaflow::wgmma::fence();
  tmaflow::wgmma::mma_m64n64k16_bf16(acc, da, db, 1);
  tmaflow::wgmma::commit_group();
  out[threadIdx.x] = acc[0];
  tmaflow::wgmma::wait_group<0>();
  for (int i = 0; i < 32; ++i) out[threadIdx.x * 32 + i] += acc[i];
}
'''
    k = tf.Kernel(src, "reads_in_flight")
    with pytest.warns(tf.TmaflowWarning, match=r"reads_in_flight: ptxas changed the wgmma pipeline.*\(C75\d\d\)"):
        k.cubin
    clean = src.replace("  out[threadIdx.x] = acc[0];\n", "")
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        tf.Kernel(clean, "reads_in_flight").cubin


def test_wgmma_pipeline_notes_of_both_ptxas_generations():
    log = ("ptxas info    : (C7517) warpgroup.wait is injected in around line 82 by compiler to allow "
           "use of registers defined by GMMA in function 'k'\n"
           "ptxas info    : (C7514) Potential Performance Loss: wgmma.mma_async instructions are "
           "serialized due to non wgmma instructions reading accumulator registers\n"
           "ptxas info    : Used 58 registers, used 0 barriers\n")
    notes = tf.launch.compiler.wgmma_pipeline_notes(log)
    assert [n[:7] for n in notes] == ["(C7517)", "(C7514)"] and "warpgroup.wait is injected" in notes[0]
    assert tf.launch.compiler.wgmma_pipeline_notes("ptxas info    : Used 58 registers\n") == []


@pytest.mark.parametrize("dtype,config", [
    ("bfloat16", dict(bn=256, cluster_m=2)), ("bfloat16", dict(bn=128, cluster_m=1)),
    ("float8_e4m3fn", dict(bn=192, cluster_m=2, epi_cols=64))])
def test_gemm_tail_split_compiles_without_spills(dtype, config):
    """The tail split's parts meet through per-tile counters (the atomic and the barrier
    reduction, as split-K's) without pushing the k-loop's registers into local memory."""
    from tmaflow.kernels.matmul import GemmConfig, gemm_plan
    from tmaflow.kernels.registry import get_kernel

    plan = gemm_plan(4096, 7168, 16384, "nt", GemmConfig(split_tail=True, **config), dtype)
    k = get_kernel("gemm_bf16", plan.layout, defines=plan.defines, file="gemm")
    sass = disassemble(k.cubin)
    assert "ATOMG.E.ADD" in sass and "BAR.RED.OR" in sass
    assert k.resources.spills == 0 and k.resources.stack_frame == 0


def test_nvrtc_output_leaves_the_shared_one_byte_bytes_alone():
    """An empty log is one byte (its NUL): read into ``b" " * 1``, CPython's shared ``b" "``,
    NVRTC's NUL turned every ``b" "`` of the process into ``b"\\0"``."""
    from tmaflow.launch.compiler import nvrtc_output
    from tmaflow.runtime import driver

    nv = driver.nvrtc()
    err, prog = nv.nvrtcCreateProgram(b'extern "C" __global__ void k() {}', b"k.cu", 0, [], [])
    try:
        assert int(nv.nvrtcCompileProgram(prog, 1, [b"--gpu-architecture=sm_90a"])[0]) == 0
        assert nvrtc_output(nv, "nvrtcGetProgramLog", prog) == b"\0"  # the empty log
        assert nvrtc_output(nv, "nvrtcGetCUBIN", prog)[:4] == b"\x7fELF"
    finally:
        nv.nvrtcDestroyProgram(prog)
    assert bytes([32]) == b" " and (b" " * 3) == b"   "


def test_extra_defines_sources_build_from_the_given_text():
    """A file's text replaced inside the block (tools/experiments/decode_source_ab.py times an
    earlier commit's decode.cu so): that kernel is built from it, and the tree's again after."""
    from tmaflow.kernels import registry

    plan = examples.copy_plan("float32", (256, 256))[1:]
    tree = registry.get_kernel("tile_copy", *plan)
    marked = registry.source("copy") + "\n// an earlier version\n"
    with registry.extra_defines({}, sources={"copy": marked}):
        inside = registry.get_kernel("tile_copy", *plan)
    assert inside.source == marked and inside is not tree
    assert registry.get_kernel("tile_copy", *plan) is tree and tree.source == registry.source("copy")
