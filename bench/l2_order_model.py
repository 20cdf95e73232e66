#!/usr/bin/env python3
"""A model of the DRAM traffic that the order of a tile kernel's CTAs causes through L2.

The TMA forward and backward reread data across CTAs: a forward CTA (one 128-row query tile of one
head) reads every K and V tile its rows see; a backward CTA (one 128-key tile of one K/V head)
reads the Q, dO, LSE and delta rows of every 64-row query tile that sees its keys, from the last,
and adds into their float32 dQ accumulator rows. Whether a reread comes from L2 or from DRAM
depends on which CTAs run at once, which the order of the grid decides (CtaSlotAt in
kernels/cuda/tile_mask.cuh): tile-major across every head, or in groups of heads sized to half the
L2 (kernels/cuda/head_groups.cuh).

The model: SMS CTAs run at once, one per SM (the TMA kernels' occupancy); each takes one step a
tick (a forward's key tile, a backward's query tile), and a finished CTA's SM takes the next CTA in
the grid's order. L2 is one least-recently-used store of whole tiles (no sets, no partitions, no
other traffic), dQ tiles dirty once added into, written back when evicted or at the end. DRAM
bytes = the misses' bytes + the write-backs + the streams that pass once (Q read and O written by
a forward, K and V read and dK and dV written by a backward). It leaves out the hardware's
replacement policy and the two L2 partitions, so read its figures as a comparison between orders,
checked against one measured point (docs/performance.md, "Heads in groups": the H200 profile of
causal D 128 at 4k tokens and 64 heads).

Usage: l2_order_model.py [--len 4096] [--heads 64] [--dim 128] [--causal 1] [--sms 132]
                         [--l2-mb 50] [--pass fwd|bwd|both]
Prints one line per (pass, order): key=value pairs, the DRAM bytes in GB.
"""
import argparse
import collections
import sys


def slots(tiles, heads, group):
    """CtaSlotAt's order: (tile, head) of the CTA that starts n-th, heads in groups of `group`."""
    if group == 0 or group >= heads:
        group = heads
    for first in range(0, heads, group):
        n = min(group, heads - first)
        for t in range(tiles):
            for h in range(n):
                yield t, first + h


def head_group(head_bytes, heads, budget):
    """HeadGroupOf: as many heads as fit the budget, at least one; 0 where all fit."""
    if budget <= 0 or head_bytes <= 0 or heads <= 1:
        return 0
    fit = budget // head_bytes
    return 0 if fit >= heads else max(1, fit)


class Lru:
    def __init__(self, capacity):
        self.capacity, self.used, self.lines = capacity, 0, collections.OrderedDict()
        self.miss_bytes = self.writeback_bytes = 0

    def touch(self, key, size, dirty=False):
        line = self.lines.get(key)
        if line is not None:
            self.lines.move_to_end(key)
            if dirty:
                self.lines[key] = (size, True)
            return
        # A dQ tile's first add allocates without a read (the accumulator starts as zeros written
        # by the call's clearing pass, itself a write-back, counted as one below).
        if not (dirty and key not in self.seen_dirty):
            self.miss_bytes += size
        if dirty:
            self.seen_dirty.add(key)
        self.lines[key] = (size, dirty)
        self.used += size
        while self.used > self.capacity:
            _, (s, d) = self.lines.popitem(last=False)
            self.used -= s
            if d:
                self.writeback_bytes += s

    def flush(self):
        for s, d in self.lines.values():
            if d:
                self.writeback_bytes += s


def run(ctas, sms, cache):
    """ctas: the grid's CTAs in start order, each a list of steps, each step a list of (key, bytes,
    dirty). Runs SMS of them at once, a step a tick each."""
    pending = iter(ctas)
    running = []
    for _ in range(sms):
        c = next(pending, None)
        if c is not None:
            running.append(iter(c))
    while running:
        nxt = []
        for it in running:
            step = next(it, None)
            while step is None:  # this CTA is done: its SM takes the next one
                c = next(pending, None)
                if c is None:
                    break
                it = iter(c)
                step = next(it, None)
            if step is None:
                continue
            for key, size, dirty in step:
                cache.touch(key, size, dirty)
            nxt.append(it)
        running = nxt
    cache.flush()


def forward(L, heads, D, causal, group):
    """A forward's CTAs in the grid's order: query tiles of 128 from the last (QueryTileStart)."""
    tiles, kv = L // 128, 128 * D * 2
    out = []
    for t, h in slots(tiles, heads, group):
        q = tiles - 1 - t
        last = q if causal else tiles - 1
        out.append([[(("k", h, j), kv, False), (("v", h, j), kv, False)] for j in range(last + 1)])
    return out


def backward(L, heads, D, causal, group):
    """A backward's CTAs: key tiles of 128, each walking its 64-row query tiles from the last."""
    tiles, qt = L // 128, L // 64
    q_bytes, dq_bytes, rows = 64 * D * 2, 64 * D * 4, 64 * 8
    out = []
    for t, h in slots(tiles, heads, group):
        first = 2 * t if causal else 0
        out.append([[(("q", h, m), q_bytes, False), (("do", h, m), q_bytes, False), (("ld", h, m), rows, False),
                     (("dq", h, m), dq_bytes, True)] for m in range(qt - 1, first - 1, -1)])
    return out


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--len", type=int, default=4096)
    ap.add_argument("--heads", type=int, default=64, help="batch rows times heads (Hq = Hkv)")
    ap.add_argument("--dim", type=int, default=128)
    ap.add_argument("--causal", type=int, default=1)
    ap.add_argument("--sms", type=int, default=132)
    ap.add_argument("--l2-mb", type=float, default=50)
    ap.add_argument("--pass", dest="which", choices=("fwd", "bwd", "both"), default="both")
    a = ap.parse_args(argv)
    if a.len % 128 or a.len <= 0 or a.heads <= 0 or a.dim <= 0:
        ap.error("--len must be a positive multiple of 128, --heads and --dim positive")
    L, H, D = a.len, a.heads, a.dim
    l2 = int(a.l2_mb * (1 << 20))
    tensor = L * H * D * 2
    passes = {
        # pass: (CTAs, each head's working set as head_groups.cuh counts it, the streams read or
        # written once: Q in and O out; K, V in and dK, dV out)
        "fwd": (forward, 2 * L * D * 2, 2 * tensor),
        "bwd": (backward, L * (D * 8 + 8), 4 * tensor),
    }
    for name in (("fwd", "bwd") if a.which == "both" else (a.which,)):
        make, head_bytes, once = passes[name]
        group = head_group(head_bytes, H, l2 // 2)
        for order, g in (("every_head", 0), ("head_groups", group)):
            cache = Lru(l2)
            cache.seen_dirty = set()
            run(make(L, H, D, bool(a.causal), g), a.sms, cache)
            total = cache.miss_bytes + cache.writeback_bytes + once
            print(f"l2_order pass={name} order={order} group={g if g else H} len={L} heads={H} dim={D} "
                  f"causal={a.causal} sms={a.sms} l2_mb={a.l2_mb:g} dram_gb={total / 1e9:.3f} "
                  f"miss_gb={cache.miss_bytes / 1e9:.3f} writeback_gb={cache.writeback_bytes / 1e9:.3f} "
                  f"once_gb={once / 1e9:.3f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
