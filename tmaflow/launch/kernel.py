"""``Kernel``: compile (lazily, cached), load per device, check arguments, launch with clusters."""
from __future__ import annotations

import logging
import os
import re
import threading
import types
import warnings
import weakref
from threading import get_ident
from pathlib import Path

import numpy as np

from .. import checks
from ..debug import watchdog
from ..debug.trace import Recorder
from ..errors import LaunchError, TmaflowError, TmaflowWarning
from ..runtime import driver
from ..runtime.device import (Device, _switched, as_device, current_device, current_ordinal,
                              on_reset, stream_handle)
from . import compiler, native
from .config import LaunchConfig, PORTABLE_CLUSTER
from .launcher import Launcher
from .params import ArgPacker, Param, param_table
from .sass import disassemble

log = logging.getLogger("tmaflow.kernel")

STATIC_SMEM_LIMIT = 48 * 1024
# Kernel.launch's keyword defaults, which native.Entry builds its keys with (it is installed only
# while they are these)
_LAUNCH_DEFAULTS = {"cluster": (1, 1, 1), "smem": None, "stream": None, "pdl": False}
_loaded: weakref.WeakSet = weakref.WeakSet()  # the _Modules whose launchers a reset retires


class _Module:
    """A kernel loaded on one device: function handle, parameter table, attributes set."""

    def __init__(self, kernel: "Kernel", device: Device):
        device.activate()
        self.device = device
        self.generation = device.generation
        self.name = kernel.name
        self.launchers: weakref.WeakSet[Launcher] = weakref.WeakSet()  # every Launcher bound to this module
        _loaded.add(self)
        prog = kernel.program
        self.module = driver.call("cuModuleLoadData", prog.cubin)
        self.function = driver.call("cuModuleGetFunction", self.module, prog.lowered_name.encode())
        self.params = self._param_table(kernel.params)
        cu = driver.cu()
        fa = cu.CUfunction_attribute
        self.static_smem = driver.call("cuFuncGetAttribute", fa.CU_FUNC_ATTRIBUTE_SHARED_SIZE_BYTES,
                                       self.function)
        self.max_threads = driver.call("cuFuncGetAttribute", fa.CU_FUNC_ATTRIBUTE_MAX_THREADS_PER_BLOCK,
                                       self.function)
        # __cluster_dims__ compiled into the kernel (0 when none)
        self.compiled_cluster = tuple(
            driver.call("cuFuncGetAttribute", getattr(fa, f"CU_FUNC_ATTRIBUTE_REQUIRED_CLUSTER_{a}"),
                        self.function) for a in ("WIDTH", "HEIGHT", "DEPTH"))
        self.dynamic_smem_set = 0
        self.non_portable = False
        self.watch = watchdog.Watch(self.module, device) if kernel.debug else None
        self.recorder = Recorder(self.module, device, mapped=kernel.debug) if kernel.trace else None
        self.instrumented = threading.Lock()  # held from arming watch / recorder to reading them

    def _param_table(self, typed: list[Param] | None) -> list[Param]:
        """Offsets and sizes as the driver reports them (``cuFuncGetParamInfo``), kinds from
        the PTX and source table; the count from the PTX entry (probing one past the end would
        be an API error that compute-sanitizer reports)."""
        cu = driver.cu()
        count = len(typed) if typed is not None else None
        params: list[Param] = []
        base: int | None = None
        while count is None or len(params) < count:
            i = len(params)
            err, offset, size = cu.cuFuncGetParamInfo(self.function, i)
            if count is None and int(err) == int(cu.CUresult.CUDA_ERROR_INVALID_VALUE):
                break  # probed one past the last parameter (older drivers)
            driver.check("cuFuncGetParamInfo", (err,))
            # Measured (driver 580, H100/H200): offsets are into the device-side parameter
            # space, whose first parameter may sit past a header (48 B); our buffer needs
            # them relative to the first.
            base = int(offset) if base is None else base
            offset = int(offset) - base
            t = typed[i] if typed is not None else None
            if t is not None and (t.offset, t.size) == (int(offset), int(size)):
                params.append(t)
            else:
                if t is not None:
                    log.warning("%s: parameter %d at offset %d, %d B per the driver but %d, %d B "
                                "per the PTX; using the driver's", self.function, i, offset, size,
                                t.offset, t.size)
                params.append(Param(i, int(offset), int(size)))
        return params

    def retire(self, reason: str) -> None:
        """Make every launcher of this module refuse its calls with ``reason``."""
        for launcher in list(self.launchers):
            launcher.retire(reason)
        _loaded.discard(self)

    def unload(self) -> None:
        self.retire(f"kernel {self.name!r} was closed; build a new launcher (kernel.launcher() "
                    "or kernel.bind())")
        if self.generation == self.device.generation and self.module is not None:
            self.device.activate()
            driver.call("cuModuleUnload", self.module)
            self.module = None
        if self.watch is not None:
            self.watch.close()
        if self.recorder is not None:
            self.recorder.close()

    def ensure_smem(self, dynamic: int) -> None:
        total = dynamic + self.static_smem
        limit = self.device.max_smem_per_block
        if total > limit:
            raise LaunchError(
                f"smem={dynamic} B dynamic + {self.static_smem} B static = {total} B exceeds the "
                f"{limit} B per-block limit of {self.device.name}; use fewer stages or smaller tiles")
        if dynamic > max(self.dynamic_smem_set, STATIC_SMEM_LIMIT - self.static_smem):
            attr = driver.cu().CUfunction_attribute.CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES
            driver.call("cuFuncSetAttribute", self.function, attr, dynamic)
            self.dynamic_smem_set = dynamic

    def allow_non_portable(self) -> None:
        if not self.non_portable:
            attr = driver.cu().CUfunction_attribute.CU_FUNC_ATTRIBUTE_NON_PORTABLE_CLUSTER_SIZE_ALLOWED
            driver.call("cuFuncSetAttribute", self.function, attr, 1)
            self.non_portable = True


