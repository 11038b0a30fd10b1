"""``Kernel``: compile (lazily, cached), load per device, check arguments, launch with clusters."""
from __future__ import annotations

import logging
import re
import threading
from pathlib import Path

from . import compiler, driver, watchdog
from .device import Device, current_device, current_ordinal, stream_handle
from .errors import CudaError, LaunchError, TmaflowError
from .params import ArgPacker, Param

log = logging.getLogger("tmaflow.kernel")

PORTABLE_CLUSTER = 8
MAX_CLUSTER = 16
STATIC_SMEM_LIMIT = 48 * 1024


def _dims(name: str, value) -> tuple[int, int, int]:
    given = value
    if isinstance(value, int):
        value = (value,)
    if isinstance(value, (str, bytes)) or not hasattr(value, "__iter__"):
        raise LaunchError(f"{name}={given!r} must be an int or a tuple of 1-3 ints")
    try:
        dims = tuple(int(v) for v in value)
    except (TypeError, ValueError):
        raise LaunchError(f"{name}={given!r} must be an int or a tuple of 1-3 ints") from None
    if not 1 <= len(dims) <= 3 or any(d < 1 for d in dims):
        raise LaunchError(f"{name}={given!r} must have 1-3 extents, each >= 1")
    return dims + (1,) * (3 - len(dims))


class _Module:
    """A kernel loaded on one device: function handle, parameter table, attributes set."""

    def __init__(self, kernel: "Kernel", device: Device):
        device.activate()
        self.device = device
        self.generation = device.generation
        prog = kernel.program
        self.module = driver.call("cuModuleLoadData", prog.cubin)
        self.function = driver.call("cuModuleGetFunction", self.module, prog.lowered_name.encode())
        self.params = self._param_table(compiler.ptx_param_count(prog.ptx, prog.lowered_name))
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

    def _param_table(self, count: int | None) -> list[Param]:
        """Offsets and sizes from cuFuncGetParamInfo; the count from the entry's PTX signature
        (probing one past the end would be an API error that compute-sanitizer reports)."""
        cu = driver.cu()
        params = []
        while count is None or len(params) < count:
            err, offset, size = cu.cuFuncGetParamInfo(self.function, len(params))
            if count is None and int(err) == int(cu.CUresult.CUDA_ERROR_INVALID_VALUE):
                break  # probed one past the last parameter (older drivers)
            driver.check("cuFuncGetParamInfo", (err,))
            params.append(Param(len(params), int(offset), int(size)))
        return params

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


class Launcher:
    """A kernel with its launch configuration fixed: ``launcher(*args)`` packs and launches.

    All configuration checks ran when it was built. One launcher belongs to one thread
    (its argument buffer is reused); ``Kernel.launch`` keeps one per thread and config.
    """

    def __init__(self, kernel: "Kernel", module: _Module, grid, block, cluster, smem: int, stream):
        cu = driver.cu()
        self.kernel, self.module = kernel, module
        self.generation = module.generation
        self.grid, self.block, self.cluster, self.smem = grid, block, cluster, smem
        self.stream = stream_handle(stream)
        self._stream_owner = stream  # keeps a tf.Stream (or torch/cupy stream) alive
        self.packer = ArgPacker(module.params)
        cfg = cu.CUlaunchConfig()
        cfg.gridDimX, cfg.gridDimY, cfg.gridDimZ = grid
        cfg.blockDimX, cfg.blockDimY, cfg.blockDimZ = block
        cfg.sharedMemBytes = smem
        cfg.hStream = cu.CUstream(self.stream)
        attrs = []
        if cluster != (1, 1, 1) and not any(module.compiled_cluster):
            attr = cu.CUlaunchAttribute()
            attr.id = cu.CUlaunchAttributeID.CU_LAUNCH_ATTRIBUTE_CLUSTER_DIMENSION
            attr.value.clusterDim.x, attr.value.clusterDim.y, attr.value.clusterDim.z = cluster
            attrs.append(attr)
        cfg.attrs = attrs
        cfg.numAttrs = len(attrs)
        self.config = cfg
        self._launch = cu.cuLaunchKernelEx
        self._function = module.function
        self._pack = self.packer.pack
        self._watch = module.watch
        # After the first checked call this instance's class becomes a subclass whose
        # __call__ is generated for the argument types seen (ArgPacker.fast_call).
        if cluster != (1, 1, 1):
            self._check_cluster_fits()

    def max_active_clusters(self) -> int:
        """How many clusters of this configuration the device runs at once (its GPCs may not
        pair every SM): the grid size, in clusters, of a persistent kernel. Without a cluster,
        how many blocks (blocks per SM x SMs)."""
        cu = driver.cu()
        if self.cluster == (1, 1, 1):  # cuOccupancyMaxActiveClusters answers 1 here
            threads = self.block[0] * self.block[1] * self.block[2]
            per_sm = driver.check("cuOccupancyMaxActiveBlocksPerMultiprocessor",
                                  cu.cuOccupancyMaxActiveBlocksPerMultiprocessor(self._function, threads, self.smem))
            return per_sm * self.module.device.sm_count
        return driver.check("cuOccupancyMaxActiveClusters",
                            cu.cuOccupancyMaxActiveClusters(self._function, self.config))

    def _check_cluster_fits(self) -> None:
        n = self.max_active_clusters()
        if n == 0:
            raise LaunchError(
                f"cluster={self.cluster} with block={self.block} and smem={self.smem} B cannot be "
                f"scheduled on {self.module.device.name} (cuOccupancyMaxActiveClusters = 0); "
                "use a smaller cluster, fewer threads or less shared memory")

    def __call__(self, *args) -> None:
        self._checked(args)

    def _checked(self, args: tuple) -> None:
        """Every argument checked against the parameter table, then the launch."""
        kp = self._pack(args)
        if self._watch is None:
            if self.packer.fast is not None:
                fast = self.packer.fast_call(self._launch, self.config, self._function, self._raise)
                self.__class__ = type("Launcher", (Launcher,), {"__call__": fast})
            elif type(self) is not Launcher:
                self.__class__ = Launcher  # argument kinds that always take the checked path
        watch = self._watch
        if watch is not None:
            watch.arm()
        (err,) = self._launch(self.config, self._function, kp, 0)
        if err:
            self._raise(err)
        if watch is not None:
            watch.check(self.stream, self.kernel)

    def _raise(self, err) -> None:
        raise CudaError("cuLaunchKernelEx", int(err), driver._error_name(err),
                        f"{self.kernel.name} grid={self.grid} block={self.block} "
                        f"cluster={self.cluster} smem={self.smem}")

    def __repr__(self) -> str:
        return (f"Launcher({self.kernel.name}, grid={self.grid}, block={self.block}, "
                f"cluster={self.cluster}, smem={self.smem})")


