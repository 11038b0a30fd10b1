"""The library's internal modules the benchmarks reach beyond the public API (the driver's
checked call, stream resolution, the launch path's pieces). One place names them, so moving a
module inside tmaflow changes this file and nothing else in the bench package."""
from __future__ import annotations

from .. import native
from ..device import stream_handle
from ..kernels.examples import broadcast_reference
from ..driver import call
from ..driver import cu as cuda_driver
from ..tensormap import encode

# cuda_call: the checked driver call; cuda_driver: cuda.bindings.driver, for raw launches
__all__ = ["broadcast_reference", "call", "cuda_driver", "encode", "native", "stream_handle"]
