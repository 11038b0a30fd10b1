"""tmaflow's timing library, shared by the tests, ``tools/`` and ``python -m tmaflow bench``:
``do_bench`` (CUDA events on a stream, L2 flushed before every call or back to back, median and
spread), interleaved ``rounds`` of several functions with per-round ratios, ``versus`` (ours
against a peer, both ways), CUPTI kernel times, shape parsing, random operands and bench JSON."""
from __future__ import annotations

from . import cublas, cupti, records
from .cupti import call_times, kernel_times
from .bandwidth import memcpy_bandwidth
from . import gemm_shapes
from .events import EventPair, L2Flush, flush_bytes
from .internals import call as cuda_call
from .internals import cuda_driver
from .operands import (block_scales, nt_operands, parse_gemm_shape, parse_shape, parse_shapes,
                       poisoned_error, random_array, rel_error)
from .peers import Versus, versus
from .result import Result, ratios
from .timing import Rounds, Sampler, do_bench, host_rounds, per_call_host, rounds

__all__ = ["EventPair", "L2Flush", "Result", "Rounds", "Sampler", "Versus", "block_scales", "call_times", "cublas", "cuda_call", "cuda_driver", "cupti", "gemm_shapes",
           "do_bench", "flush_bytes", "memcpy_bandwidth", "host_rounds", "kernel_times", "nt_operands", "parse_gemm_shape",
           "parse_shape", "parse_shapes", "per_call_host", "random_array", "ratios", "records",
           "poisoned_error", "rel_error", "rounds", "versus"]