class Kernel:
    """A CUDA C++ kernel compiled with NVRTC to CUBIN.

    ``cubin``, ``ptx`` and ``resources`` need no GPU. ``launch`` loads the module on the
    current device the first time and checks every argument against the kernel's own
    parameter table.
    """

    def __init__(self, source: str, name: str, *, defines: dict | None = None, layout=None,
                 arch: str | None = None, options=(), debug: bool | None = None,
                 watchdog_seconds: float | None = None, filename: str = "kernel.cu"):
        if not isinstance(source, str) or not source.strip():
            raise TmaflowError(f"Kernel: source must be non-empty CUDA C++ text (got {type(source).__name__})")
        if not isinstance(name, str) or not name.strip():
            raise TmaflowError(f"Kernel: name={name!r} must name a __global__ function")
        if arch is not None and not re.fullmatch(r"sm_\d{2,3}[af]?", arch):
            raise TmaflowError(f"Kernel: arch={arch!r} must look like 'sm_90a'")
        if layout is not None and not hasattr(layout, "header"):
            raise TmaflowError(f"Kernel: layout={layout!r} must be a tf.SharedLayout")
        self.source, self.name, self.filename = source, name, filename
        self.defines = dict(defines or {})
        self.layout = layout
        self.debug = bool(debug) if debug is not None else watchdog.env_debug()
        self.watchdog_seconds = watchdog_seconds or watchdog.default_seconds()
        self.options = tuple(options)
        self._arch = arch
        self._program = None
        self._modules: dict[int, _Module] = {}
        self._local = threading.local()
        self._lock = threading.RLock()  # module() holds it while _Module reads .program

    @classmethod
    def from_file(cls, path, name: str, **kwargs) -> "Kernel":
        path = Path(path)
        try:
            text = path.read_text()
        except OSError as exc:
            raise TmaflowError(f"Kernel.from_file: cannot read path={str(path)!r} ({exc.strerror})") from None
        return cls(text, name, filename=path.name, **kwargs)

    # --- compilation (no GPU needed) -------------------------------------------
    @property
    def arch(self) -> str:
        if self._arch is None:
            self._arch = current_device().arch if driver.driver_available() else compiler.DEFAULT_ARCH
        return self._arch

    def _compile_options(self) -> tuple[str, ...]:
        opts = [f"-D{k}={v}" if v is not None else f"-D{k}" for k, v in sorted(self.defines.items())]
        if self.debug:
            opts += ["-lineinfo", "-DTMAFLOW_DEBUG=1",
                     f"-DTMAFLOW_WATCHDOG_NS={int(self.watchdog_seconds * 1e9)}ull"]
        return tuple(opts) + self.options

    def _headers(self) -> dict[str, str]:
        return {"tmaflow_layout.cuh": self.layout.header()} if self.layout is not None else {}

    @property
    def program(self) -> compiler.Program:
        if self._program is None:
            with self._lock:
                if self._program is None:
                    self._program = compiler.compile_program(
                        self.source, self.name, options=self._compile_options(), arch=self.arch,
                        headers=self._headers(), filename=self.filename)
        return self._program

    @property
    def cubin(self) -> bytes:
        return self.program.cubin

    @property
    def ptx(self) -> str:
        return self.program.ptx

    @property
    def resources(self) -> compiler.Resources | None:
        return self.program.resources

    def sass(self) -> str:
        """Disassembly of the CUBIN (needs the ``tools`` extra: nvidia-cuda-cuobjdump)."""
        from .tools import disassemble

        return disassemble(self.cubin)

    # --- launching ------------------------------------------------------------------
    def module(self, device: Device | None = None) -> _Module:
        device = device or current_device()
        mod = self._modules.get(device.ordinal)
        if mod is None or mod.generation != device.generation:
            with self._lock:
                mod = self._modules.get(device.ordinal)
                if mod is None or mod.generation != device.generation:
                    mod = _Module(self, device)
                    self._modules[device.ordinal] = mod
                    self._local.__dict__.clear()
        return mod

    def bind(self, *, grid, block, cluster=(1, 1, 1), smem: int | None = None, stream=None,
             device: Device | None = None) -> Launcher:
        """Check a launch configuration once and return a :class:`Launcher` for hot loops."""
        grid, block, cluster = _dims("grid", grid), _dims("block", block), _dims("cluster", cluster)
        device = device or current_device()
        major, minor = device.compute_capability
        built = self.arch.removeprefix("sm_").rstrip("af")
        if built != f"{major}{minor}":
            raise LaunchError(f"{self.name} is built for {self.arch} but device {device.ordinal} is "
                              f"{device.name} (cc {major}.{minor}); "
                              + ("tmaflow kernels need a Hopper GPU (cc 9.0)" if self.arch.startswith("sm_90")
                                 else f"build it with arch='{device.arch}'"))
        mod = self.module(device)
        if any(mod.compiled_cluster):
            if cluster == (1, 1, 1):
                cluster = mod.compiled_cluster
            elif cluster != mod.compiled_cluster:
                raise LaunchError(f"cluster={cluster} conflicts with __cluster_dims__"
                                  f"{mod.compiled_cluster} compiled into {self.name}; pass "
                                  f"cluster={mod.compiled_cluster} or leave it out")
        threads = block[0] * block[1] * block[2]
        if threads > mod.max_threads:
            raise LaunchError(f"block={block} has {threads} threads; {self.name} allows at most "
                              f"{mod.max_threads} (registers or __launch_bounds__)")
        for axis, (g, c) in enumerate(zip(grid, cluster)):
            if g % c:
                raise LaunchError(f"cluster={cluster} does not divide grid={grid} (in blocks): "
                                  f"axis {'xyz'[axis]} has {g} blocks, not a multiple of {c}")
        size = cluster[0] * cluster[1] * cluster[2]
        if size > MAX_CLUSTER:
            raise LaunchError(f"cluster={cluster} has {size} blocks; Hopper allows at most "
                              f"{PORTABLE_CLUSTER} (portable) or {MAX_CLUSTER} (non-portable)")
        if size > PORTABLE_CLUSTER:
            mod.allow_non_portable()
        if smem is None:
            smem = self.layout.total_bytes if self.layout is not None else 0
        if not isinstance(smem, int) or smem < 0:
            raise LaunchError(f"smem={smem!r} must be a non-negative int (bytes of dynamic smem)")
        mod.ensure_smem(smem)
        return Launcher(self, mod, grid, block, cluster, smem, stream)

    def launcher(self, *, grid, block, cluster=(1, 1, 1), smem: int | None = None,
                 stream=None) -> Launcher:
        """The bound launcher for this configuration on the current device, built (and
        checked) once per thread: what ``launch`` uses, for callers that launch again later."""
        key = (grid, block, cluster, smem, stream if stream is None else stream_handle(stream),
               current_ordinal())  # a launcher belongs to one device's module
        cache = self._local.__dict__
        launcher = cache.get(key)
        if launcher is None or launcher.generation != launcher.module.device.generation:
            launcher = self.bind(grid=grid, block=block, cluster=cluster, smem=smem, stream=stream)
            if len(cache) > 64:
                cache.clear()
            cache[key] = launcher
        return launcher

    def launch(self, *args, grid, block, cluster=(1, 1, 1), smem: int | None = None,
               stream=None) -> None:
        """Launch on the current device. ``grid`` counts blocks; ``cluster`` must divide it."""
        self.launcher(grid=grid, block=block, cluster=cluster, smem=smem, stream=stream)(*args)

    def __repr__(self) -> str:
        return f"Kernel({self.name!r}, arch={self._arch or 'auto'}, debug={self.debug})"
