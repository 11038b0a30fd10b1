"""The GEMM benchmarks' shape suites (M, N, K, layout) and tile sweeps, and a short name for a
config: shared by tools/peers/bench_gemm.py, the experiments and the autotuner's benchmark."""
from __future__ import annotations

from tmaflow.kernels import GemmConfig, SkinnyConfig

DEFAULT = [(8192, 8192, 8192, "nt"), (4096, 4096, 4096, "nt"), (2048, 2048, 2048, "nt"),
           (4096, 14336, 4096, "nt"), (8192, 4096, 14336, "nt"), (16, 4096, 4096, "nt"),
           (8192, 8192, 8192, "nn"), (4096, 4096, 4096, "nn"),
           # shapes no config was tuned on: partial last waves, short K, ragged edges
           (1024, 1024, 1024, "nt"), (3072, 3072, 3072, "nt"), (2304, 4608, 1024, "nt"),
           (1000, 3000, 520, "nt"), (512, 512, 2048, "nt")]
EXTRA = [(128, 4096, 4096, "nt"), (64, 4096, 4096, "nt"), (16, 4096, 16384, "nt")]
# issue 16's decode shapes: M in {1, 16, 64, 128} x (N x K) in {4096 x 4096, 8192 x 8192, 7168 x 16384}
SKINNY = [(m, n, k, "nt") for n, k in ((4096, 4096), (8192, 8192), (7168, 16384)) for m in (1, 16, 64, 128)]

# issue 33's 30 shapes where models spend time: square 256-4096, decode (M = 1..128 against
# N, K in {4096, 7168, 14336}), the known weak and ragged shapes, Llama-3 8B / 70B and
# DeepSeek-V3 projections at 4096 tokens
SUITE_30 = ([(s, s, s, "nt") for s in (256, 512, 1024, 2048, 4096)]
            + [(m, n, k, "nt") for m, n, k in ((1, 4096, 4096), (16, 4096, 14336), (32, 7168, 4096),
                                               (64, 14336, 4096), (128, 4096, 7168), (1, 7168, 14336),
                                               (16, 14336, 7168), (128, 7168, 7168))]
            + [(512, 512, 2048, "nt"), (1000, 3000, 520, "nt"), (2304, 4608, 1024, "nt"),
               (128, 8192, 8192, "nt")]
            + [(4096, n, k, "nt") for n, k in ((6144, 4096), (28672, 4096), (4096, 14336),  # Llama-3-8B (its o_proj is 4096^3 above)
                                               (10240, 8192), (8192, 8192), (57344, 8192), (8192, 28672),  # Llama-3-70B
                                               (24576, 1536), (32768, 512), (7168, 16384),  # DeepSeek-V3 attention
                                               (2112, 7168), (4096, 7168), (7168, 2048))])  # DeepSeek-V3 MLA down, expert up/down
# issue 29's shapes whose N or K is not a multiple of 8 (the edge path), against torch on the same tensors
UNALIGNED = [(4097, 4099, 4104, "nt"), (4096, 4096, 4100, "nt"), (129, 257, 4095, "nt"),
             (1024, 1024, 1023, "nt"), (2048, 2048, 2047, "nt")]
SUITES = {"default": DEFAULT, "extra": DEFAULT + EXTRA, "skinny": SKINNY, "30": SUITE_30,
          "unaligned": UNALIGNED}

SWEEP = [GemmConfig(bn=256, cluster_m=2), GemmConfig(bn=256, cluster_m=2, group_m=8),
         GemmConfig(bn=256, cluster_m=2, group_m=32), GemmConfig(bn=256, cluster_m=2, epi_cols=256, stages=3),
         GemmConfig(bn=256, cluster_m=1), GemmConfig(bn=128, cluster_m=1),
         GemmConfig(bn=256, cluster_m=2, l2_promotion="none"), GemmConfig(bn=128, cluster_m=1, l2_promotion="none"),
         GemmConfig(bn=128, cluster_m=1, epi_cols=64), GemmConfig(bn=128, cluster_m=2),
         GemmConfig(bn=128, cluster_m=1, group_m=4), GemmConfig(bn=128, cluster_m=1, stages=4),
         GemmConfig(bn=192, cluster_m=1, epi_cols=64), GemmConfig(bn=192, cluster_m=2, epi_cols=64),
         GemmConfig(bn=64, cluster_m=1, epi_cols=64), GemmConfig(bn=64, cluster_m=2, epi_cols=64)]
SKINNY_SWEEP = [SkinnyConfig(), SkinnyConfig(cluster=2), SkinnyConfig(rows=128, cluster=2), SkinnyConfig(stages=6),
                SkinnyConfig(split_k=1), SkinnyConfig(cluster=2, stages=6), "dense",
                GemmConfig(bn=64, cluster_m=1, epi_cols=64), GemmConfig(bn=64, cluster_m=1, epi_cols=64, split_k=2)]


def describe(cfg) -> str:
    """A GemmConfig or SkinnyConfig in one short line (None: the automatic choice)."""
    if cfg is None:
        return "auto"
    if isinstance(cfg, SkinnyConfig):
        return (f"skinny rows{cfg.rows} c{cfg.cluster} s{cfg.stages or 'max'} k{cfg.split_k or 'auto'} "
                f"l2{cfg.l2_promotion}" + (f" mr{cfg.m_rows}" if cfg.m_rows else "")
                + (f" mh{cfg.m_halves}" if cfg.m_halves > 1 else "") + _sets(cfg))
    return (f"bn{cfg.bn} c{cfg.cluster_m} e{cfg.epi_cols} s{cfg.stages or 'max'} g{cfg.group_m} "
            f"k{cfg.split_k} l2{cfg.l2_promotion}" + (f" ck{cfg.cluster_k}" if cfg.cluster_k > 1 else "")
            + (" tail" if cfg.split_tail else "") + _sets(cfg))


def _sets(cfg) -> str:
    """fp8 promoted every k-block on two accumulator sets (promote_sets=2), else nothing."""
    return " sets2" if cfg.promote_sets > 1 else ""
