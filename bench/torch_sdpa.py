"""The peer anchor: PyTorch's CPU scaled_dot_product_attention on the shapes stria-bench uses.

Prints lines in stria-bench's key=value format. Same FLOP convention: forward 4·L²·H·D (halved when
causal), backward 2.5x the forward; backward time is (forward + backward) minus forward.
"""
import argparse
import statistics
import time

import torch
import torch.nn.functional as F


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--dim", type=int, default=128)
    ap.add_argument("--len", type=int, default=4096)
    ap.add_argument("--heads", type=int, default=8)
    ap.add_argument("--causal", type=int, default=1)
    ap.add_argument("--dtype", default="f32")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--reps", type=int, default=5)
    a = ap.parse_args()
    torch.set_num_threads(a.threads)
    dt = torch.float32 if a.dtype == "f32" else torch.bfloat16
    shape = (1, a.heads, a.len, a.dim)
    q, k, v = (torch.randn(shape, dtype=dt, requires_grad=True) for _ in range(3))
    g = torch.randn(shape, dtype=dt)
    fwd, both = [], []
    for rep in range(a.reps + 1):
        t0 = time.perf_counter()
        with torch.no_grad():
            F.scaled_dot_product_attention(q, k, v, is_causal=bool(a.causal))
        t1 = time.perf_counter()
        o = F.scaled_dot_product_attention(q, k, v, is_causal=bool(a.causal))
        o.backward(g)
        t2 = time.perf_counter()
        q.grad = k.grad = v.grad = None
        if rep:
            fwd.append(t1 - t0)
            both.append(t2 - t1)
    mf = statistics.median(fwd)
    mb = max(statistics.median(both) - mf, 1e-9)
    flops = 4.0 * a.len * a.len * a.heads * a.dim * (0.5 if a.causal else 1.0)
    print(f"kernel impl=torch dtype={a.dtype} causal={a.causal} D={a.dim} L={a.len} H={a.heads} "
          f"threads={a.threads} fwd_s={mf:.6f} bwd_s={mb:.6f} fwd_gflops={flops / mf / 1e9:.1f} "
          f"bwd_gflops={2.5 * flops / mb / 1e9:.1f} torch={torch.__version__}", flush=True)


if __name__ == "__main__":
    main()
