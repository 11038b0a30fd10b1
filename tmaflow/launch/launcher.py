"""Launching: a ``Launcher`` is a kernel bound to one ``LaunchConfig``, whose calls check, pack
and launch through a path generated once per tuple of argument types (or a C plan, see
``native.py``).
"""
from __future__ import annotations

import functools
import struct
from collections.abc import Callable

from ..debug.diagnose import diagnose, explain, ledger, ledger_text
from ..errors import CudaError, DeadlockError, LaunchError, PipelineError
from ..runtime import driver, faults
from ..runtime.device import _current_stream, context_ordinal, current_stream
from ..runtime.graph import ACTIVE as CAPTURING, capturing
from ..runtime.memory import DeviceArray, _origin_of
from ..tma.tensormap import TensorMap
from . import native
from .config import LaunchConfig
from .params import ArgPacker


_MISSING = object()


def _type_key(args: tuple) -> tuple:
    return tuple((type(a), a._origin) if type(a) is TensorMap or type(a) is DeviceArray else type(a)
                 for a in args)


class ContextMoved(LaunchError):
    """A launch refused because another device's context was current (another library switched
    it): nothing ran; entry points launch again under a guard of the launcher's device."""

    def __init__(self, message: str, ordinal: int):
        super().__init__(message)
        self.ordinal = ordinal


