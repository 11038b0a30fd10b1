"""tmaflow: write, compile, launch and check NVIDIA Hopper kernels that move data with TMA."""
from __future__ import annotations

import sys

from .debug import diagnose, trace
from .dtypes import DType, as_dtype
from .errors import (CompileError, CudaError, DeadlockError, DriverNotFoundError, KernelFaultError,
                     LaunchError, LayoutError, PipelineError, TensorMapError, TmaflowError,
                     TmaflowWarning)
from .launch import compiler, native
from .launch.compiler import Resources
from .launch.config import LaunchConfig
from .launch.kernel import Kernel
from .launch.launcher import Launcher
from .runtime import driver, memory
from .runtime.device import Device, Stream, current_device, set_device
from .runtime.driver import driver_available
from .runtime.graph import Graph
from .runtime.memory import DeviceArray, as_array, empty, from_numpy, zeros
from .tma import reference, tensormap
from .tma.layout import Barrier, Buffer, Pipeline, SharedLayout
from .tma.spec import TensorMapSpec
from .tma.tensormap import TensorMap
from .tma.workspace import DescriptorWorkspace
from .version import __version__  # noqa: F401 (the package's version)

# Module paths from before the regroup that the README, docs and tools name (``tmaflow.trace``,
# ``from tmaflow import driver``, ``from tmaflow.memory import DeviceArray``): the same modules.
for _module in (compiler, diagnose, driver, memory, native, reference, tensormap, trace):
    sys.modules[f"{__name__}.{_module.__name__.rsplit('.', 1)[1]}"] = _module
del _module

__all__ = [
    "Barrier", "Buffer", "CompileError", "CudaError", "DType", "DeadlockError", "DescriptorWorkspace", "Device",
    "DeviceArray", "DriverNotFoundError", "Graph", "Kernel", "KernelFaultError", "LaunchConfig", "Launcher",
    "LaunchError", "LayoutError",
    "Pipeline", "PipelineError", "Resources", "SharedLayout", "Stream", "TensorMap", "TensorMapError",
    "TensorMapSpec", "TmaflowError", "TmaflowWarning", "as_array", "as_dtype", "current_device",
    "autotune", "bench", "driver_available", "empty", "from_numpy", "reference", "set_device", "trace",
    "zeros",
]


def __getattr__(name):  # tf.bench and tf.autotune load on first use: they import the kernels
    import importlib

    if name == "bench":
        return importlib.import_module(f"{__name__}.bench")
    if name == "autotune":
        return importlib.import_module(f"{__name__}.tune").autotune
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
