#!/usr/bin/env bash
# The whole GPU tier plus the benchmarks, in one call on the device machine:
#   bash tools/gpu_check.sh [pytest -k expression]
# Env: SKIP_TESTS=1 / SKIP_DEMO=1 / SKIP_BENCH=1 / SKIP_GEMM=1, TEST_BUDGET / BENCH_BUDGET (seconds),
#      BENCH_ARGS, GEMM_BUDGET, GEMM_ARGS (tools/peers/bench_gemm.py, e.g. --sweep), SANITIZE=1 (compute-sanitizer over the examples and seeds),
#      PEERS=1 (the peer-benchmark set: tools/peers/*, every row cold and back to back, bench records in $OUT/results), PEER_BUDGET (seconds each),
#      CUDA12_WHEELS=DIR (also run the GPU tier on the CUDA 12 wheels in DIR: tools/cuda12_wheels.sh DIR makes them),
#      PYTEST_JOBS=N (pytest-xdist workers, whole files each: the cold compile cache fills N times faster),
#      FAULTS_BUDGET (seconds, the fault files' process), CONC_BUDGET (seconds, the concurrency suite and the varlen file under xdist), RESET_PROBE=1 (torch, planted hangs that reset the context, then saved traces + store sweep in one process).
# Writes logs and JSON under $OUT (or ./.out) and prints a short table last. On a copied tree
# (the device tool), write the commit to COMMIT (git ignores it) and carry it: records and the
# table name it; the copy's own git HEAD can be stale.
set -u
cd "$(dirname "$0")/.."
OUT=${OUT:-$PWD/.out}
mkdir -p "$OUT"
export PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH} PYTHONUNBUFFERED=1
export TMAFLOW_CACHE_DIR=${TMAFLOW_CACHE_DIR:-/tmp/tmaflow-cache} TMAFLOW_REPORT_DIR=$OUT
{
  nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader
  python3 -c "import cuda.bindings, numpy; from cuda.bindings import nvrtc; print('cuda-bindings', cuda.bindings.__version__, 'nvrtc', nvrtc.nvrtcVersion()[1:], 'numpy', numpy.__version__)"
  cat COMMIT 2>/dev/null || git rev-parse --short HEAD 2>/dev/null || echo "commit unknown"
} | tee "$OUT/env.txt"
K=${1:-}
# With xdist, the files that plant kernel faults (traps, deadlocks) and recover with
# Device.reset() run apart, in one plain process of their own: a reset also destroys the
# context torch shares, so once a worker had run torch tests first, a planted fault's context
# could not be reset (CUDA_ERROR_LAUNCH_FAILED kept), failing every later test of that worker.
# (The battery ran apart too until session 15: its saved-trace cases failed inside xdist
# workers, whose files then also held the in-process resets; RESET_PROBE=1 tells the two apart.)
FAULTS="tests/test_gpu_trace.py tests/test_gpu_faults.py tests/test_gpu_watchdog.py"
# The concurrency suite is the longest file: under --dist loadfile it ran whole in one worker
# past the budget (session 15); with xdist it runs after, its tests spread over the workers.
# The varlen file too since it outgrew one worker's share (session 22: 23 of its tests were
# still to run when the budget ended the main run).
CONC="tests/test_gpu_concurrency.py tests/test_gpu_attention_varlen.py"
run_tier() {  # python, log suffix: the GPU tier (with PYTEST_JOBS: main run, then CONC and FAULTS apart)
  local py=$1 tag=$2 apart=""
  for f in $CONC; do apart="$apart --ignore=$f"; done
  for f in $FAULTS; do apart="$apart --ignore=$f"; done
  timeout "${TEST_BUDGET:-420}" "$py" -m pytest tests -m gpu -v -p no:cacheprovider --timeout=90 \
    --maxfail=${MAXFAIL:-15} ${PYTEST_JOBS:+-n "$PYTEST_JOBS" --dist loadfile $apart} \
    ${K:+-k "$K"} --durations=10 -rfE > "$OUT/pytest_gpu$tag.log" 2>&1
  echo "pytest$tag exit $?"
  if [ -n "${PYTEST_JOBS:-}" ]; then
    timeout "${CONC_BUDGET:-300}" "$py" -m pytest $CONC -m gpu -q -p no:cacheprovider --timeout=90 \
      -n "$PYTEST_JOBS" --dist load ${K:+-k "$K"} -rfE > "$OUT/pytest_gpu_concurrency$tag.log" 2>&1
    echo "pytest$tag (concurrency and varlen, --dist load) exit $?"
    timeout "${FAULTS_BUDGET:-240}" "$py" -m pytest $FAULTS -m gpu -q -p no:cacheprovider --timeout=90 ${K:+-k "$K"} -rfE \
      > "$OUT/pytest_gpu_faults$tag.log" 2>&1
    echo "pytest$tag (planted faults, no xdist) exit $?"
  fi
}
[ -z "${SKIP_TESTS:-}" ] && run_tier python3 ""
if [ -n "${RESET_PROBE:-}" ]; then
  # One plain process: torch initialises CUDA, planted hangs reset the context it shares, then
  # the saved-trace battery cases and the store-model sweep run. Failures here and none in the
  # xdist run say the in-process resets, not xdist, broke them.
  timeout 240 python3 -m pytest -p no:cacheprovider -q -m gpu --timeout=90 -rfE \
    tests/test_gpu_dlpack.py tests/test_gpu_watchdog.py tests/test_battery.py tests/test_gpu_store_model.py \
    -k "dlpack or planted or saved or store" > "$OUT/pytest_reset_probe.log" 2>&1
  echo "reset probe exit $?"
