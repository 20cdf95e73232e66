"""One rank of a ring of processes joined through torch.distributed, for test_torch.py: the
ranks form a gloo process group at 127.0.0.1:PORT, get their stria contexts from it
(stria.torch.context_from_group: the unique id travels over the group, UCX carries the blocks),
and compute ring attention and the gradients of sum(out * w) on their shards of one random
sequence; each writes what it got to OUT.rank<R>.npz for the test to check.

    python torch_ring.py N LAYOUT OUT.npz RANK PORT
"""

from __future__ import annotations

import sys

import numpy as np
from reference import random_inputs

SHAPE = (2, 36, 4, 2, 16)  # batch, seq, query heads, K/V heads, head dim
SEED = 11
TIMEOUT_S = 60.0


def full_inputs():
    """q, k, v and the output weights w of the whole sequence, float32 [B, S, H, D]."""
    return random_inputs(*SHAPE, SEED)


def main(argv: list[str]) -> None:
    n, layout, path, rank, port = int(argv[0]), argv[1], argv[2], int(argv[3]), int(argv[4])
    import datetime

    import stria
    import stria.torch as st
    import torch
    import torch.distributed as dist

    dist.init_process_group(
        "gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=n,
        timeout=datetime.timedelta(seconds=TIMEOUT_S),
    )
    try:
        with st.context_from_group(timeout_s=TIMEOUT_S, num_threads=1) as ctx:
            assert (ctx.rank, ctx.world_size) == (rank, n)
            q, k, v, w = (torch.from_numpy(stria.shard(x, n, rank, layout=layout)) for x in full_inputs())
            q, k, v = (x.requires_grad_() for x in (q, k, v))
            out = st.ring_attention(q, k, v, ctx, layout=layout, causal=True)
            dq, dk, dv = torch.autograd.grad((out * w).sum(), (q, k, v))
        np.savez(path.replace(".npz", f".rank{rank}.npz"),
                 **{f"{name}{rank}": x.detach().numpy() for name, x in
                    (("out", out), ("dq", dq), ("dk", dk), ("dv", dv))})
    finally:
        dist.destroy_process_group()


if __name__ == "__main__":
    main(sys.argv[1:])
