"""The runtime: the one door to the driver, devices and streams, device memory, graphs and faults."""
