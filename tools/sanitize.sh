#!/usr/bin/env bash
# compute-sanitizer (memcheck, racecheck, synccheck, initcheck) over every example kernel.
#   bash tools/sanitize.sh            -> a summary line per tool, logs under $OUT (or ./.out)
set -u
cd "$(dirname "$0")/.."
OUT=${OUT:-$PWD/.out}
mkdir -p "$OUT"
export PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH} TMAFLOW_CACHE_DIR=${TMAFLOW_CACHE_DIR:-/tmp/tmaflow-cache}
python3 tools/sanitize_examples.py > /dev/null 2>&1  # warm the compile cache outside the tools
for tool in memcheck racecheck synccheck initcheck; do
  timeout 300 compute-sanitizer --tool "$tool" --error-exitcode 9 python3 tools/sanitize_examples.py \
    > "$OUT/sanitize_$tool.log" 2>&1
  rc=$?
  summary=$(grep -E "ERROR SUMMARY|RACECHECK SUMMARY" "$OUT/sanitize_$tool.log" | tail -n 1)
  printf '%-10s exit %s  %s  %s\n' "$tool" "$rc" "${summary:-no summary}" \
    "$(tail -n 1 "$OUT/sanitize_$tool.log" | grep -E 'correct|wrong' || true)"
done
