"""tmaflow's version (kept apart so modules that key caches on it need not import the package)."""
__version__ = "0.1.0"
