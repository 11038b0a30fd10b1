"""``all_gather_gemm`` and ``gemm_reduce_scatter``: tensor-parallel GEMMs whose communication
overlaps the GEMM, by executing the schedules of ``protocol`` with torch streams.

Per call each rank queues, on the caller's (compute) stream and a communication stream of its
own: the GEMM of what it already has at once; copy-engine pulls of peer data from symmetric
memory, each after a device-side wait on the peer's signal (a driver stream operation,
``streamops``; in debug and trace builds and under graph capture the one-thread kernel
``signal_wait_reset``: in debug builds a wait that never completes is a DeadlockError naming
the rank, the peer and the signal); the GEMM of a pulled shard after an event on its copy.
Everything is queued asynchronously with constant values, so ``torch.cuda.graph`` captures a
call whole, and a call whose operands, output and stream come back is captured once and
replayed (``_execute``). Calls that share a plan run in turn across streams (``turns``).
Inside ``torch.compile`` call the custom ops (``import tmaflow.torch``):
``torch.ops.tmaflow.all_gather_gemm(a_shard, b, group.group_name, m)`` and
``torch.ops.tmaflow.gemm_reduce_scatter(a, b_shard, group.group_name)``.
"""
from __future__ import annotations

import logging
import math
import threading
from collections import OrderedDict
from dataclasses import dataclass

from .. import checks
from ..debug import trace as flight_recorder, watchdog
from ..errors import DeadlockError, TmaflowError
from ..kernels.matmul.dense import gemm
from ..kernels.matmul.splitk import serial_capture
from ..kernels.registry import get_kernel
from ..runtime import device as devices, driver
from . import protocol, streamops
from .symmetric import SymmetricBuffer, group_of, on_device
from . import turns as call_turns

log = logging.getLogger("tmaflow.distributed")

DTYPES = ("bfloat16", "float8_e4m3fn")


@dataclass(frozen=True)
class Shapes:
    """The checked shapes of one call: shard rows of every rank, N, K and the operand dtype."""
    rows: tuple
    n: int
    k: int
    dtype: str

    @property
    def m(self) -> int:
        return sum(self.rows)

    def span(self, shard: int) -> slice:
        start = sum(self.rows[:shard])
        return slice(start, start + self.rows[shard])


def _operand(name: str, shape, dtype: str) -> tuple:
    if len(shape) != 2:
        raise TmaflowError(f"{name}: shape {tuple(shape)} must be 2-D")
    if dtype not in DTYPES:
        raise TmaflowError(f"{name}: dtype {dtype} must be one of {DTYPES}")
    return tuple(shape)


def _operands(who: str, a: tuple, b: tuple, b_layout: str) -> tuple:
    """The shapes of the (name, shape, dtype) operands a and b: each 2-D of a supported dtype,
    one dtype, one K (b is ``b_layout``)."""
    (a_name, a_shape, a_dtype), (b_name, b_shape, b_dtype) = a, b
    a_shape, b_shape = _operand(a_name, a_shape, a_dtype), _operand(b_name, b_shape, b_dtype)
    if a_dtype != b_dtype:
        raise TmaflowError(f"{who}: {a_name} is {a_dtype} but {b_name} is {b_dtype}; they must match")
    if a_shape[1] != b_shape[1]:
        raise TmaflowError(f"{who}: K of {a_name} ({a_shape[1]}) and {b_name} ({b_shape[1]}) differ "
                           f"({b_name} is {b_layout})")
    return a_shape, b_shape


def _scales(who: str, dtype: str, scale_a, scale_b) -> None:
    given = (scale_a is not None, scale_b is not None)
    if dtype == "bfloat16" and any(given):
        raise TmaflowError(f"{who}: scale_a / scale_b dequantise float8_e4m3fn operands; the "
                           "operands are bfloat16 (pass no scales)")
    if dtype != "bfloat16" and not all(given):
        raise TmaflowError(f"{who}: float8_e4m3fn operands need both scale_a and scale_b "
                           "(per-tensor floats)")