class Launcher(functools.partial):
    """A kernel with its launch configuration fixed: ``launcher(*args)`` packs and launches.

    All configuration checks ran when it was built. The first call with a new tuple of
    argument types is checked argument by argument; it then generates a function for those
    types (one test per argument, liveness of tmaflow memory, one ``struct.pack_into``) that
    later calls run. One launcher belongs to one thread (its argument buffer is reused);
    ``Kernel.launch`` keeps one per thread and configuration.

    A launcher is a ``functools.partial`` of its current function applied to itself, so a call
    goes from C straight into the generated function: measured on an H100 host, a Python
    ``__call__`` alone costs 0.4 us against a 3.6 us raw launch, the partial's dispatch 0.2 us.
    """

    _dry_plans = False  # tests: C plans that pack but launch nothing
    _retired = None  # why every call is refused (``retire``)

    def __new__(cls, kernel, module, config: LaunchConfig):
        return super().__new__(cls, Launcher._checked_call)

    def __init__(self, kernel, module, config: LaunchConfig):
        cu = driver.cu()
        self.kernel, self.module, self.config = kernel, module, config
        self.generation = module.generation
        self.ordinal = module.device.ordinal
        self.packer = ArgPacker(module.params)
        self._configs: dict[int, object] = {}
        self._plans: dict[tuple, Callable[..., None]] = {}  # argument type key -> generated function
        self._launch = cu.cuLaunchKernelEx
        self._function = module.function
        self._watch = module.watch
        self._recorder = module.recorder
        self._use(Launcher._checked_call)
        if config.cluster != (1, 1, 1):
            self._check_cluster_fits()

    def _use(self, function) -> None:
        """Make ``function(self, *args)`` what calling the launcher runs."""
        # partial's C __setstate__ is the one way to rebind func; typeshed's partial omits it
        functools.partial.__setstate__(self, (function, (self,), None, self.__dict__))  # type: ignore[attr-defined]

    # configuration, read-only
    grid = property(lambda self: self.config.grid, doc="Blocks per axis (x, y, z).")
    block = property(lambda self: self.config.block, doc="Threads per block axis (x, y, z).")
    cluster = property(lambda self: self.config.cluster, doc="Blocks per cluster axis (x, y, z).")
    smem = property(lambda self: self.config.smem, doc="Dynamic shared memory per block, in bytes.")
    stream = property(lambda self: self.config.stream,
                      doc="The bound stream's handle (None: each call follows its arrays).")

    def cu_config(self, stream: int):
        """The driver's ``CUlaunchConfig`` of this configuration on ``stream`` (made once)."""
        cfg = self._configs.get(stream)
        if cfg is not None:
            return cfg
        cu = driver.cu()
        c = self.config
        cfg = cu.CUlaunchConfig()
        cfg.gridDimX, cfg.gridDimY, cfg.gridDimZ = c.grid
        cfg.blockDimX, cfg.blockDimY, cfg.blockDimZ = c.block
        cfg.sharedMemBytes = c.smem
        cfg.hStream = cu.CUstream(stream)
        attrs = []
        if c.cluster != (1, 1, 1) and not any(self.module.compiled_cluster):
            attr = cu.CUlaunchAttribute()
            attr.id = cu.CUlaunchAttributeID.CU_LAUNCH_ATTRIBUTE_CLUSTER_DIMENSION
            attr.value.clusterDim.x, attr.value.clusterDim.y, attr.value.clusterDim.z = c.cluster
            attrs.append(attr)
        if c.pdl:
            attr = cu.CUlaunchAttribute()
            attr.id = cu.CUlaunchAttributeID.CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION
            attr.value.programmaticStreamSerializationAllowed = 1
            attrs.append(attr)
        if c.cooperative:
            attr = cu.CUlaunchAttribute()
            attr.id = cu.CUlaunchAttributeID.CU_LAUNCH_ATTRIBUTE_COOPERATIVE
            attr.value.cooperative = 1
            attrs.append(attr)
        cfg.attrs = attrs
        cfg.numAttrs = len(attrs)
        if len(self._configs) >= 64:
            self._configs.clear()
        self._configs[stream] = cfg
        return cfg

    def stream_for(self, frameworks) -> int:
        """The stream a call with arrays of these frameworks launches on."""
        if self.config.stream is not None:
            return self.config.stream
        return current_stream(frameworks, self.ordinal)

    def max_active_clusters(self) -> int:
        """How many clusters of this configuration the device runs at once (its GPCs may not
        pair every SM): the grid size, in clusters, of a persistent kernel. Without a cluster,
        how many blocks (blocks per SM x SMs)."""
        cu = driver.cu()
        c = self.config
        if c.cluster == (1, 1, 1):  # cuOccupancyMaxActiveClusters answers 1 here
            per_sm = driver.check("cuOccupancyMaxActiveBlocksPerMultiprocessor",
                                  cu.cuOccupancyMaxActiveBlocksPerMultiprocessor(self._function, c.threads, c.smem))
            return per_sm * self.module.device.sm_count
        return driver.check("cuOccupancyMaxActiveClusters",
                            cu.cuOccupancyMaxActiveClusters(self._function, self.cu_config(0)))

    def _check_cluster_fits(self) -> None:
        if self.max_active_clusters() == 0:
            c = self.config
            raise LaunchError(
                f"cluster={c.cluster} with block={c.block} and smem={c.smem} B cannot be "
                f"scheduled on {self.module.device.name} (cuOccupancyMaxActiveClusters = 0); "
                "use a smaller cluster, fewer threads or less shared memory")

    def retire(self, reason: str) -> None:
        """Refuse every later call with a LaunchError saying ``reason``: the function handle
        died with its module (``Kernel.close``) or its context (``Device.reset``)."""
        self._retired = reason
        self._plans.clear()
        self._use(Launcher._retired_call)

    # --- calls ------------------------------------------------------------------------------
    def _checked_call(self, *args) -> None:
        self._dispatch(args)

    def _retired_call(self, *args) -> None:
        raise LaunchError(self._retired)

    def _dispatch(self, args: tuple) -> None:
        """The generated path for these argument types if there is one, else the checked path."""
        fn = self._plans.get(_type_key(args))
        if fn is None or fn is self.func or self._watch is not None or self._recorder is not None:
            return self._checked(args)
        self._use(fn)
        return fn(self, *args)

    def _checked(self, args: tuple) -> None:
        """Every argument checked against the parameter table, then the launch. A module has one
        watchdog state and one trace ring buffer, armed for a launch and read after it: launches
        of a debug or trace build, from any thread on any stream, go one at a time."""
        if self._watch is None and self._recorder is None:
            return self._checked_launch(args)
        with self.module.instrumented:
            return self._checked_launch(args)

    def _checked_launch(self, args: tuple) -> None:
        if self._retired is not None:  # reached from a plan that was running at the retirement
            raise LaunchError(self._retired)
        kp = self.packer.pack(args, self.ordinal)
        frameworks = {_origin_of(a) for a in args}
        stream = self.stream_for(frameworks)
        graph = capturing() if CAPTURING else None
        if graph is not None:
            if self.config.stream is None:
                stream = graph.stream.handle  # stream=None is captured
            if stream == graph.stream.handle:
                if self._watch is not None or self._recorder is not None:
                    build = "debug" if self._watch is not None else "trace"
                    raise LaunchError(f"{self.kernel.name}: a {build} build synchronises after each "
                                      "launch and cannot be captured into a graph; capture the "
                                      f"release build ({build}=False)")
                graph.record(self.kernel.name, args)
        cfg = self.cu_config(stream)
        watch, recorder = self._watch, self._recorder
        if watch is None and recorder is None:
            self._install_plan(args)
        if watch is not None:
            watch.arm()
        if recorder is not None:
            recorder.arm(self.config, stream)
        (err,) = self._launch(cfg, self._function, kp, 0)
        if err:
            self._raise(err)
        faults.note(self, cfg)
        if watch is not None:
            keep = None if recorder is None else (lambda: recorder.collect(stream, self.kernel, self.config))
            try:
                watch.check(stream, self.kernel, before_reset=keep)
            except (DeadlockError, CudaError) as failure:
                if recorder is not None:
                    _attach_trace(failure, recorder, stream, self.kernel, self.config)
                raise
        if recorder is not None:
            trace = recorder.collect(stream, self.kernel, self.config)
            if watch is not None and trace is not None:  # a traced debug build: check the plan
                _check_plan(trace, self.kernel, self.config)

    def _install_plan(self, args: tuple) -> None:
        key = _type_key(args)
        fn = self._plans.get(key)
        if fn is None:
            fn = self._plans[key] = self._generate(args)
        self._use(fn)

    def _generate(self, args: tuple):
        """A function generated from the parameter table and the types of ``args`` (no user
        text); the checked path itself when some argument kind has no fast form."""
        plan = self.packer.plan_source(args, self.ordinal)
        if plan is None:
            return Launcher._checked_call
        checks, values, fmt, frameworks, live_names = plan
        native_plan = self._native_plan(args, frameworks)
        if native_plan is not None:
            return native_plan
        scope = {"struct": struct,
                 "pack_into": struct.Struct(fmt).pack_into, "buf": self.packer.buffer,
                 "kp": self.packer.kernel_params, "launch": self._launch,
                 "function": self._function, "on_error": self._raise, "ORD": self.ordinal,
                 "configs": self._configs, "make_config": self.cu_config, "MISSING": _MISSING,
                 "CAPTURING": CAPTURING, "SUCCESS": driver.cu().CUresult.CUDA_SUCCESS, **live_names}
        scope.update({f"T_a{i}": type(a) for i, a in enumerate(args)})
        # Arguments bind to parameters a0.. (defaults and *more only catch a wrong count), so a
        # call builds no tuple; ``args`` is rebuilt only on the way to another path. A map or
        # array of the wrong kind fails inside the try (no _bytes / ptr attribute).
        n = len(args)
        names = [f"a{i}" for i in range(n)]
        signature = ", ".join(["self", *(f"{a}=MISSING" for a in names), "*more"])
        args_expr = f"tuple(a for a in ({', '.join(names)}{',' if n == 1 else ''}) if a is not MISSING) + more"
        fails = " or ".join(["more", *checks]) if n else "more"
        # While any graph captures, every launch takes the checked path (it redirects and
        # records the launches of the capturing thread); otherwise the test costs one lookup.
        lines = [f"if CAPTURING: return self._checked({args_expr})",
                 "try:",
                 f"    bad = {fails}",
                 f"    if not bad: pack_into(buf, 0{''.join(', ' + v for v in values)})",
                 "except (AttributeError, struct.error, OverflowError, ValueError, TypeError):",
                 f"    return self._checked({args_expr})",
                 f"if bad: return self._dispatch({args_expr})"]
        current = _current_stream(frameworks)
        if self.config.stream is not None or current is None:
            scope["cfg"] = self.cu_config(self.stream_for(frameworks))
        else:
            scope["current_stream"] = current
            lines += ["s = current_stream(ORD)", "cfg = configs.get(s)",
                      "if cfg is None: cfg = make_config(s)"]
        lines += ["(err,) = launch(cfg, function, kp, 0)", "if err is not SUCCESS and err: on_error(err)"]
        lines.append("note((SITE, cfg, buf.raw))")  # the fault record (faults.py)
        scope.update(note=faults.ring(self.ordinal).append, SITE=faults.site(self))
        src = f"def launch_{'_'.join(type(a).__name__ for a in args)}({signature}):\n" + \
            "".join(f"    {ln}\n" for ln in lines)
        exec(src, scope)  # noqa: S102 - generated from the parameter table, no user text
        fn = next(v for k, v in scope.items() if k.startswith("launch_"))
        fn.source = src
        return fn

    def _native_plan(self, args: tuple, frameworks):
        """The C plan (``native.py``) for these argument types, or None where it is not
        built or these arguments are outside what it writes. A launcher whose ``_launch`` is
        not the driver's (the CPU tests' fakes) gets none, or with ``_dry_plans`` a dry one."""
        if not self._dry_plans and self._launch is not driver.cu().cuLaunchKernelEx:
            return None

        fields = self.packer.native_fields(args, self.ordinal)
        if fields is None:
            return None
        current = _current_stream(frameworks) if self.config.stream is None else None
        cfg = self.cu_config(0 if current is not None else self.stream_for(frameworks))
        fn = native.plan(
            fields, dry=self._dry_plans, function=0 if self._function is None else int(self._function),
            size=self.packer.total, config=cfg.getPtr(), current_stream=current,
            ordinal=self.ordinal, capturing=CAPTURING, on_error=self._raise, keep=(cfg, self.module))
        if fn is not None:
            faults.track_native(self)  # its launches bypass Python: the plan counts them
        return fn

    def _raise(self, err) -> None:
        if int(err) in faults.STICKY:  # an earlier kernel faulted: the one report of it
            raise faults.fault("cuLaunchKernelEx", int(err), driver._error_name(err), self.ordinal)
        c = self.config
        detail = f"{self.kernel.name} grid={c.grid} block={c.block} cluster={c.cluster} smem={c.smem}"
        # CUDA_ERROR_INVALID_HANDLE / _CONTEXT: another device's context is current (nothing ran)
        current = context_ordinal() if int(err) in (400, 201) else self.ordinal
        if current != self.ordinal:
            raise ContextMoved(f"{detail}: this launcher is device {self.ordinal}'s but device "
                               f"{current}'s context is current on this thread; call "
                               f"tf.set_device({self.ordinal}) (or launch inside "
                               f"tf.runtime.device.using({self.ordinal}))", self.ordinal)
        if 900 <= int(err) <= 908:  # CUDA_ERROR_STREAM_CAPTURE_*
            detail += ("; " + driver.CAPTURE_HINT + " (under torch.cuda.graph, pass torch tensors or "
                       "stream=torch.cuda.current_stream(); tmaflow arrays launch on the legacy stream)")
        raise CudaError("cuLaunchKernelEx", int(err), driver._error_name(err), detail)

    def __repr__(self) -> str:
        c = self.config
        return (f"Launcher({self.kernel.name}, grid={c.grid}, block={c.block}, "
                f"cluster={c.cluster}, smem={c.smem}, stream={c.stream})")


