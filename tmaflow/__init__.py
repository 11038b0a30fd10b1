"""tmaflow: write, compile, launch and check NVIDIA Hopper kernels that move data with TMA."""
from __future__ import annotations

__version__ = "0.1.0"

from . import reference, trace
from .compiler import Resources
from .device import Device, Stream, current_device, set_device
from .driver import driver_available
from .dtypes import DType, as_dtype
from .errors import (CompileError, CudaError, DeadlockError, DriverNotFoundError, KernelFaultError,
                     LaunchError, LayoutError, PipelineError, TensorMapError, TmaflowError,
                     TmaflowWarning)
from .graph import Graph
from .kernel import Kernel
from .launch import LaunchConfig, Launcher
from .layout import Barrier, Buffer, Pipeline, SharedLayout
from .memory import DeviceArray, as_array, empty, from_numpy, zeros
from .tensormap import TensorMap, TensorMapSpec
from .workspace import DescriptorWorkspace

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
