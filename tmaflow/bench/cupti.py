"""Kernel durations measured by CUPTI (through torch.profiler / kineto): the device time of
each kernel a function launches, with no launch gaps or event steps in it. Optional: without
torch, :func:`available` is False and :func:`kernel_times` raises a TmaflowError saying so."""
from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass

from ..errors import TmaflowError


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
