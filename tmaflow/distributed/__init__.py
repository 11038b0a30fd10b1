"""tmaflow across GPUs: symmetric memory from ``torch.distributed`` (``symmetric``), the signal
protocol and its CPU model (``protocol``), the overlapped all-gather + GEMM and GEMM +
reduce-scatter (``ops``) and per-rank flight-recorder merging (``timeline``). docs/multi-gpu.md."""
