"""Launch configurations: ``LaunchConfig`` holds every configuration rule, once, and
``resolve_stream`` turns a call's ``stream`` argument into the one handle it launches on.

Streams: an explicit ``stream`` is used as given. ``stream=None`` follows the convention of
the arrays passed, as Triton does for torch: the current torch stream of the launch device
when any argument is a torch tensor (or a TensorMap of one), else the current cupy stream
when any is a cupy array, else the legacy default stream; while this thread captures a
``tf.Graph``, the graph's stream. Entry points resolve it once per call (``resolve_stream``)
and key everything per stream by the handle; a launcher bound with ``stream=None`` applies
the rule at each call.
"""
from __future__ import annotations

import operator
from dataclasses import dataclass, field

from .. import checks
from ..errors import LaunchError
from ..runtime.device import framework_stream, stream_handle
from ..runtime.graph import ACTIVE as CAPTURING, capturing

GRID_LIMITS = (2**31 - 1, 65535, 65535)
BLOCK_LIMITS = (1024, 1024, 64)
MAX_THREADS = 1024
PORTABLE_CLUSTER = 8
MAX_CLUSTER = 16


def dims(name: str, value) -> tuple[int, int, int]:
    """An int or a sequence of 1-3 ints, as an (x, y, z) triple of extents >= 1."""
    try:
        out = checks.as_ints(name, value, error=LaunchError)
    except LaunchError:
        raise LaunchError(f"{name}={value!r} must be an int or a tuple of 1-3 ints") from None
    if not 1 <= len(out) <= 3 or any(d < 1 for d in out):
        raise LaunchError(f"{name}={value!r} must have 1-3 extents, each >= 1")
    x, y, z = out + (1,) * (3 - len(out))
    return x, y, z


@dataclass(frozen=True)
class LaunchConfig:
    """A checked, normalised, hashable launch configuration.

    ``grid`` counts blocks; ``cluster`` must divide it. Lists and ints are accepted and
    normalised to (x, y, z). ``smem`` is dynamic shared memory in bytes (None: the kernel's
    layout decides). ``stream`` is kept as its raw handle (None: follow the arrays'
    framework, see the module doc); the stream object itself is kept alive by the config.
    ``pdl`` allows programmatic dependent launch (the kernel may start while the previous
    one on the stream finishes; it must ``griddepcontrol.wait`` before reading its output).
    ``cooperative`` launches the grid cooperative: the driver runs it only with every block
    resident at once (it refuses a grid larger than the device holds), for kernels whose
    blocks wait on each other in any order.
    """

    grid: tuple
    block: tuple
    cluster: tuple = (1, 1, 1)
    smem: int | None = None
    stream: int | None = None
    pdl: bool = False
    cooperative: bool = False
    stream_object: object = field(default=None, compare=False, hash=False, repr=False)

    def __post_init__(self):
        set_ = object.__setattr__
        grid, block, cluster = dims("grid", self.grid), dims("block", self.block), dims("cluster", self.cluster)
        for axis, (g, limit) in enumerate(zip(grid, GRID_LIMITS)):
            if g > limit:
                raise LaunchError(f"grid={grid}: axis {'xyz'[axis]} has {g} blocks; the limit is {limit}")
        for axis, (b, limit) in enumerate(zip(block, BLOCK_LIMITS)):
            if b > limit:
                raise LaunchError(f"block={block}: axis {'xyz'[axis]} has {b} threads; the limit is {limit}")
        threads = block[0] * block[1] * block[2]
        if threads > MAX_THREADS:
            raise LaunchError(f"block={block} has {threads} threads; a block holds at most {MAX_THREADS}")
        for axis, (g, c) in enumerate(zip(grid, cluster)):
            if g % c:
                raise LaunchError(f"cluster={cluster} does not divide grid={grid} (in blocks): "
                                  f"axis {'xyz'[axis]} has {g} blocks, not a multiple of {c}")
        size = cluster[0] * cluster[1] * cluster[2]
        if size > MAX_CLUSTER:
            raise LaunchError(f"cluster={cluster} has {size} blocks; Hopper allows at most "
                              f"{PORTABLE_CLUSTER} (portable) or {MAX_CLUSTER} (non-portable)")
        smem = self.smem
        if smem is not None and (not checks.is_int(smem) or not 0 <= operator.index(smem) < 1 << 32):
            raise LaunchError(f"smem={smem!r} must be a non-negative int below 2^32 (bytes of "
                              "dynamic smem)")
        set_(self, "pdl", checks.as_bool("pdl", self.pdl, LaunchError))
        set_(self, "cooperative", checks.as_bool("cooperative", self.cooperative, LaunchError))
        stream, owner = self.stream, self.stream_object
        if stream is not None and not (type(stream) is int and owner is not None):
            owner = stream
            stream = stream_handle(stream)
        set_(self, "grid", grid)
        set_(self, "block", block)
        set_(self, "cluster", cluster)
        set_(self, "smem", None if smem is None else operator.index(smem))
        set_(self, "stream", stream)
        set_(self, "stream_object", owner)

    @property
    def threads(self) -> int:
        """Threads per block."""
        return self.block[0] * self.block[1] * self.block[2]

    @property
    def cluster_size(self) -> int:
        """Blocks per cluster."""
        return self.cluster[0] * self.cluster[1] * self.cluster[2]


def resolve_stream(stream, arrays, ordinal: int) -> int:
    """The stream a call launches on, resolved once where the call enters tmaflow: a given
    stream's checked handle (``stream_handle``); for None, the graph this thread captures
    into, else the rule of the module doc for ``arrays`` (DeviceArray views or TensorMaps of
    the call's arguments). Cache keys and per-stream resources (split-K workspaces, descriptor
    slots, outputs) take what this returns, never None. ``arrays`` may hold None (an output
    not given)."""
    if stream is not None:
        return stream_handle(stream)
    if CAPTURING:
        graph = capturing()
        if graph is not None:
            return graph.stream.handle
    framework = None
    for a in arrays:
        origin = None if a is None else a._origin
        if origin is not None:
            framework = origin
            if origin == "torch":
                break
    return 0 if framework is None else framework_stream(framework, ordinal)
