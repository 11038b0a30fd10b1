"""Debugging kernels: bounded waits (watchdog), device-side traces and the diagnosis of a hang or a wrong pipeline from them."""
