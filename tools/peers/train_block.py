"""A 2-layer transformer (pre-norm, causal, GQA) trained for 100 steps three times from the same
initial weights on the same batches: attention by torch SDPA's cuDNN backend, by its flash
backend, and by ``torch.ops.tmaflow.attention`` (forward and backward through autograd). The two
SDPA runs differ only by their kernels' rounding, so their gap is the run's bf16 noise; tmaflow
passes when its losses stay as close to cuDNN's as flash's do (within 2x that gap, or 0.02) and
the loss falls (by 15% at least: the runs compare real training).

    PYTHONPATH=. python3 tools/peers/train_block.py [--steps 100] [--seq 1024] [--batch 8]
        [--dim 1024] [--heads 8] [--kv-heads 2] [--compile] [--json FILE]
"""
from __future__ import annotations

import argparse
import math
import sys
import time

from tmaflow import bench

WARMUP_STEPS = 5  # steps left out of ms / step
COLUMNS = ["run", "first loss", "last loss", "max |loss - cudnn|", "mean |loss - cudnn|", "ms / step"]


def build(torch, args, attend):
    """The model: embedding, 2 x (RMSNorm, GQA attention without positions, RMSNorm, SwiGLU MLP),
    a tied output head; bf16 weights; ``attend(q, k, v)`` on (batch, heads, seq, head_dim)."""
    nn, F = torch.nn, torch.nn.functional
    hd = args.dim // args.heads

    class Block(nn.Module):
        def __init__(self):
            super().__init__()
            self.n1, self.n2 = nn.RMSNorm(args.dim), nn.RMSNorm(args.dim)
            self.qkv = nn.Linear(args.dim, (args.heads + 2 * args.kv_heads) * hd, bias=False)
            self.o = nn.Linear(args.dim, args.dim, bias=False)
            self.up = nn.Linear(args.dim, 2 * 4 * args.dim, bias=False)
            self.down = nn.Linear(4 * args.dim, args.dim, bias=False)

        def forward(self, x):
            b, s, _ = x.shape
            q, k, v = self.qkv(self.n1(x)).split([args.heads * hd, args.kv_heads * hd, args.kv_heads * hd], -1)
            q = q.view(b, s, args.heads, hd).transpose(1, 2)
            k = k.view(b, s, args.kv_heads, hd).transpose(1, 2)
            v = v.view(b, s, args.kv_heads, hd).transpose(1, 2)
            a = attend(q.contiguous(), k.contiguous(), v.contiguous())
            x = x + self.o(a.transpose(1, 2).reshape(b, s, args.dim))
            g, u = self.up(self.n2(x)).chunk(2, -1)
            return x + self.down(F.silu(g) * u)

    class Model(nn.Module):
        def __init__(self):
            super().__init__()
            self.emb = nn.Embedding(args.vocab, args.dim)
            self.pos = nn.Embedding(args.seq, args.dim)
            for e in (self.emb, self.pos):
                nn.init.normal_(e.weight, std=0.02)  # the token table is the head too: logits start near 0
            self.blocks = nn.ModuleList(Block() for _ in range(2))
            self.norm = nn.RMSNorm(args.dim)

        def forward(self, tokens):
            x = self.emb(tokens) + self.pos.weight[:tokens.shape[1]]
            for blk in self.blocks:
                x = blk(x)
            return self.norm(x) @ self.emb.weight.t()

    torch.manual_seed(args.seed)
    return Model().to("cuda", torch.bfloat16)


def batches(torch, args):
    """Learnable synthetic text: each token is followed by its image under one fixed random
    permutation of the vocabulary, a tenth of them replaced by noise, so a model's loss falls
    from about ln(vocab) within 100 steps (every run sees the same batches)."""
    g = torch.Generator(device="cpu").manual_seed(args.seed + 1)
    follow = torch.randperm(args.vocab, generator=g)
    out = []
    for _ in range(args.steps):
        seq = torch.empty(args.batch, args.seq + 1, dtype=torch.long)
        seq[:, 0] = torch.randint(0, args.vocab, (args.batch,), generator=g)
        for t in range(1, args.seq + 1):
            seq[:, t] = follow[seq[:, t - 1]]
        noise = torch.rand(seq.shape, generator=g) < 0.1
        seq = torch.where(noise, torch.randint(0, args.vocab, seq.shape, generator=g), seq)
        out.append(seq.cuda() if torch.cuda.is_available() else seq)
    return out