fi
if [ -z "${SKIP_DEMO:-}" ]; then
  timeout 120 python3 -m tmaflow demo > "$OUT/demo.log" 2>&1
  echo "demo exit $?"
fi
if [ -z "${SKIP_BENCH:-}" ]; then
  timeout "${BENCH_BUDGET:-200}" python3 -m tmaflow bench --json "$OUT/bench.json" --records "$OUT/results" ${BENCH_ARGS:-} > "$OUT/bench.log" 2>&1
  echo "bench exit $?"
  if [ -z "${SKIP_GEMM:-}" ]; then
    timeout "${GEMM_BUDGET:-240}" python3 tools/peers/bench_gemm.py --json "$OUT/gemm.json" ${GEMM_ARGS:-} > "$OUT/gemm.log" 2>&1
    echo "gemm bench exit $?"
  fi
fi
if [ -n "${PEERS:-}" ]; then
  # The peer-benchmark set: each writes its bench record (copy $OUT/results/*.json to bench/results/,
  # then python tools/docs/benchmarks_page.py, to update BENCHMARKS.md).
  mkdir -p "$OUT/results"
  for peer in "bench_gemm.py --suite 30 --json $OUT/results/gemm_bf16.json" \
              "bench_gemm.py --suite unaligned --json $OUT/results/gemm_unaligned.json" \
              "bench_gemm.py --suite skinny --json $OUT/results/gemm_skinny.json" \
              "bench_gemm.py --fp8 --json $OUT/results/gemm_fp8.json" \
              "bench_grouped.py --quick --json $OUT/results/gemm_grouped.json" \
              "bench_attention.py --quick --json $OUT/results/attention.json" \
              "bench_attention.py --decode --quick --json $OUT/results/attention_decode.json" \
              "bench_attention.py --backward --quick --json $OUT/results/attention_backward.json" \
              "train_block.py --json $OUT/results/attention_training.json" \
              "bench_autotune.py --json $OUT/results/autotune.json"; do
    name=$(echo "$peer" | tr -s ' ' '_' | tr -cd '[:alnum:]_.-' | cut -c1-60)
    timeout "${PEER_BUDGET:-400}" python3 tools/peers/$peer > "$OUT/peer_$name.log" 2>&1
    echo "peer $peer exit $?"
  done
