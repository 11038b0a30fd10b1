"""docs/tutorial.md runs: its ```python tutorial:cpu blocks on every machine (compiling,
validating, the reference model, SASS), its tutorial:gpu blocks on a Hopper GPU. A chapter's
blocks run in order, after the CPU blocks of the chapters before it, in one namespace."""
import re
from pathlib import Path

import pytest

TUTORIAL = Path(__file__).resolve().parents[1] / "docs" / "tutorial.md"
BLOCK = re.compile(r"^```python tutorial:(cpu|gpu)\n(.*?)^```\n", re.S | re.M)
CHAPTER = re.compile(r"^## (\d+)\. (.+)$", re.M)


def chapters() -> list[tuple[str, list[tuple[str, str, int]]]]:
    """[(chapter title, [(tier, code, first line)])] in the order of the page."""
    text = TUTORIAL.read_text()
    starts = [(m.start(), f"{m.group(1)}. {m.group(2)}") for m in CHAPTER.finditer(text)]
    out = []
    for (start, title), (end, _) in zip(starts, starts[1:] + [(len(text), "")]):
        blocks = [(m.group(1), m.group(2), text.count("\n", 0, m.start(2)) + 1)
                  for m in BLOCK.finditer(text, start, end)]
        out.append((title, blocks))
    return out


CHAPTERS = chapters()


def _run(blocks, namespace: dict) -> None:
    for _, code, line in blocks:
        # padded so a traceback names the line of docs/tutorial.md
        exec(compile("\n" * (line - 1) + code, str(TUTORIAL), "exec"), namespace)


def _cpu_blocks_before(index: int) -> list:
    return [b for _, blocks in CHAPTERS[:index] for b in blocks if b[0] == "cpu"]


def test_the_tutorial_has_its_chapters_and_tiers():
    titles = [t for t, _ in CHAPTERS]
    assert len(titles) == 8 and titles[0].startswith("1. A TMA copy"), titles
    for title, blocks in CHAPTERS:
        assert blocks, f"chapter {title!r} has no runnable block"
    # a fenced python block outside the two tiers would silently never run
    untiered = re.findall(r"^```python(?! tutorial:(?:cpu|gpu)\n).*$", TUTORIAL.read_text(), re.M)
    assert not untiered, untiered


@pytest.mark.parametrize("index", [i for i, (_, blocks) in enumerate(CHAPTERS)
                                   if any(b[0] == "cpu" for b in blocks)],
                         ids=lambda i: f"chapter{i + 1}")
def test_cpu_blocks(index):
    _run(_cpu_blocks_before(index + 1), {"__name__": "tutorial"})


@pytest.mark.gpu
@pytest.mark.parametrize("index", [i for i, (_, blocks) in enumerate(CHAPTERS)
                                   if any(b[0] == "gpu" for b in blocks)],
                         ids=lambda i: f"chapter{i + 1}")
def test_gpu_blocks(device, index):
    namespace = {"__name__": "tutorial"}
    _run(_cpu_blocks_before(index), namespace)
    _run(CHAPTERS[index][1], namespace)
