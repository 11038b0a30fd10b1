"""The README's kernel example: compiled on every machine, run and checked on a Hopper GPU."""
import re
from pathlib import Path

import pytest

import tmaflow as tf

README = Path(__file__).resolve().parents[1] / "README.md"


def example() -> str:
    text = README.read_text()
    section = text[text.index("## A kernel in tmaflow"):]
    return re.search(r"```python\n(.*?)```", section, re.S).group(1)


def test_readme_example_compiles(monkeypatch):
    code = example()
    src = re.search(r"src = r'''(.*?)'''", code, re.S).group(1)
    spec = tf.TensorMapSpec.tiled("float32", (256, 64), (32, 64))
    layout = tf.SharedLayout([tf.Buffer("tile", spec.smem_bytes, align=spec.smem_align),
                              tf.Barrier("loaded", arrivals=1, tx_bytes=spec.tx_bytes)])
    assert tf.Kernel(src, "scale", layout=layout).cubin[:4] == b"\x7fELF"


@pytest.mark.gpu
def test_readme_example_runs(device):
    exec(compile(example(), str(README), "exec"), {})
