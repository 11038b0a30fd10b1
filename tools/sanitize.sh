#!/usr/bin/env bash
# compute-sanitizer (memcheck, racecheck, synccheck, initcheck) over every example kernel.
#   bash tools/sanitize.sh            -> a summary line per tool, logs under $OUT (or ./.out)
set -u
cd "$(dirname "$0")/.."
OUT=${OUT:-$PWD/.out}
mkdir -p "$OUT"
export PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH} TMAFLOW_CACHE_DIR=${TMAFLOW_CACHE_DIR:-/tmp/tmaflow-cache}
for set in examples seeds; do
  flag=""; [ "$set" = seeds ] && flag="--seeds"
  python3 tools/sanitize_examples.py $flag > /dev/null 2>&1  # warm the compile cache outside the tools
  for tool in memcheck racecheck synccheck initcheck; do
    log="$OUT/sanitize_${set}_$tool.log"
    timeout "${SANITIZE_TOOL_BUDGET:-200}" compute-sanitizer --tool "$tool" --error-exitcode 9 python3 tools/sanitize_examples.py $flag \
      > "$log" 2>&1
    rc=$?
    summary=$(grep -E "ERROR SUMMARY|RACECHECK SUMMARY" "$log" | tail -n 1)
    where=$(grep -A1 -E "^========= [A-Z]" "$log" | grep -oE "at [A-Za-z_0-9]+" | sort | uniq -c | head -3 | tr '\n' ' ')
    printf '%-8s %-10s exit %s  %s  %s %s\n' "$set" "$tool" "$rc" "${summary:-no summary}" \
      "$(tail -n 1 "$log" | grep -E 'correct|wrong' || true)" "$where"
  done
done
