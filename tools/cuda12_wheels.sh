#!/usr/bin/env bash
# The CUDA 12 stack's wheels for the device machine's Python (3.12, x86_64), small enough to carry
# (64 MiB): cuda-bindings 12, cuda-pathfinder, NVRTC, CCCL and runtime headers. The NVRTC wheel
# holds libnvrtc.so.12 and an .alt copy (106 MB each, 89 MB zipped); it is rewritten without the
# .alt files and their RECORD lines (44 MB). Then, on the GPU:
#   bash tools/cuda12_wheels.sh .whl     # here; carry .whl (add it to .git/info/exclude)
#   CUDA12_WHEELS=.whl SKIP_TESTS=1 SKIP_DEMO=1 SKIP_BENCH=1 PYTEST_JOBS=12 bash tools/gpu_check.sh
set -euo pipefail
dir=${1:-.whl}
mkdir -p "$dir"
rm -f "$dir"/*.whl
python3 -m pip download -q --only-binary=:all: --no-deps --dest "$dir" --python-version "${PY_VERSION:-3.12}" \
  --platform manylinux_2_28_x86_64 --platform manylinux2014_x86_64 --platform manylinux_2_17_x86_64 \
  --platform manylinux2010_x86_64 --platform manylinux_2_12_x86_64 \
  "cuda-bindings>=12.8,<13" "cuda-pathfinder~=1.1" "nvidia-cuda-nvrtc-cu12>=12.8" \
  "nvidia-cuda-cccl-cu12>=12.8" "nvidia-cuda-runtime-cu12>=12.8"
python3 - "$dir"/nvidia_cuda_nvrtc_cu12-*.whl <<'PY'
import os, sys, zipfile
wheel = sys.argv[1]
with zipfile.ZipFile(wheel) as src, zipfile.ZipFile(wheel + ".new", "w", zipfile.ZIP_DEFLATED, compresslevel=9) as dst:
    for item in src.infolist():
        if ".alt." in item.filename:
            continue
        data = src.read(item)
        if item.filename.endswith(".dist-info/RECORD"):
            data = b"".join(line for line in data.splitlines(keepends=True) if b".alt." not in line)
        dst.writestr(item, data, compress_type=zipfile.ZIP_DEFLATED, compresslevel=9)
os.replace(wheel + ".new", wheel)
PY
du -ch "$dir"/*.whl | tail -n 1
