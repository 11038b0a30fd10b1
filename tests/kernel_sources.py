"""Sources of the kernels the tests use: the probe, planted-bug and seed kernels live here in
``tests/kernels/`` (not in the wheel); anything else is one of tmaflow's own."""
from pathlib import Path

from tmaflow.kernels import source as package_source

HERE = Path(__file__).resolve().parent / "kernels"


def source(name: str) -> str:
    path = HERE / f"{name}.cu"
    return path.read_text() if path.exists() else package_source(name)