fi
if [ -n "${SANITIZE:-}" ]; then
  bash tools/sanitize.sh > "$OUT/sanitize.txt" 2>&1
  echo "sanitize done"
fi
if [ -n "${CUDA12_WHEELS:-}" ]; then
  # The CUDA 12 stack's kernels (NVRTC 12 compiles other code: its plans differ where its ptxas
  # spills) on this driver: the image's interpreter and packages (torch, cupy, pytest-xdist),
  # the CUDA 12 wheels in a directory ahead of them on PYTHONPATH (cuda-bindings 12 then, and
  # its headers; torch keeps its own CUDA 13 runtime). (A venv over the "system" site-packages
  # does not see the image's: they are not the base interpreter's.) NVRTC 12 is preloaded:
  # cuda-pathfinder searches site.getsitepackages(), not PYTHONPATH, and takes the image's
  # libnvrtc.so.13 first (session 24: cuda-bindings 12.9 then ran NVRTC 13.0). The NVRTC 12
  # wheel holds two 106 MB libraries (libnvrtc.so.12 and an .alt one): carried, the wheel
  # repacked without the .alt files (and their RECORD lines) fits the 64 MiB carry.
  site=/tmp/tmaflow-cu12-site
  python3 -m pip install -q --no-index --no-deps --no-compile --target "$site" "$CUDA12_WHEELS"/*.whl
  ( export TMAFLOW_CACHE_DIR=/tmp/tmaflow-cache12 PYTHONPATH=$site:$PYTHONPATH
    export LD_PRELOAD=$site/nvidia/cuda_nvrtc/lib/libnvrtc.so.12
    python3 -c "import cuda.bindings, sys, tmaflow.launch.compiler as c; from cuda.bindings import nvrtc; v = nvrtc.nvrtcVersion()[1:]; print('CUDA 12 stack: cuda-bindings', cuda.bindings.__version__, 'nvrtc', v, 'headers', c.include_dirs()[2:]); sys.exit(cuda.bindings.__version__[:3] != '12.' or v[0] != 12)" \
      >> "$OUT/env.txt"
    loaded=$?
    tail -n 1 "$OUT/env.txt"
    [ "$loaded" = 0 ] || { echo "CUDA 12 stack not loaded"; exit 1; }
    run_tier python3 _cuda12 )
fi
echo "== failures =="
for f in "$OUT"/pytest_gpu*.log; do grep -HE "^(FAILED|ERROR)" "$f" | head -40; done
[ -f "$OUT/pytest_reset_probe.log" ] && grep -E "^(FAILED|ERROR)" "$OUT/pytest_reset_probe.log" | head -20
for f in "$OUT"/failures-*.txt; do  # written as each test fails (tests/conftest.py)
  [ -f "$f" ] && grep -E "^=== |^E  " "$f" | cut -c1-240 | head -40
done
echo "== summary =="
[ -f "$OUT/pytest_gpu.log" ] && tail -n 3 "$OUT/pytest_gpu.log"
[ -f "$OUT/pytest_reset_probe.log" ] && echo "reset probe: $(tail -n 1 "$OUT/pytest_reset_probe.log")"
[ -f "$OUT/pytest_gpu_faults.log" ] && echo "planted faults: $(tail -n 1 "$OUT/pytest_gpu_faults.log")"
for f in "$OUT"/pytest_gpu*_cuda12.log; do [ -f "$f" ] && echo "CUDA 12 $(basename "$f" .log): $(tail -n 1 "$f")"; done
[ -f "$OUT/sanitize.txt" ] && cat "$OUT/sanitize.txt"
[ -f "$OUT/counts.json" ] && cat "$OUT/counts.json" && echo
[ -f "$OUT/demo.log" ] && tail -n 14 "$OUT/demo.log"
[ -f "$OUT/bench.log" ] && tail -n 45 "$OUT/bench.log"
[ -f "$OUT/gemm.log" ] && tail -n 40 "$OUT/gemm.log"
