#!/usr/bin/env bash
# The multi-GPU runs of tmaflow.distributed in one command, on a host with 2-8 NVLink GPUs:
#   bash tools/multi_gpu_check.sh [RANKS ...]      (default: 2 4 8, those the host has)
# For each rank count: the world-size-1 tests (tests/test_gpu_distributed.py) once, then the
# multi-rank tests (tests/test_gpu_multirank.py) and the benchmark
# (tools/peers/bench_distributed.py) under torchrun. Env: SKIP_BENCH=1, BENCH_ARGS (e.g.
# "--tokens 4096 --repeats 5"), SKIP_W1=1 (no world-size-1 tests), TEST_BUDGET / BENCH_BUDGET (seconds per rank count).
# Multicast stays off in every process (NVLink multicast can take shared GPUs out of service).
# Writes logs and bench records under $OUT (or ./.out) and prints one line per run.
set -u
cd "$(dirname "$0")/.."
OUT=${OUT:-$PWD/.out}
mkdir -p "$OUT"
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
export PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH} PYTHONUNBUFFERED=1
export TMAFLOW_CACHE_DIR=${TMAFLOW_CACHE_DIR:-/tmp/tmaflow-cache}
GPUS=$(nvidia-smi --list-gpus | wc -l)
nvidia-smi topo -m > "$OUT/topology.txt" 2>&1
status=0
if [ -z "${SKIP_W1:-}" ]; then
  timeout "${TEST_BUDGET:-300}" python3 -m pytest tests/test_gpu_distributed.py -q -p no:cacheprovider -rfE \
    > "$OUT/distributed_w1.log" 2>&1
  rc=$?; [ $rc -ne 0 ] && status=1
  echo "world size 1 tests: exit $rc ($(tail -1 "$OUT/distributed_w1.log"))"
fi
for n in ${@:-2 4 8}; do
  if [ "$n" -gt "$GPUS" ]; then echo "$n ranks: skipped (this host has $GPUS GPUs)"; continue; fi
  timeout "${TEST_BUDGET:-300}" torchrun --standalone --nproc-per-node "$n" -m pytest tests/test_gpu_multirank.py \
    -q -p no:cacheprovider -rfE > "$OUT/multirank_$n.log" 2>&1
  rc=$?; [ $rc -ne 0 ] && status=1
  echo "$n ranks tests: exit $rc ($(grep -E '^[0-9]+ (passed|failed)|passed|failed' "$OUT/multirank_$n.log" | tail -1))"
  if [ -z "${SKIP_BENCH:-}" ]; then
    timeout "${BENCH_BUDGET:-600}" torchrun --standalone --nproc-per-node "$n" tools/peers/bench_distributed.py \
      ${BENCH_ARGS:-} --json "$OUT/results/distributed_$n.json" > "$OUT/bench_distributed_$n.log" 2>&1
    rc=$?; [ $rc -ne 0 ] && status=1
    echo "$n ranks bench: exit $rc (log: $OUT/bench_distributed_$n.log)"
  fi
done
exit $status