def _retire_reset_modules() -> None:
    for mod in list(_loaded):
        if mod.generation != mod.device.generation:
            mod.retire(f"kernel {mod.name!r}: the context was reset; build a new launcher "
                       "(kernel.launcher() or kernel.bind())")


on_reset(_retire_reset_modules)


class Kernel:
    """A CUDA C++ kernel compiled with NVRTC to CUBIN.

    ``Kernel(source, name, defines=None, layout=None, arch=None, options=(), debug=None)``:
    ``name`` is the ``__global__`` function (a C++ name expression for templates);
    ``layout`` a ``SharedLayout`` whose header the source includes as
    ``"tmaflow_layout.cuh"``; ``debug`` (default ``TMAFLOW_DEBUG``) bounds every barrier wait
    so a hang is a ``DeadlockError``. ``cubin``, ``ptx``, ``resources``, ``params`` and
    ``check_args`` need no GPU. ``launch`` / ``bind`` load the module on the current device
    the first time; ``close`` unloads it.
    """

    def __init__(self, source: str, name: str, *, defines: dict | None = None, layout=None,
                 arch: str | None = None, options=(), debug: bool | None = None,
                 watchdog_seconds: float | None = None, filename: str = "kernel.cu",
                 trace: bool | str = False):
        if not isinstance(source, str) or not source.strip():
            raise TmaflowError(f"Kernel: source must be non-empty CUDA C++ text (got {type(source).__name__})")
        if "\0" in source:
            raise TmaflowError(f"Kernel: source has a NUL character at offset {source.index(chr(0))}; "
                               "NVRTC would stop reading there")
        checks.as_text("Kernel: source", source)
        if not isinstance(name, str) or not re.fullmatch(r"[A-Za-z_:][^\n\r\0]*", name):
            raise TmaflowError(f"Kernel: name={name!r} must name a __global__ function")
        checks.as_text("Kernel: name", name)
        if arch is not None:
            checks.as_arch("Kernel: arch", arch)
        if layout is not None and not hasattr(layout, "header"):
            raise TmaflowError(f"Kernel: layout={layout!r} must be a tf.SharedLayout")
        self.source, self.name = source, name
        if not isinstance(filename, str) or not re.fullmatch(r"[^\n\r\0]+", filename):
            raise TmaflowError(f"Kernel: filename={filename!r} must be a non-empty one-line name")
        self.filename = checks.as_text("Kernel: filename", filename)
        self.defines = compiler.check_defines(defines)
        self.options = compiler.check_options(options)
        self.layout = layout
        if debug is not None and not isinstance(debug, (bool, np.bool_)):
            raise TmaflowError(f"Kernel: debug={debug!r} must be True, False or None (TMAFLOW_DEBUG)")
        self.debug = bool(debug) if debug is not None else watchdog.env_debug()
        if isinstance(trace, str) and trace in ("stage", "all"):
            self.trace: str | bool = trace
        elif isinstance(trace, (bool, np.bool_)):
            self.trace = "stage" if trace else False  # False, "stage" or "all"
        else:
            raise TmaflowError(f"Kernel: trace={trace!r} must be False, True (= 'stage') or 'all'")
        self.last_trace = None  # the Trace of the latest traced launch (trace builds)
        if watchdog_seconds is not None:
            watchdog_seconds = watchdog.check_seconds("Kernel: watchdog_seconds", watchdog_seconds)
        # read only for debug builds: a bad TMAFLOW_WATCHDOG_S must not break release kernels
        self.watchdog_seconds = (watchdog_seconds or watchdog.default_seconds()) if self.debug \
            else watchdog_seconds
        self._arch = arch
        self._program: compiler.Program | None = None
        self._params: list[Param] | None = None
        self._modules: dict[int, _Module] = {}
        self._launchers: dict[tuple, Launcher] = {}  # (config..., ordinal, thread ident)
        self._lock = threading.RLock()  # module() holds it while _Module reads .program

    @classmethod
    def from_file(cls, path, name: str, **kwargs) -> "Kernel":
        """A Kernel from a UTF-8 source file (its name is the ``filename`` in compile errors);
        ``kwargs`` as for ``Kernel``."""
        if not isinstance(path, (str, os.PathLike)):
            raise TmaflowError(f"Kernel.from_file: path={path!r} must be a str or a path")
        path = Path(path)
        try:
            data = path.read_bytes()
        except (OSError, ValueError) as exc:  # ValueError: a NUL or a lone surrogate in the path
            raise TmaflowError(f"Kernel.from_file: cannot read path={str(path)!r} "
                               f"({getattr(exc, 'strerror', None) or exc})") from None
        try:
            text = data.decode()
        except UnicodeDecodeError as exc:
            raise TmaflowError(f"Kernel.from_file: path={str(path)!r} is not UTF-8 text (byte "
                               f"{exc.start}); is it a binary file?") from None
        return cls(text, name, filename=path.name, **kwargs)

    # --- compilation (no GPU needed) -------------------------------------------
    @property
    def arch(self) -> str:
        """The target it compiles for: as given, else the current device's (``sm_90a`` without a
        driver)."""
        if self._arch is None:
            self._arch = current_device().arch if driver.driver_available() else compiler.DEFAULT_ARCH
        return self._arch

    def _compile_options(self) -> tuple[str, ...]:
        opts = [f"-D{k}={v}" if v is not None else f"-D{k}" for k, v in sorted(self.defines.items())]
        if self.debug:
            opts += ["-lineinfo", "-DTMAFLOW_DEBUG=1",
                     f"-DTMAFLOW_WATCHDOG_NS={watchdog.nanoseconds(self.watchdog_seconds)}ull"]  # type: ignore[arg-type]  # set whenever debug is
        if self.trace:
            opts += ["-lineinfo", f"-DTMAFLOW_TRACE={2 if self.trace == 'all' else 1}"]
        return tuple(opts) + self.options

    def _headers(self) -> dict[str, str]:
        return {compiler.LAYOUT_HEADER: self.layout.header()} if self.layout is not None else {}

    @property
    def program(self) -> compiler.Program:
        """The compiled program (CUBIN, PTX, log, lowered name), compiled on first use through the
        disk cache. No GPU needed."""
        if self._program is None:
            with self._lock:
                if self._program is None:
                    program = compiler.compile_program(
                        self.source, self.name, options=self._compile_options(), arch=self.arch,
                        headers=self._headers(), filename=self.filename)
                    notes = compiler.wgmma_pipeline_notes(program.log)
                    if notes:
                        warnings.warn(TmaflowWarning(
                            f"{self.name}: ptxas changed the wgmma pipeline, so the tensor cores "
                            "wait where the source does not: " + "; ".join(notes) + ". Write no "
                            "register a wgmma reads or accumulates between wgmma::fence() and "
                            "its wait_group (convert register operands first), and choose "
                            "accumulators at compile time"), stacklevel=3)
                    self._program = program
        return self._program

    @property
    def cubin(self) -> bytes:
        """The compiled CUBIN (compiles on first use; no GPU needed)."""
        return self.program.cubin

    @property
    def ptx(self) -> str:
        """The PTX NVRTC generated (compiles on first use; no GPU needed)."""
        return self.program.ptx

    @property
    def resources(self) -> compiler.Resources | None:
        """Registers, spills, static smem and cmem as ptxas reported them (None when it did not)."""
        return self.program.resources

    def sass(self) -> str:
        """Disassembly of the CUBIN (needs the ``tools`` extra: nvidia-cuda-cuobjdump)."""
        return disassemble(self.cubin)

    # --- launching ------------------------------------------------------------------
    def module(self, device: Device | None = None) -> _Module:
        """The kernel loaded on ``device`` (default: the current one), loaded on first use and
        again after a context reset."""
        device = device or current_device()
        mod = self._modules.get(device.ordinal)
        if mod is None or mod.generation != device.generation:
            with self._lock:
                mod = self._modules.get(device.ordinal)
                if mod is None or mod.generation != device.generation:
                    mod = _Module(self, device)
                    self._modules[device.ordinal] = mod
                    self._launchers.clear()
        return mod

    @property
    def params(self) -> list[Param]:
        """The typed parameter table (index, C++ type, kind, offset, size), read from the
        compiled PTX and the source signature: no GPU needed."""
        if self._params is None:
            prog = self.program
            table = param_table(prog.ptx, prog.lowered_name, self.source, self.name)
            if table is None:
                raise TmaflowError(f"{self.name}: no .entry {prog.lowered_name} in the PTX")
            self._params = table
        return self._params

    def check_args(self, *args) -> bytes:
        """Check ``args`` against the parameter table exactly as a launch would (count, size
        and kind: a float for a pointer, a pointer for a tensor map, an int out of range are
        LaunchErrors) and return the packed parameter bytes. Needs no GPU."""
        packer = ArgPacker(self.params)
        packer.pack(args)
        return bytes(packer.buffer.raw[:packer.total])

    def bind(self, config: LaunchConfig | None = None, *, grid=None, block=None, cluster=(1, 1, 1),
             smem: int | None = None, stream=None, pdl: bool = False, cooperative: bool = False,
             device: Device | None = None) -> Launcher:
        """Check a launch configuration once and return a :class:`Launcher` for hot loops.
        Pass a :class:`LaunchConfig` or its fields."""
        if config is None:
            if grid is None or block is None:
                raise LaunchError(f"{self.name}: bind needs grid= and block= (or a LaunchConfig)")
            config = LaunchConfig(grid, block, cluster, smem, stream, pdl, cooperative)
        elif not isinstance(config, LaunchConfig):
            raise LaunchError(f"config={config!r} must be a tf.LaunchConfig")
        device = as_device(device, f"{self.name}: bind")
        major, minor = device.compute_capability
        built = self.arch.removeprefix("sm_").rstrip("af")
        if built != f"{major}{minor}":
            raise LaunchError(f"{self.name} is built for {self.arch} but device {device.ordinal} is "
                              f"{device.name} (cc {major}.{minor}); "
                              + ("tmaflow kernels need a Hopper GPU (cc 9.0)" if self.arch.startswith("sm_90")
                                 else f"build it with arch='{device.arch}'"))
        mod = self.module(device)
        launcher = Launcher(self, mod, self._fit(config, mod))
        mod.launchers.add(launcher)
        return launcher

    def _fit(self, config: LaunchConfig, mod: _Module) -> LaunchConfig:
        """The device- and kernel-specific rules: compiled cluster dims, the layout's planned
        cluster and size, threads, smem."""
        cluster = config.cluster
        if any(mod.compiled_cluster):
            if cluster == (1, 1, 1):
                cluster = mod.compiled_cluster
            elif cluster != mod.compiled_cluster:
                raise LaunchError(f"cluster={cluster} conflicts with __cluster_dims__"
                                  f"{mod.compiled_cluster} compiled into {self.name}; pass "
                                  f"cluster={mod.compiled_cluster} or leave it out")
        if self.layout is not None:
            self.layout.check_launch(self.name, cluster, config.smem)
        if config.threads > mod.max_threads:
            raise LaunchError(f"block={config.block} has {config.threads} threads; {self.name} "
                              f"allows at most {mod.max_threads} (registers or __launch_bounds__)")
        smem = config.smem
        if smem is None:
            smem = self.layout.total_bytes if self.layout is not None else 0
        if cluster != config.cluster or smem != config.smem:
            config = LaunchConfig(config.grid, config.block, cluster, smem, config.stream,
                                  config.pdl, config.cooperative, config.stream_object)
        if cluster[0] * cluster[1] * cluster[2] > PORTABLE_CLUSTER:
            mod.allow_non_portable()
        mod.ensure_smem(smem)
        return config

    def launcher(self, *, grid, block, cluster=(1, 1, 1), smem: int | None = None,
                 stream=None, pdl: bool = False, cooperative: bool = False) -> Launcher:
        """The bound launcher for this configuration on the current device, built (and
        checked) once per thread: what ``launch`` uses, for callers that launch again later.
        A cooperative launcher's key has one part more (``launch``'s C lookup never finds it)."""
        if stream is not None and type(stream) is not int:
            stream = stream_handle(stream)
        more = ("cooperative",) if cooperative else ()
        key = (grid, block, cluster, smem, stream, pdl, current_ordinal(), get_ident(), *more)
        cache = self._launchers
        try:
            launcher = cache.get(key)
        except TypeError:  # lists: normalise them into the key
            config = LaunchConfig(grid, block, cluster, smem, stream, pdl, cooperative)
            key = (config.grid, config.block, config.cluster, config.smem, config.stream, pdl,
                   current_ordinal(), get_ident(), *more)
            launcher = cache.get(key)
        if launcher is None or launcher.generation != launcher.module.device.generation:
            launcher = self.bind(grid=grid, block=block, cluster=cluster, smem=smem, stream=stream,
                                 pdl=pdl, cooperative=cooperative)
            if len(cache) > 256:
                cache.clear()
            cache[key] = launcher
            self._install_entry()
        return launcher

    def _install_entry(self) -> None:
        """Let ``self.launch`` find its launcher in C (``native.Entry``, in the instance dict,
        where it shadows the method): the lookup below, without its Python. Calls it does not
        take (other devices, stream objects, a key not cached) reach this method unchanged."""
        if "launch" in self.__dict__ or type(self).launch is not Kernel.launch or \
                Kernel.launch.__kwdefaults__ != _LAUNCH_DEFAULTS:
            return  # installed, a subclass's own launch, or keywords the entry does not know
        built = native.module()
        if built is not None:
            self.__dict__["launch"] = built.Entry(self._launchers, _switched, Launcher._retired_call,
                                                  types.MethodType(Kernel.launch, self),
                                                  _LAUNCH_DEFAULTS["cluster"])

    def launch(self, *args, grid, block, cluster=(1, 1, 1), smem: int | None = None,
               stream=None, pdl: bool = False) -> None:
        """Launch on the current device. ``grid`` counts blocks; ``cluster`` must divide it.
        Once the kernel has a launcher, ``kernel.launch`` is its C lookup (``native.Entry``),
        which calls this method for every call it does not take."""
        if stream is not None and type(stream) is not int:  # one key per handle (1.0 == 1 == True)
            stream = stream_handle(stream)
        try:  # the launcher() lookup, inlined: this is the hot path of k.launch
            launcher = self._launchers[grid, block, cluster, smem, stream, pdl,
                                       current_ordinal() if _switched[0] else 0, get_ident()]
            if launcher.generation != launcher.module.device.generation:
                raise KeyError("the device was reset")
        except (KeyError, TypeError):
            launcher = self.launcher(grid=grid, block=block, cluster=cluster, smem=smem,
                                     stream=stream, pdl=pdl)
        launcher(*args)

    def close(self) -> None:
        """Unload this kernel's modules from every device (a later launch loads it again)."""
        with self._lock:
            modules, self._modules = self._modules, {}
            self._launchers.clear()  # the same dict: a native.Entry reads it
        for mod in modules.values():
            mod.unload()

    def __repr__(self) -> str:
        return (f"Kernel({self.name!r}, arch={self._arch or 'auto'}, debug={self.debug}"
                + (f", trace={self.trace!r})" if self.trace else ")"))