def train(torch, args, attend, data) -> tuple[list[float], float]:
    model = build(torch, args, attend)
    step_fn = model
    if args.compile:
        step_fn = torch.compile(model, fullgraph=True)
    opt = torch.optim.AdamW(model.parameters(), lr=args.lr, betas=(0.9, 0.95), weight_decay=0.0)
    losses, start = [], None
    for step, seq in enumerate(data):
        if step == WARMUP_STEPS:  # compiles, cuDNN plans and allocations stay out of the time
            torch.cuda.synchronize()
            start = time.perf_counter()
        logits = step_fn(seq[:, :-1])
        loss = torch.nn.functional.cross_entropy(logits.float().reshape(-1, args.vocab), seq[:, 1:].reshape(-1))
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        losses.append(loss.item())
    torch.cuda.synchronize()
    timed = len(data) - WARMUP_STEPS
    return losses, (time.perf_counter() - start) * 1e3 / timed if start is not None and timed else float("nan")


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--steps", type=int, default=100)
    p.add_argument("--seq", type=int, default=1024)
    p.add_argument("--batch", type=int, default=8)
    p.add_argument("--dim", type=int, default=1024)
    p.add_argument("--heads", type=int, default=8)
    p.add_argument("--kv-heads", type=int, default=2)
    p.add_argument("--vocab", type=int, default=4096)
    p.add_argument("--lr", type=float, default=3e-3)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--compile", action="store_true", help="torch.compile(fullgraph=True) each model")
    p.add_argument("--json", help="write a bench record (bench/results/attention_training.json)")
    args = p.parse_args()
    import torch  # optional dependency, before the driver is touched: --help works without it
    from torch.nn.attention import SDPBackend, sdpa_kernel

    import tmaflow.torch  # noqa: F401  (registers torch.ops.tmaflow)

    F = torch.nn.functional
    group = args.heads // args.kv_heads

    def sdpa(backend):
        def attend(q, k, v):
            with sdpa_kernel([backend]):
                return F.scaled_dot_product_attention(q, k.repeat_interleave(group, 1),
                                                      v.repeat_interleave(group, 1), is_causal=True)
        return attend

    runs = {"sdpa cudnn": sdpa(SDPBackend.CUDNN_ATTENTION), "sdpa flash": sdpa(SDPBackend.FLASH_ATTENTION),
            # the op kernels.attention takes under autograd: the forward saves its log-sum-exp
            "tmaflow": lambda q, k, v: torch.ops.tmaflow.attention_lse(q, k, v, True)[0]}
    data = batches(torch, args)
    results = {name: train(torch, args, attend, data) for name, attend in runs.items()}
    ref = results["sdpa cudnn"][0]
    rows = []
    for name, (losses, ms) in results.items():
        gaps = [abs(a - b) for a, b in zip(losses, ref)]
        rows.append({"run": name, "first loss": round(losses[0], 4), "last loss": round(losses[-1], 4),
                     "max |loss - cudnn|": round(max(gaps), 5), "mean |loss - cudnn|": round(sum(gaps) / len(gaps), 5),
                     "ms / step": round(ms, 2)})
    noise = rows[1]["max |loss - cudnn|"]
    bound = max(2 * noise, 0.02)
    tracks = rows[2]["max |loss - cudnn|"] <= bound
    learns = rows[2]["last loss"] < 0.85 * rows[2]["first loss"]  # the runs compare real training
    ok = tracks and learns and all(math.isfinite(r["last loss"]) for r in rows)
    print("  ".join(f"{c:>18s}" for c in COLUMNS))
    for r in rows:
        print("  ".join(f"{r[c]!s:>18s}" for c in COLUMNS))
    print(f"noise (flash vs cudnn) {noise:.5f}; bound {bound:.5f}; tmaflow {'tracks' if tracks else 'DOES NOT track'} "
          f"SDPA over {args.steps} steps; its loss {'falls' if learns else 'does not fall'} from "
          f"{rows[2]['first loss']} to {rows[2]['last loss']}")
    if args.json:
        bench.records.write(args.json, "attention_training", "2-layer transformer trained with each attention",
                            COLUMNS, rows, noise=noise, bound=bound, tracks=tracks, learns=learns,
                            losses={name: r[0] for name, r in results.items()})
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