def _attach_trace(hang, recorder, stream: int, kernel, config) -> None:
    """Add the diagnosis and what every warp did last to the DeadlockError (or the fault) of
    a traced debug build."""
    trace = recorder.last  # copied out before a fault reset the context
    if trace is None:
        try:
            trace = recorder.collect(stream, kernel, config)
        except Exception:  # the rings went with the context
            return
    if trace is None or not len(trace):
        return

    layout = kernel.layout
    book = ledger(trace, layout, config.cluster_size) if layout is not None else None
    hang.trace = trace
    hang.findings = diagnose(trace, layout, config.cluster_size, book)
    text = hang.args[0]
    if hang.findings:
        text += "\nDiagnosis (flight recorder):\n" + explain(hang.findings)
    elif kernel.trace != "all":
        text += "\n(trace='all' records every arrival and copy, for a full diagnosis)"
    records = getattr(hang, "records", None)
    if records and book is not None:
        stuck = ledger_text(book, layout, records, config.grid)
        if stuck:
            text += "\nLedger of the stuck barriers:\n" + stuck
    hang.args = (f"{text}\nLast events of every warp:\n{trace.tail()}",)


def _check_plan(trace, kernel, config) -> None:
    """A traced debug launch that finished may still have broken its plan (stale reads, a
    reused stage): raise PipelineError naming the rule."""
    findings = diagnose(trace, kernel.layout, config.cluster_size)
    if findings:
        err = PipelineError(f"{kernel.name}: the launch finished, but its trace breaks the "
                            f"pipeline's plan:\n{explain(findings)}", findings)
        err.trace = trace
        raise err