def gather_shapes(a_shape, a_dtype: str, b_shape, b_dtype: str, m, world: int, rank: int,
                  scale_a=None, scale_b=None) -> Shapes:
    """Check an all_gather_gemm call: rank ``rank``'s shard (rows x K) of the M rows
    (``m``; None: rows x world), b (N x K) of the same dtype."""
    world, rank = protocol.check_world(world, rank)
    a_shape, b_shape = _operands("all_gather_gemm", ("a_shard", a_shape, a_dtype), ("b", b_shape, b_dtype),
                                 "N x K")
    m = a_shape[0] * world if m is None else checks.as_int("m", m, 0)
    rows = protocol.shard_rows(m, world)
    if a_shape[0] != rows[rank]:
        raise TmaflowError(f"all_gather_gemm: a_shard has {a_shape[0]} rows but rank {rank}'s shard "
                           f"of m={m} rows over {world} ranks has {rows[rank]} (shards: {rows}; "
                           "ceil(m / world) each, the last ones ragged)")
    _scales("all_gather_gemm", a_dtype, scale_a, scale_b)
    return Shapes(tuple(rows), b_shape[0], a_shape[1], a_dtype)


def scatter_shapes(a_shape, a_dtype: str, b_shape, b_dtype: str, world: int, rank: int,
                   scale_a=None, scale_b=None) -> Shapes:
    """Check a gemm_reduce_scatter call: a (M x K_local), b_shard (N x K_local); rank r gets
    rows ``shard_rows(M, world)[r]`` of the sum."""
    world, rank = protocol.check_world(world, rank)
    a_shape, b_shape = _operands("gemm_reduce_scatter", ("a", a_shape, a_dtype),
                                 ("b_shard", b_shape, b_dtype), "N x K_local")
    _scales("gemm_reduce_scatter", a_dtype, scale_a, scale_b)
    return Shapes(tuple(protocol.shard_rows(a_shape[0], world)), b_shape[0], a_shape[1], a_dtype)


def on_one_gpu(who: str, tensors: dict) -> None:
    """The tensors (name -> tensor, or None) all on one CUDA device. Checked before anything is
    planned or queued: a CPU tensor used to pass the shape checks, rendezvous a plan and fail
    in a GEMM after the call had signalled its peers."""
    first = None
    for name, t in tensors.items():
        if t is None:
            continue
        device = getattr(t, "device", None)
        if getattr(device, "type", None) != "cuda":
            raise TmaflowError(f"{who}: {name} is on {device!r}; the collectives take CUDA torch tensors")
        if first is None:
            first = (name, device)
        elif device != first[1]:
            raise TmaflowError(f"{who}: {name} is on {device} but {first[0]} is on {first[1]}; "
                               "every tensor of a call must be on one GPU")


def _dtype_name(t) -> str:
    return str(t.dtype).removeprefix("torch.")


