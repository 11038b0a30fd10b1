"""Error of kernels.attention and of torch's SDPA backends against a float32 reference, on the
benchmark's head-dim-128 shape at 4k (one batch): bf16 P and outputs put every implementation
near 1e-3 relative, so the benchmark's error against cuDNN shows tiling differences, not faults.

    PYTHONPATH=. python3 tools/experiments/attention_accuracy.py
"""
import torch  # before the driver is touched
from torch.nn.attention import SDPBackend, sdpa_kernel

from tmaflow import kernels


def rel(x, ref):
    return (torch.linalg.norm(x.float() - ref) / torch.linalg.norm(ref)).item()


def main():
    torch.manual_seed(0)
    for d, seq, heads in ((128, 4096, 16), (64, 4096, 32), (256, 4096, 8)):
        q, k, v = (torch.randn(1, heads, seq, d, device="cuda", dtype=torch.bfloat16) for _ in range(3))
        for causal in (False, True):
            with sdpa_kernel(SDPBackend.MATH):
                ref = torch.nn.functional.scaled_dot_product_attention(q.float(), k.float(), v.float(), is_causal=causal)
            errs = {"tmaflow": rel(kernels.attention(q, k, v, causal=causal), ref)}
            for name, backend in (("cudnn", SDPBackend.CUDNN_ATTENTION), ("flash", SDPBackend.FLASH_ATTENTION)):
                with sdpa_kernel(backend):
                    errs[name] = rel(torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=causal), ref)
            print(f"d{d} seq {seq} {'causal' if causal else 'full  '} relative error against float32: "
                  + "  ".join(f"{n} {e:.2e}" for n, e in errs.items()), flush=True)


if __name__ == "__main__":
    main()
