"""tmaflow across GPUs: symmetric memory from ``torch.distributed`` (``symmetric``), the signal
protocol and its CPU model (``protocol``), the overlapped all-gather + GEMM and GEMM +
reduce-scatter (``ops``) and per-rank flight-recorder merging (``timeline``). docs/multi-gpu.md.
Importing it sets the no-multicast environment (``symmetric.no_multicast``)."""
from __future__ import annotations

from .ops import all_gather_gemm, gemm_reduce_scatter, last_traces, release
from .protocol import shard_rows
from .symmetric import SymmetricBuffer, no_multicast
from .timeline import merge_traces

__all__ = ["SymmetricBuffer", "all_gather_gemm", "gemm_reduce_scatter", "last_traces",
           "merge_traces", "no_multicast", "release", "shard_rows"]