class _Plan:
    """What a (kind, group, shapes, device) needs across calls: the symmetric buffer, the
    local staging, the communication stream and the signal kernels."""

    def __init__(self, kind: str, shapes: Shapes, group, debug: bool, trace: bool):
        import torch  # optional dependency: distributed needs torch

        self.kind, self.shapes, self.group = kind, shapes, group
        self.world, self.rank = group.size(), group.rank()
        dtype = getattr(torch, shapes.dtype)
        gather = kind == "all_gather_gemm"
        # all_gather: the largest shard of A; reduce_scatter: my whole partial product (bf16)
        shape = (max(max(shapes.rows), 1), shapes.k) if gather else (max(shapes.m, 1), shapes.n)
        self.buffer = SymmetricBuffer.allocate(shape, dtype if gather else torch.bfloat16, group)
        if protocol.pad_slots(self.world) >= self.buffer.pad.shape[0]:
            raise TmaflowError(f"world_size={self.world} needs {protocol.pad_slots(self.world) + 1} "
                               f"signal slots (the protocol's {protocol.pad_slots(self.world)} and a "
                               f"spare for the stream operations' probe); the pad has {self.buffer.pad.shape[0]}")
        device = self.buffer.tensor.device
        self.staging = (torch.empty((shapes.m, shapes.k), dtype=dtype, device=device) if gather else
                        torch.empty((self.world, shapes.rows[self.rank], shapes.n),
                                    dtype=torch.bfloat16, device=device))
        self.comm = torch.cuda.Stream(device=device)
        self.peers = [self.buffer.peer_tensor(j) for j in range(self.world)]
        self.steps = protocol.SCHEDULES[kind](self.world, self.rank)
        self.put = get_kernel("signal_put", None, file="signal", debug=debug, trace=trace)
        self.wait = get_kernel("signal_wait_reset", None, file="signal", debug=debug, trace=trace)
        self.sum = get_kernel("sum_partials", None, file="signal", debug=debug, trace=trace)
        self.sms = devices.current_device().sm_count
        self.graphs: OrderedDict = OrderedDict()  # (stream, thread, call) -> a captured call
        self.seen: dict = {}                       # (stream, thread, call) -> eager calls so far
        self.graph_lock = threading.Lock()         # the two above, and the side stream's captures
        self.side = torch.cuda.Stream(device=device)  # where calls are captured
        spare = protocol.pad_slots(self.world)  # a slot the protocol never uses: the probe's
        self.stream_ops = not (debug or trace) and streamops.usable(
            self.comm.cuda_stream, self.buffer.pad_slot(self.rank, spare),
            self.buffer.pad_slot((self.rank + 1) % self.world, spare))
        self.trace = trace
        self.pad = self.buffer.pad_slot(self.rank, 0)
        self.turns = call_turns.of_pad(self.pad)  # calls on several streams run one after another
        self.released = False  # set by release(): shortcuts to it are refused from then on

    @property
    def out_shape(self) -> tuple:
        """The call's output: all M rows (all-gather), or this rank's rows of the sum."""
        s = self.shapes
        return (s.m, s.n) if self.kind == "all_gather_gemm" else (s.rows[self.rank], s.n)

    def signal(self, step, stream, stream_ops: bool = False) -> None:
        """A put to a peer's pad, or a wait on (and reset of) this rank's: driver stream
        operations where ``stream_ops``, else the one-thread kernels (debug builds bound the
        wait: DeadlockError; trace builds record it)."""
        handle = stream.cuda_stream
        if step.op == "put":
            if stream_ops:
                streamops.put(handle, self.buffer.pad_slot(step.peer, step.slot))
            else:
                self.put.launch(self.buffer.pad_slot(step.peer, step.slot), 1, grid=1, block=32,
                                stream=handle)
        elif stream_ops:
            streamops.wait_reset(handle, self.buffer.pad_slot(self.rank, step.slot))
        else:
            try:
                self.wait.launch(self.buffer.pad_slot(self.rank, step.slot), 1, self.rank, step.peer,
                                 step.slot, grid=1, block=32, stream=handle)
            except DeadlockError as e:
                raise DeadlockError(f"{self.kind}: rank {self.rank} waited for "
                                    f"{protocol.describe(self.world, step.slot)} (signal {step.slot}): "
                                    f"{e}", e.records) from None
        if self.trace:
            keep_trace()


_recorded = threading.local()


def keep_trace() -> None:
    """Keep the flight recorder's latest trace of this thread for ``last_traces``."""
    t = flight_recorder.last()
    kept = _recorded.__dict__.setdefault("traces", [])
    if t is not None and all(t is not k for k in kept):
        kept.append(t)


def last_traces() -> list:
    """The traces of every kernel this thread's latest collective called with ``trace=True``
    launched (signal kernels and GEMMs, in launch order): save them per rank and merge them
    with ``merge_traces`` into one timeline."""
    return list(getattr(_recorded, "traces", []))


_PLANS: dict = {}


def _plan(kind: str, shapes: Shapes, group, device, debug: bool, trace: bool = False) -> _Plan:
    key = (kind, group, shapes, device, debug, trace)  # the group object: a later group may reuse its name
    plan = _PLANS.get(key)
    if plan is None:
        plan = _PLANS[key] = _Plan(kind, shapes, group, debug, trace)
    _recorded.traces = []
    return plan


