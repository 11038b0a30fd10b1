"""Dependent-chain suite of ``python -m tmaflow bench``: small kernels that depend on each
other, with programmatic dependent launch (PDL) against without, eager and as a graph."""
from __future__ import annotations

import statistics

import numpy as np

from ..kernels import examples
from ..kernels.matmul.dense import gemm
from ..kernels.registry import source
from ..launch.kernel import Kernel
from ..runtime.graph import Graph
from ..runtime.memory import empty, from_numpy
from .events import EventPair
from .internals import call


def dependent_chains(repeats: int = 30) -> list[dict]:
    """Chains of small dependent kernels with programmatic dependent launch against without,
    in the same rounds: eight 1 MB copies (x0 -> x1 -> ... -> x8) and four decode-sized
    softmax -> gemm pairs. Each chain is timed on the GPU alone: queued behind a spin kernel
    (the host enqueues it meanwhile), launched eagerly and as a replayed tf.Graph."""
    spin = Kernel(source("bench"), "spin", filename="bench.cu").bind(grid=1, block=32)
    rng = np.random.default_rng()
    xs = [from_numpy(rng.standard_normal((512, 512), dtype=np.float32))]
    xs += [empty((512, 512), "float32") for _ in range(8)]
    sx = from_numpy(rng.standard_normal((16, 4096), dtype=np.float32))
    sy = empty((16, 4096), "float32")
    a = from_numpy(rng.integers(0, 2**16, (16, 4096), dtype=np.uint16) & 0x3FFF, "bfloat16")
    b = from_numpy(rng.integers(0, 2**16, (4096, 4096), dtype=np.uint16) & 0x3FFF, "bfloat16")
    cs = [empty((16, 4096), "bfloat16") for _ in range(4)]

    def copies(pdl):
        for i in range(8):
            examples.copy(xs[i], xs[i + 1], pdl=pdl)

    def decode(pdl):
        for c in cs:
            examples.softmax(sx, sy, pdl=pdl)
            gemm(a, b, c, pdl=pdl)

    chains = {"8 copies of 1 MB": (copies, lambda: (xs[8].numpy(), xs[0].numpy())),
              "4 x (softmax 16x4096 -> gemm 16x4096x4096)": (decode, lambda: (sy.numpy(), cs[3].numpy()))}
    events = EventPair()

    def queued(run):  # seconds of GPU time for one run, enqueued during a 400 us spin
        spin(400_000)
        events.start()
        run()
        return events.stop()

    rows = []
    for name, (chain, result) in chains.items():
        outputs, graphs, cases = {}, {}, {}
        for pdl in (False, True):
            chain(pdl)  # warm: compiled, prepared, workspaces made
            call("cuCtxSynchronize")
            outputs[pdl] = result()
            g = graphs[pdl] = Graph()
            with g.capture():
                chain(pdl)
            cases[("eager", pdl)] = lambda pdl=pdl: chain(pdl)
            cases[("graph", pdl)] = g.replay
        got: dict[tuple[str, bool], list[float]] = {key: [] for key in cases}
        for _ in range(repeats):
            for key, run in cases.items():
                got[key].append(queued(run))
        same = all(np.array_equal(x, y) for x, y in zip(outputs[False], outputs[True]))
        if name.startswith("8 copies"):  # and the chain copied x0 through
            same = same and np.array_equal(outputs[True][0], outputs[True][1])
        for how in ("eager", "graph"):
            plain, chained = got[(how, False)], got[(how, True)]
            rows.append({"chain": name, "how": how, "plain_us": statistics.median(plain) * 1e6,
                         "pdl_us": statistics.median(chained) * 1e6,
                         "speedup": statistics.median(p / q for p, q in zip(plain, chained)),
                         "identical": bool(same)})
        for g in graphs.values():
            g.close()
    events.close()
    return rows


def format_chains(rows: list[dict]) -> str:
    lines = [f"{'dependent chain (GPU time, behind a spin)':46s} {'how':6s} {'plain us':>9s} "
             f"{'pdl us':>8s} {'speed-up':>8s}  identical"]
    for r in rows:
        lines.append(f"{r['chain']:46s} {r['how']:6s} {r['plain_us']:9.1f} {r['pdl_us']:8.1f} "
                     f"{r['speedup']:8.3f}  {'yes' if r['identical'] else 'NO'}")
    return "\n".join(lines)
