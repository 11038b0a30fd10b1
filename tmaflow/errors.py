"""One exception hierarchy: every tmaflow failure is a ``TmaflowError``.

Messages name the field, the value, the rule it broke and, where one exists, the fix.
"""
from __future__ import annotations


class TmaflowError(Exception):
    """Base class of every error tmaflow raises."""


class TmaflowWarning(UserWarning):
    """Something legal that is very likely not what was meant (a store map that spills)."""


class TensorMapError(TmaflowError, ValueError):
    """A tensor-map parameter breaks an encode rule (checked before the driver sees it)."""


class LayoutError(TmaflowError, ValueError):
    """A shared-memory plan (barriers, pipelines, layout) is impossible or over a limit."""


class CompileError(TmaflowError):
    """NVRTC rejected a kernel. Carries the full log and the failing source lines."""

    def __init__(self, message: str, log: str = "", excerpt: str = ""):
        self.message, self.log, self.excerpt = message, log, excerpt
        parts = [message]
        if excerpt:
            parts.append(excerpt)
        if log:
            parts.append("NVRTC log:\n" + log.strip())
        super().__init__("\n".join(parts))


    def __reduce__(self):  # picklable: the arguments, not the composed text
        return type(self), (self.message, self.log, self.excerpt)


class LaunchError(TmaflowError):
    """A launch configuration or an argument is wrong; raised before the kernel runs."""


class CudaError(TmaflowError):
    """A driver or NVRTC call failed: ``call`` is the API name, ``code``/``name`` the result."""

    def __init__(self, call: str, code: int, name: str, detail: str = ""):
        self.call, self.code, self.name, self.detail = call, int(code), name, detail
        msg = f"{call} failed with {name} ({int(code)})"
        super().__init__(msg + (f": {detail}" if detail else ""))


    def __reduce__(self):
        return type(self), (self.call, self.code, self.name, self.detail)


class KernelFaultError(CudaError):
    """A kernel faulted (an illegal or misaligned address, a trap, an assert): the CUDA context
    is unusable and every later call on it fails. Raised once by the call that saw the fault,
    then up front by every later tmaflow call on that context until ``Device.reset()``.
    ``kernels`` names the kernels launched on the context since its last successful
    synchronize (oldest first): the fault is in one of them. See docs/faults.md."""

    def __init__(self, call: str, code: int, name: str, detail: str = "", kernels=(),
                 message: str | None = None):
        super().__init__(call, code, name, detail)
        self.kernels = tuple(kernels)
        self.message = message
        if message is not None:
            self.args = (message,)

    def __reduce__(self):
        return type(self), (self.call, self.code, self.name, self.detail, self.kernels, self.message)


class DeadlockError(TmaflowError):
    """A debug-build barrier wait timed out. ``records`` holds one dict per timed-out wait."""

    def __init__(self, message: str, records: list | None = None):
        self.records = list(records or [])
        self.trace = None  # the flight recorder's Trace, for builds with trace=True too
        self.findings: list = []  # and what tmaflow.diagnose made of it (Findings)
        super().__init__(message)

    def __reduce__(self):
        return type(self), (self.args[0], self.records)


class PipelineError(TmaflowError):
    """A traced debug launch finished, but its trace breaks the pipeline's plan (bytes
    announced, multicast masks, stage reuse): ``findings`` names each broken rule."""

    def __init__(self, message: str, findings: list | None = None):
        self.findings = list(findings or [])
        self.trace = None
        super().__init__(message)

    def __reduce__(self):
        return type(self), (self.args[0], self.findings)


class DriverNotFoundError(TmaflowError):
    """A GPU operation was requested on a machine without a usable CUDA driver."""