def release(group=None) -> int:
    """Drop the collectives' buffers, streams and kernels planned for ``group`` (None: every
    group); call it before ``destroy_process_group``. Returns how many plans were dropped."""
    keys = [k for k in _PLANS if group is None or k[1] is group]
    plans = [_PLANS.pop(key) for key in keys]
    with _SHORTCUTS_LOCK:  # no shortcut reaches a plan from here on, nor is remembered to one
        for plan in plans:
            plan.released = True
        for signature in [s for s in _SHORTCUTS if group is None or s[1] is group]:
            del _SHORTCUTS[signature]
    for plan in plans:
        call_turns.release(plan.pad, plan.turns)
        plan.buffer.close()
    return len(keys)


GRAPH_AFTER = 2   # a call whose arguments come back this often is captured once, then replayed
MAX_GRAPHS = 4    # captured calls kept a plan (least recently used dropped)
MAX_SEEN = 64     # address sets counted a plan: fp8 scales that change every call never repeat


_SHORTCUTS: OrderedDict = OrderedDict()  # a checked call's signature -> its plan
_SHORTCUTS_LOCK = threading.Lock()
MAX_SHORTCUTS = 64


def _describe(value):
    """A tensor's address, shape, strides, dtype and device; any other value with its type
    (1.0 and True hash alike, but only one of them passes the checks)."""
    data_ptr = getattr(value, "data_ptr", None)
    if data_ptr is None:
        return type(value), value
    return data_ptr(), value.shape, value.stride(), value.dtype, value.device


def _signature(kind: str, group, debug: bool, trace: bool, values: tuple) -> tuple | None:
    """What a repeated call must match to skip the checks and planning: a call with the same
    group, options and argument tensors (addresses, shapes, strides, dtypes, devices) passes
    the same checks and gets the same plan. None where a value cannot be described or hashed
    (a sparse or fake tensor, a list): such calls take the checks, which name what is wrong."""
    try:
        signature = (kind, group, debug, trace, tuple(_describe(v) for v in values))
        hash(signature)
    except Exception:  # whatever describing raises, the checked path decides
        return None
    return signature


def _thread_token() -> object:
    """This thread's key in captured calls: an object that lives as long as a key holds it
    (a later thread may get a dead one's ident, but never its token, nor its split-K
    workspaces, which a capture bakes in)."""
    token = getattr(_recorded, "token", None)
    if token is None:
        token = _recorded.token = object()
    return token


def _remember(signature: tuple | None, plan: _Plan) -> None:
    if signature is not None and plan.stream_ops:  # only such plans capture calls
        with _SHORTCUTS_LOCK:
            if plan.released:  # released while this call ran
                return
            _SHORTCUTS[signature] = plan
            _SHORTCUTS.move_to_end(signature)
            if len(_SHORTCUTS) > MAX_SHORTCUTS:
                _SHORTCUTS.popitem(last=False)


def _call(signature: tuple | None, out) -> tuple | None:
    """What a capture bakes in of a call: its arguments' signature and the output's address
    (allocated when the call passed none). None: the call is never captured."""
    return None if signature is None else (signature, out.data_ptr())


def _replayed(signature: tuple | None, like, out) -> tuple:
    """(True, out) for a repeated call replayed straight from its capture; (False, out) where
    its signature or capture is unknown, its plan was released or the caller captures: the
    checked path runs, with the output allocated here if any. Host time is what bounds the
    small shapes (2 H200s, llama-8B 4k all-gather: 165 us a call through the checks, 24 us
    of it the replay)."""
    import torch  # optional dependency: distributed needs torch

    with _SHORTCUTS_LOCK:
        plan = None if signature is None else _SHORTCUTS.get(signature)
        if plan is None or plan.released:
            return False, out
        _SHORTCUTS.move_to_end(signature)
    stream = devices.framework_stream("torch", like.device.index)  # torch.cuda.current_stream's handle
    if driver.stream_capturing(stream):  # the caller's capture: the steps go into it
        return False, out
    if out is None:
        out = torch.empty(plan.out_shape, dtype=torch.bfloat16, device=like.device)
    _recorded.traces = []  # as _plan does: last_traces() is the latest call's
    with plan.turns.turn(stream, capturing=False):
        return _replay(plan, (stream, _thread_token(), _call(signature, out))), out


