"""tmaflow: write, compile, launch and check NVIDIA Hopper kernels that move data with TMA."""
from __future__ import annotations

__version__ = "0.1.0"

from .tma import reference
from . import trace
from .launch.compiler import Resources
from .runtime.device import Device, Stream, current_device, set_device
from .runtime.driver import driver_available
from .dtypes import DType, as_dtype
from .errors import (CompileError, CudaError, DeadlockError, DriverNotFoundError, KernelFaultError,
                     LaunchError, LayoutError, PipelineError, TensorMapError, TmaflowError,
                     TmaflowWarning)
from .runtime.graph import Graph
from .launch.kernel import Kernel
from .launch.config import LaunchConfig
from .launch.launcher import Launcher
from .tma.layout import Barrier, Buffer, Pipeline, SharedLayout
from .runtime.memory import DeviceArray, as_array, empty, from_numpy, zeros
from .tma.tensormap import TensorMap
from .tma.spec import TensorMapSpec
from .tma.workspace import DescriptorWorkspace

__all__ = [
    "Barrier", "Buffer", "CompileError", "CudaError", "DType", "DeadlockError", "DescriptorWorkspace", "Device",
    "DeviceArray", "DriverNotFoundError", "Graph", "Kernel", "KernelFaultError", "LaunchConfig", "Launcher",
    "LaunchError", "LayoutError",
    "Pipeline", "PipelineError", "Resources", "SharedLayout", "Stream", "TensorMap", "TensorMapError",
    "TensorMapSpec", "TmaflowError", "TmaflowWarning", "as_array", "as_dtype", "current_device",
    "driver_available", "empty", "from_numpy", "reference", "set_device", "trace", "zeros",
]
