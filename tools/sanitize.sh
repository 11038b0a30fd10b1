#!/usr/bin/env bash
# compute-sanitizer (memcheck, racecheck, synccheck, initcheck) over every kernel: the examples,
# the seeds, and the library (one small GPU test per kernel variant, tools/sanitize_library.txt).
#   bash tools/sanitize.sh            -> a summary line per set and tool, logs under $OUT (or ./.out)
# Env: SANITIZE_SETS (default "examples seeds library"; "handoff" / "handoff-warp": a cp.async ->
#      mbarrier hand-off alone, released by every consumer lane / by one lane after __syncwarp as
#      the GEMM's consumers did, to tell a racecheck limitation from a race; "handoff-named": one lane
#      after a named barrier of the warp's 32 threads; "handoff-lanes": the GEMM's hand-off in
#      clusters of 2 released as gemm.cu does, every lane on its own CTA's barrier and one per warp
#      on the other's; "handoff-quads": one reading lane per quad; "handoff-lanes-warp": the same
#      kernel released one lane per CTA after __syncwarp; "library-block-scales": the library set's
#      fp8 block-scale tests only; "ids": the pytest node ids in SANITIZE_IDS), SANITIZE_TOOLS
#      (default all four), SANITIZE_TOOL_BUDGET (seconds per run).
# The four tools run side by side on the one GPU (each in its own process).
set -u
cd "$(dirname "$0")/.."
OUT=${OUT:-$PWD/.out}
mkdir -p "$OUT"
export PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH} TMAFLOW_CACHE_DIR=${TMAFLOW_CACHE_DIR:-/tmp/tmaflow-cache}
# initcheck does not count TMA stores (or tensormap-proxy writes) as initialising global memory:
# the library's scratch (edge staging, descriptor slots, trace rings) is zeroed when made
export TMAFLOW_ZERO_SCRATCH=1
TOOLS=${SANITIZE_TOOLS:-memcheck racecheck synccheck initcheck}
library_ids=$(grep -vE '^\s*(#|$)' tools/sanitize_library.txt)
block_scale_ids=$(echo "$library_ids" | grep block_scales)
run_set() {  # set -> the command compute-sanitizer runs
  case "$1" in
    examples) echo "python3 tools/sanitize_examples.py" ;;
    seeds) echo "python3 tools/sanitize_examples.py --seeds" ;;
    handoff) echo "python3 tools/sanitize_examples.py --handoff" ;;
    handoff-warp) echo "python3 tools/sanitize_examples.py --handoff --warp-release" ;;
    handoff-named) echo "python3 tools/sanitize_examples.py --handoff --named-release" ;;
    handoff-lanes) echo "python3 tools/sanitize_examples.py --handoff --lanes-release" ;;
    handoff-quads) echo "python3 tools/sanitize_examples.py --handoff --lanes-release --quads" ;;
    handoff-lanes-warp) echo "python3 tools/sanitize_examples.py --handoff --lanes-release --one-lane" ;;
    library) echo "python3 -m pytest -q -p no:cacheprovider -m gpu $library_ids" ;;
    library-block-scales) echo "python3 -m pytest -q -p no:cacheprovider -m gpu $block_scale_ids" ;;
    ids) echo "python3 -m pytest -q -p no:cacheprovider -m gpu ${SANITIZE_IDS:?SANITIZE_IDS: pytest node ids}" ;;
  esac
}
for set in ${SANITIZE_SETS:-examples seeds library}; do
  cmd=$(run_set "$set")
  $cmd > "$OUT/sanitize_${set}_plain.log" 2>&1  # warm the compile cache outside the tools
  for tool in $TOOLS; do
    timeout "${SANITIZE_TOOL_BUDGET:-300}" compute-sanitizer --tool "$tool" --error-exitcode 9 $cmd \
      > "$OUT/sanitize_${set}_$tool.log" 2>&1 &
  done
  wait
  for tool in $TOOLS; do
    log="$OUT/sanitize_${set}_$tool.log"
    summary=$(grep -E "ERROR SUMMARY|RACECHECK SUMMARY" "$log" | tail -n 1)
    where=$(grep -A1 -E "^========= [A-Z]" "$log" | grep -oE "at [A-Za-z_0-9]+" | sort | uniq -c | head -3 | tr '\n' ' ')
    result=$(tail -n 3 "$log" | grep -E 'correct|wrong|passed|failed' | tail -n 1)
    printf '%-8s %-10s %s  %s %s\n' "$set" "$tool" "${summary:-no summary}" "$result" "$where"
  done
done
