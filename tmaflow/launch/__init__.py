"""Compiling and launching: NVRTC and the kernel cache, SASS, kernels and their launch configurations, argument packing and the C launch plans."""