def _replay(plan: _Plan, key: tuple) -> bool:
    """Replay the plan's capture of ``key`` (stream, thread, call) if it has one."""
    with plan.graph_lock:
        graph = plan.graphs.get(key)
        if graph is None:
            return False
        plan.graphs.move_to_end(key)
        graph.replay()
    return True


def _execute(plan: _Plan, actions: dict, call: tuple | None) -> None:
    """Queue one call: its schedule step by step, or, once a call with the same operands,
    output and stream came ``GRAPH_AFTER`` times, the replay of a CUDA graph of it (one launch
    where the steps are 20-40 host calls: at small shapes the host was the bottleneck). Debug
    and trace builds, a caller's own capture and a call without a signature take the steps."""
    import torch  # optional dependency: distributed needs torch

    if call is None or not plan.stream_ops or torch.cuda.is_current_stream_capturing():
        _run(plan, actions)
        return
    current = torch.cuda.current_stream()
    # the thread too: a capture bakes in per-thread resources (the GEMMs' split-K workspaces)
    key = (current.cuda_stream, _thread_token(), call)
    if _replay(plan, key):
        return
    with plan.graph_lock:
        plan.seen[key] = plan.seen.pop(key, 0) + 1  # the most recent last
        if plan.seen[key] < GRAPH_AFTER:
            if len(plan.seen) > MAX_SEEN:
                del plan.seen[next(iter(plan.seen))]
            _run(plan, actions)
            return
        del plan.seen[key]
        graph = _capture(plan, actions, current)  # runs this call
        if graph is None:
            plan.seen[key] = -math.inf  # steps only from now on (until it ages out of seen)
        else:
            plan.graphs[key] = graph
            if len(plan.graphs) > MAX_GRAPHS:
                plan.graphs.popitem(last=False)


def _capture(plan: _Plan, actions: dict, current):
    """Run this call on the plan's side stream with the signal kernels (their launchers and
    modules exist before a capture needs them), then capture the same call there; None (and
    a warning) where the capture fails: the call ran, later ones take the steps."""
    import torch  # optional dependency: distributed needs torch

    plan.side.wait_stream(current)
    try:
        with torch.cuda.stream(plan.side):
            _run(plan, actions, stream_ops=False)
            graph = torch.cuda.CUDAGraph()
            try:
                graph.capture_begin(capture_error_mode="relaxed")
                try:
                    with serial_capture():  # its replays take turns: the side stream's split-K workspace will do
                        _run(plan, actions)
                finally:
                    graph.capture_end()
            except (RuntimeError, TmaflowError) as e:  # what torch and tmaflow raise in a capture
                log.warning("%s: capturing a repeated call failed (%s); its calls take the steps",
                            plan.kind, e)
                return None
    finally:  # a failed capture still leaves the call queued on the side stream
        current.wait_stream(plan.side)
    return graph


def _run(plan: _Plan, actions: dict, stream_ops: bool | None = None) -> None:
    """Queue the plan's schedule, each step on its stream: signals, events and pulls here,
    ``actions[op](step)`` for publish, gemm and reduce."""
    import torch  # optional dependency: distributed needs torch

    compute = torch.cuda.current_stream()
    # graph capture takes the kernels (a capture holds them for sure); so do debug and trace builds
    if stream_ops is None:
        stream_ops = plan.stream_ops and not torch.cuda.is_current_stream_capturing()
    events: dict = {}
    for step in plan.steps:
        stream = plan.comm if step.stream == "comm" else compute
        with torch.cuda.stream(stream):
            if step.op in ("put", "wait"):
                plan.signal(step, stream, stream_ops)
            elif step.op == "record":
                events[step.event] = torch.cuda.Event()
                events[step.event].record(stream)
            elif step.op == "wait_event":
                stream.wait_event(events[step.event])
            elif step.op == "pull":
                _pull(plan, step, stream)
            else:
                actions[step.op](step)


