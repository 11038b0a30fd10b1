#!/usr/bin/env bash
# The whole GPU tier plus the benchmarks, in one call on the device machine:
#   bash tools/gpu_check.sh [pytest -k expression]
# Writes logs and JSON under $OUT (or ./.out) and prints a short table last.
set -u
cd "$(dirname "$0")/.."
OUT=${OUT:-$PWD/.out}
mkdir -p "$OUT"
export PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH} PYTHONUNBUFFERED=1
export TMAFLOW_CACHE_DIR=${TMAFLOW_CACHE_DIR:-/tmp/tmaflow-cache} TMAFLOW_REPORT_DIR=$OUT
{
  nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader
  python3 -c "import cuda.bindings, numpy; from cuda.bindings import nvrtc; print('cuda-bindings', cuda.bindings.__version__, 'nvrtc', nvrtc.nvrtcVersion()[1:], 'numpy', numpy.__version__)"
  git rev-parse --short HEAD 2>/dev/null || echo "commit unknown"
} | tee "$OUT/env.txt"
K=${1:-}
python3 -m pytest tests -m gpu -q -x -p no:cacheprovider ${K:+-k "$K"} --durations=8 2>&1 | tee "$OUT/pytest_gpu.log" | tail -n 40
if [ -z "${SKIP_BENCH:-}" ]; then
  python3 -m tmaflow bench --json "$OUT/bench.json" 2>&1 | tee "$OUT/bench.log"
fi
echo "== summary =="
tail -n 1 "$OUT/pytest_gpu.log"
[ -f "$OUT/bench.log" ] && grep -E "launch overhead|encode|compile:|kernel|tile_copy|transpose|softmax|axpb|broadcast|cuMemcpy" "$OUT/bench.log"
