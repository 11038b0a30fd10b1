"""Kernel durations measured by CUPTI (through torch.profiler / kineto): the device time of
each kernel a function launches, with no launch gaps or event steps in it. Optional: without
torch, :func:`available` is False and :func:`kernel_times` raises a TmaflowError saying so."""
from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass

from ..errors import TmaflowError
from ..launch.kernel import Kernel


def available() -> bool:
    """Whether torch.profiler (CUPTI) can be used here."""
    try:
        import torch.profiler  # noqa: F401  (optional dependency)
    except ImportError:
        return False
    return True


@dataclass(frozen=True)
class KernelTime:
    """One kernel's calls and their mean and per-call device times (microseconds)."""

    name: str
    calls: int
    mean_us: float
    samples_us: tuple[float, ...]


def kernel_times(fn, repeats: int = 20, between=None) -> dict[str, KernelTime]:
    """{kernel name: KernelTime} over ``repeats`` calls of ``fn`` (after one untimed call);
    ``between`` (e.g. an L2 flush) runs before every call and its kernels are left out."""
    try:
        import torch  # optional dependency: CUPTI comes with torch's kineto
        import torch.profiler  # noqa: F401
    except ImportError:
        raise TmaflowError("bench.kernel_times needs torch (torch.profiler reads CUPTI); "
                           "install torch or time with bench.do_bench") from None
    fn()
    torch.cuda.synchronize()
    skip = set() if between is None else {ev.name for ev in _profiled_calls(between, 1, None, torch)}
    got = defaultdict(list)
    for ev in _profiled_calls(fn, repeats, between, torch):
        if ev.name not in skip:
            got[ev.name].append(ev.time_range.elapsed_us())
    return {name: KernelTime(name, len(ts), sum(ts) / len(ts), tuple(ts)) for name, ts in got.items()}


MARKER = "tmaflow_bench_marker"  # an empty kernel between functions in call_times' session
_MARKER_SOURCE = f'extern "C" __global__ void {MARKER}() {{}}'
_FILTERED = ("Memset", "Memcpy")  # device events that are no kernel (an L2 flush is a memset)
_marker: list = []


def _marker_kernel():
    """The empty marker kernel, compiled once per process."""
    if not _marker:
        _marker.append(Kernel(_MARKER_SOURCE, MARKER))
    return _marker[0]


def call_times(fns: dict, calls: int = 10, between=None) -> dict[str, tuple[float, ...]]:
    """{name: device microseconds of each call} for every function in ``fns`` ({name: fn}),
    all in one CUPTI session: each function's ``calls`` calls in turn, ``between`` (e.g. an L2
    flush) before each call. An empty marker kernel before each function's calls tells their
    kernels apart; a call's time is the sum of the kernels it launched (memsets and copies,
    such as an L2 flush, are left out). Every call of a function must launch the same number
    of kernels (a TmaflowError says which did not). Each function is called once before the
    session (compiles, plans, allocations), on the stream the marker uses (None: the legacy
    default stream, torch's default)."""
    try:
        import torch  # optional dependency: CUPTI comes with torch's kineto
        from torch.profiler import ProfilerActivity, profile
    except ImportError:
        raise TmaflowError("bench.call_times needs torch (torch.profiler reads CUPTI)") from None
    if type(calls) is not int or calls < 1:
        raise TmaflowError(f"bench.call_times: calls={calls!r} must be an int >= 1")
    marker = _marker_kernel()
    for fn in fns.values():
        fn()
    marker.launch(grid=1, block=32)
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for fn in fns.values():
            marker.launch(grid=1, block=32)
            for _ in range(calls):
                if between is not None:
                    between()
                fn()
        marker.launch(grid=1, block=32)
        torch.cuda.synchronize()
    events = [(ev.time_range.start, ev.time_range.elapsed_us(), ev.name) for ev in _cuda_events(prof, torch)]
    return split_calls(events, list(fns), calls)


def split_calls(events, names: list, calls: int) -> dict[str, tuple[float, ...]]:
    """call_times' reading of a session: ``events`` (start, microseconds, kernel name) in any
    order; after the i-th marker come the kernels of ``names[i]``'s ``calls`` calls, each call
    the same number of them; memsets and copies are left out."""
    segments: list[list[float]] = []
    for _, duration, name in sorted(events):
        if name == MARKER:
            segments.append([])
        elif segments and not name.startswith(_FILTERED):
            segments[-1].append(duration)
    segments = segments[:len(names)]
    if len(segments) != len(names):
        raise TmaflowError(f"bench.call_times: found {len(segments)} marker-separated segments for "
                           f"{len(names)} functions; were kernels launched on another stream?")
    out = {}
    for name, kernels in zip(names, segments):
        if not kernels or len(kernels) % calls:
            raise TmaflowError(f"bench.call_times: {name!r} launched {len(kernels)} kernels in {calls} "
                               "calls; each call must launch the same kernels on the marker's stream")
        per = len(kernels) // calls
        out[name] = tuple(sum(kernels[i * per:(i + 1) * per]) for i in range(calls))
    return out


def timeline(fn, repeats: int = 40, between=None) -> list[tuple[float, float, str]]:
    """(start µs, end µs, kernel name) of every kernel ``repeats`` calls of ``fn`` launch, in
    order, ``between``'s included (so gaps between kernels can be read off)."""
    import torch  # optional dependency, as in kernel_times

    fn()
    torch.cuda.synchronize()
    return sorted((ev.time_range.start, ev.time_range.end, ev.name)
                  for ev in _profiled_calls(fn, repeats, between, torch))


def _profiled_calls(fn, repeats: int, between, torch) -> list:
    """The CUDA events of ``repeats`` calls of ``fn`` (``between`` before each), under CUPTI."""
    from torch.profiler import ProfilerActivity, profile  # optional dependency

    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(repeats):
            if between is not None:
                between()
            fn()
        torch.cuda.synchronize()
    return list(_cuda_events(prof, torch))


def _cuda_events(prof, torch):
    return [ev for ev in prof.events() if ev.device_type == torch.autograd.DeviceType.CUDA]