def copy_rows(dst, src, stream) -> None:
    """``dst.copy_(src)`` on ``stream`` by the copy engine, queued through the driver where
    both are contiguous (a few µs of host time against torch's dispatch)."""
    if dst.is_contiguous() and src.is_contiguous() and dst.dtype == src.dtype and dst.shape == src.shape:
        streamops.copy(stream.cuda_stream, dst.data_ptr(), src.data_ptr(), dst.numel() * dst.element_size())
    else:
        dst.copy_(src, non_blocking=True)


def _pull(plan: _Plan, step, stream) -> None:
    """A copy-engine copy from a peer's symmetric buffer into local staging."""
    s = plan.shapes
    peer = plan.peers[step.peer]
    if plan.kind == "all_gather_gemm":
        rows = s.rows[step.shard]
        if rows:
            copy_rows(plan.staging[s.span(step.shard)], peer[:rows], stream)
    elif s.rows[plan.rank]:
        copy_rows(plan.staging[step.peer], peer[s.span(plan.rank)], stream)


def sum_partials(plan: _Plan, parts: list, out) -> None:
    """``out`` = the sum of the bf16 ``parts`` (rank order, fp32, one rounding: the same bits
    every call) on the current torch stream; one pass over them (``sum_partials`` in
    signal.cu), or torch's adds in the same order where an address is not 16-byte aligned
    (``torch.sum`` over a stack leaves its order to the reduction kernel)."""
    import torch  # optional dependency: distributed needs torch

    tensors = [out, *parts]
    if len(parts) > 8 or any(t.data_ptr() % 16 or not t.is_contiguous() for t in tensors) or out.numel() % 8:
        acc = parts[0].float()
        for part in parts[1:]:
            acc += part.float()
        out.copy_(acc)
        return
    n8 = out.numel() // 8
    pointers = [p.data_ptr() for p in parts] + [0] * (8 - len(parts))
    plan.sum.launch(out.data_ptr(), *pointers, len(parts), n8, grid=max(1, min(-(-n8 // 256), 4 * plan.sms)),
                    block=256, stream=torch.cuda.current_stream().cuda_stream)
    if plan.trace:
        keep_trace()


def _options(debug, trace) -> tuple[bool, bool]:
    return (watchdog.env_debug() if debug is None else checks.as_bool("debug", debug),
            checks.as_bool("trace", trace))


def all_gather_gemm(a_shard, b, *, group=None, m=None, out=None, scale_a=None, scale_b=None,
                    debug: bool | None = None, trace: bool = False):
    """``all_gather(a_shard) @ b^T`` over ``group`` (default: the world): a_shard is this
    rank's rows (rank r holds rows ``shard_rows(m, world)[r]`` of the M = ``m`` rows; None:
    every shard has a_shard's rows), b is N x K; bfloat16, or float8_e4m3fn with per-tensor
    ``scale_a`` / ``scale_b``. Returns ``out`` (M x N bfloat16, allocated when None).
    ``debug``: bounded signal waits (DeadlockError); ``trace``: flight-recorder builds whose
    traces ``last_traces()`` returns. Every rank must pass the same shapes and options."""
    group = group_of(group)
    debug, trace = _options(debug, trace)
    m = None if m is None else checks.as_int("m", m, 0)  # by value: a 0-d tensor's address would not do
    signature = _signature("all_gather_gemm", group, debug, trace, (a_shard, b, m, out, scale_a, scale_b))
    replayed, out = _replayed(signature, a_shard, out)
    if replayed:
        return out
    on_one_gpu("all_gather_gemm", {"a_shard": a_shard, "b": b, "out": out})
    shapes = gather_shapes(a_shard.shape, _dtype_name(a_shard), b.shape, _dtype_name(b), m,
                           group.size(), group.rank(), scale_a, scale_b)
    out = _output("all_gather_gemm", out, (shapes.m, shapes.n), a_shard.device)
    with on_device(a_shard.device):  # the symmetric buffer lives on the operands' GPU
        plan = _plan("all_gather_gemm", shapes, group, a_shard.device, debug, trace)
    me = plan.rank

    def publish(step):  # my shard into my symmetric buffer, where peers pull it from
        if shapes.rows[me]:
            copy_rows(plan.buffer.tensor[:shapes.rows[me]], a_shard, plan.comm)

    def product(step):
        if shapes.rows[step.shard]:
            src = a_shard if step.shard == me else plan.staging[shapes.span(step.shard)]
            gemm(src, b, out=out[shapes.span(step.shard)], debug=debug, trace=trace,
                 scale_a=scale_a, scale_b=scale_b)
            if trace:
                keep_trace()

    with on_device(a_shard.device), plan.turns.turn(devices.framework_stream("torch", a_shard.device.index)):
        _execute(plan, {"publish": publish, "gemm": product}, _call(signature, out))
    _remember(signature, plan)
    return out


def gemm_reduce_scatter(a, b_shard, *, group=None, out=None, scale_a=None, scale_b=None,
                        debug: bool | None = None, trace: bool = False):
    """``reduce_scatter(a @ b_shard^T)`` over ``group``: a is M x K_local, b_shard N x K_local
    (this rank's slice of K); rank r gets rows ``shard_rows(M, world)[r]`` of the sum over
    ranks (bf16 partials summed in fp32). bfloat16, or float8_e4m3fn with per-tensor scales.
    Returns ``out`` (rows x N bfloat16, allocated when None). ``debug`` and ``trace`` as in
    ``all_gather_gemm``."""
    group = group_of(group)
    debug, trace = _options(debug, trace)
    signature = _signature("gemm_reduce_scatter", group, debug, trace, (a, b_shard, out, scale_a, scale_b))
    replayed, out = _replayed(signature, a, out)
    if replayed:
        return out
    on_one_gpu("gemm_reduce_scatter", {"a": a, "b_shard": b_shard, "out": out})
    shapes = scatter_shapes(a.shape, _dtype_name(a), b_shard.shape, _dtype_name(b_shard),
                            group.size(), group.rank(), scale_a, scale_b)
    with on_device(a.device):  # the symmetric buffer lives on the operands' GPU
        plan = _plan("gemm_reduce_scatter", shapes, group, a.device, debug, trace)
    me = plan.rank
    out = _output("gemm_reduce_scatter", out, plan.out_shape, a.device)
    partial = plan.buffer.tensor

    def product(step):  # my partial of row chunk step.shard, into my symmetric buffer
        if shapes.rows[step.shard]:
            gemm(a[shapes.span(step.shard)], b_shard, out=partial[shapes.span(step.shard)],
                 debug=debug, trace=trace, scale_a=scale_a, scale_b=scale_b)
            if trace:
                keep_trace()

    def reduce(step):
        if shapes.rows[me]:
            sum_partials(plan, [partial[shapes.span(me)] if j == me else plan.staging[j]
                                for j in range(plan.world)], out)

    with on_device(a.device), plan.turns.turn(devices.framework_stream("torch", a.device.index)):
        _execute(plan, {"gemm": product, "reduce": reduce}, _call(signature, out))
    _remember(signature, plan)
    return out


def _output(who: str, out, shape: tuple, device):
    import torch  # optional dependency: distributed needs torch

    if out is None:
        return torch.empty(shape, dtype=torch.bfloat16, device=device)
    if tuple(out.shape) != shape or out.dtype != torch.bfloat16 or not out.is_contiguous():
        raise TmaflowError(f"{who}: out must be a contiguous {shape} bfloat16 tensor (got "
                           f"{tuple(out.shape)} {out.dtype}, contiguous={out.is_contiguous()})")
    return out
