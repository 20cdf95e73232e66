#!/usr/bin/env python3
"""A model of one hybrid-parallel attention call's time, and which all-to-all group size U to pick.

N = U x R ranks: U consecutive ranks form an all-to-all group, R such groups form a ring.
Forward: an all-to-all of Q, K, V inside each group (sequence shards -> head shards), the striped
ring over the R groups on those heads, an all-to-all of out and LSE back. Backward: an all-to-all
of q, k, v, out, dout, lse; the ring backward (K/V blocks travel, and the float32 dK/dV partials
one hop behind them); an all-to-all of dq, dk, dv back. U = 1 is the plain ring, U = N pure
Ulysses. The equations are in docs/performance.md, "Hybrid grid".

Usage:
  hybrid_model.py [options]            every U that divides N (invalid ones listed as invalid)
  hybrid_model.py --u 8 [options]      one U
  hybrid_model.py --table              the markdown table for common GPU machines
  add --json for a machine-readable answer.

Every parameter is an option, so the same model describes a CPU machine too, for example two
processes on one host over UCX:
  hybrid_model.py --nodes 1 --ranks-per-node 2 --tokens-per-rank 4096 --hq 2 --hkv 2 --dtype-bytes 4 \\
      --rate-unit gflops --fwd-rates 60 --bwd-rates 40 --intra-gbs 3 --intra-latency-us 20

Exit status: 0 when at least one U is valid, 1 when none is, 2 on bad options.
"""
import argparse
import bisect
import json
import math
import sys

# ---------------------------------------------------------------------------------------------
# Defaults and where they come from
# ---------------------------------------------------------------------------------------------

# The kernels' throughput, TFLOP/s against the sequence length a call sees (tokens), bf16, on an
# NVIDIA H200: the TMA family (the library's default on compute capability 9.0, and the fastest of
# its families on every shape) from docs/performance.md, "Kernels beside PyTorch's flash and cuDNN
# backends (TFLOP/s, median of 10)", forward and backward tables, run of 2026-11-28. Those shapes
# have B*S = 16k tokens and H*D = 2048. A striped causal ring step is a causal L x L block on the
# block's local indices, so the causal rows at S = L stand for it; a non-causal step is a dense
# L x L block, the non-causal rows. Keyed by (D, causal, pass).
H200_TMA_TFLOPS = {
    (128, True, "fwd"): [(1024, 256), (2048, 362), (4096, 470), (8192, 534), (16384, 615), (32768, 654)],
    (128, True, "bwd"): [(1024, 173), (2048, 228), (4096, 276), (8192, 304), (16384, 337), (32768, 350)],
    (128, False, "fwd"): [(1024, 390), (2048, 477), (4096, 550), (8192, 599), (16384, 626), (32768, 600)],
    (128, False, "bwd"): [(1024, 240), (2048, 285), (4096, 315), (8192, 328), (16384, 339), (32768, 346)],
    (64, True, "fwd"): [(1024, 190), (2048, 262), (4096, 320), (8192, 362), (16384, 393), (32768, 411)],
    (64, True, "bwd"): [(1024, 144), (2048, 193), (4096, 231), (8192, 258), (16384, 280), (32768, 290)],
    (64, False, "fwd"): [(1024, 284), (2048, 337), (4096, 371), (8192, 390), (16384, 403), (32768, 417)],
    (64, False, "bwd"): [(1024, 203), (2048, 239), (4096, 262), (8192, 275), (16384, 282), (32768, 291)],
}

# Links, per GPU and per direction, nominal: NVLink 4 on H100/H200 gives each GPU 450 GB/s each way
# through the NVSwitch; a 400 Gb/s InfiniBand NIC per GPU (rail-optimised nodes) gives 50 GB/s.
# These are the same nominal figures docs/performance.md's "When a ring step's transfer hides
# behind its compute" section sets against the measured kernels. NCCL reaches a fraction of them;
# pass the measured figure where one exists.
DEFAULT_INTRA_GBS = 450.0
DEFAULT_INTER_GBS = 50.0
# Per-message latency: assumed, of the order of NCCL's small-message latency on each link (a few
# microseconds); not measured by this project.
DEFAULT_INTRA_LATENCY_US = 3.0
DEFAULT_INTER_LATENCY_US = 5.0
# A ring step's fixed cost beyond max(compute, transfer): the step's launches and the event
# hand-offs between the compute and transfer streams. Assumed; for scale, the H200's measured
# host latency per call is 0.006-0.027 ms (docs/performance.md, "Where a call's time goes now").
DEFAULT_STEP_COST_US = 10.0

# Bytes of the float32 tensors whatever the dtype: the LSE, and the dK/dV partials the ring
# backward passes on (they travel in float32 so that error does not grow with the rank count).
F32 = 4
# Backward FLOPs over forward FLOPs: 5 matmuls against 2, the usual convention (the H200 tables use it).
BACKWARD_FLOP_FACTOR = 2.5

# The --table grid: common machines of 8 GPUs per node with the default links and rates.
TABLE_NODES = (2, 4, 8, 16, 32, 64)
TABLE_TOKENS = (4096, 16384, 65536)
TABLE_SHAPE = dict(hq=32, hkv=8, dim=128, causal=True, dtype_bytes=2, batch=1, direction="both")


# ---------------------------------------------------------------------------------------------
# Kernel rates
# ---------------------------------------------------------------------------------------------

class RateCurve:
    """FLOP/s against block length, piecewise linear in log(tokens).

    Outside the measured range the end value holds: below the shortest block that is optimistic
    (fixed costs weigh more on short blocks), above the longest it is what long blocks approach.
    """

    def __init__(self, points, source):
        self.points = sorted((float(t), float(r)) for t, r in points)
        self.source = source

    def at(self, tokens):
        pts = self.points
        if len(pts) == 1 or tokens <= pts[0][0]:
            return pts[0][1]
        if tokens >= pts[-1][0]:
            return pts[-1][1]
        i = bisect.bisect_right([t for t, _ in pts], tokens)
        (t0, r0), (t1, r1) = pts[i - 1], pts[i]
        w = (math.log(tokens) - math.log(t0)) / (math.log(t1) - math.log(t0))
        return r0 + w * (r1 - r0)


def default_rate_curve(dim, causal, pass_):
    """The H200 TMA table for the nearest measured head dim (64 or 128)."""
    table_dim = 64 if dim <= 96 else 128
    pts = [(t, tf * 1e12) for t, tf in H200_TMA_TFLOPS[(table_dim, causal, pass_)]]
    note = "" if table_dim == dim else f" (D {dim} not measured: D {table_dim}'s rates)"
    return RateCurve(pts, f"H200 TMA {pass_}, D {table_dim}, {'causal' if causal else 'dense'}{note}")


def parse_rate_curve(text, unit_flops, label):
    """'470' (one rate for every block) or '1024:256,4096:470' (tokens:rate pairs)."""
    points = []
    for item in text.split(","):
        item = item.strip()
        if ":" in item:
            t, r = item.split(":", 1)
            points.append((float(t), float(r) * unit_flops))
        else:
            points.append((1.0, float(item) * unit_flops))
    if not points or any(t <= 0 or r <= 0 for t, r in points):
        raise ValueError(f"bad rates {text!r}")
    return RateCurve(points, f"{label} given: {text}")


# ---------------------------------------------------------------------------------------------
# The configuration
# ---------------------------------------------------------------------------------------------

class Machine:
    def __init__(self, nodes, gpus_per_node, intra_gbs=DEFAULT_INTRA_GBS, inter_gbs=DEFAULT_INTER_GBS,
                 intra_latency_us=DEFAULT_INTRA_LATENCY_US, inter_latency_us=DEFAULT_INTER_LATENCY_US,
                 step_cost_us=DEFAULT_STEP_COST_US, fwd_rate=None, bwd_rate=None):
        self.nodes = nodes
        self.gpus_per_node = gpus_per_node
        self.intra_bw = intra_gbs * 1e9
        self.inter_bw = inter_gbs * 1e9
        self.intra_latency = intra_latency_us * 1e-6
        self.inter_latency = inter_latency_us * 1e-6
        self.step_cost = step_cost_us * 1e-6
        self.fwd_rate = fwd_rate
        self.bwd_rate = bwd_rate

    @property
    def ranks(self):
        return self.nodes * self.gpus_per_node

    def node_of(self, rank):
        return rank // self.gpus_per_node


class Problem:
    def __init__(self, tokens_per_gpu, hq, hkv, dim, causal=True, dtype_bytes=2, batch=1, direction="both"):
        self.tokens_per_gpu = tokens_per_gpu
        self.hq = hq
        self.hkv = hkv
        self.dim = dim
        self.causal = causal
        self.dtype_bytes = dtype_bytes
        self.batch = batch
        self.direction = direction

    def passes(self):
        return {"forward": ["fwd"], "backward": ["bwd"], "both": ["fwd", "bwd"]}[self.direction]


# ---------------------------------------------------------------------------------------------
# Head split
# ---------------------------------------------------------------------------------------------

def u_invalid_reason(problem, n, u):
    """Why U cannot be used on N ranks with these heads, or None when it can."""
    if n % u:
        return f"U {u} does not divide N {n}"
    if problem.hq % u:
        return f"Hq {problem.hq} is not a multiple of U {u}"
    if problem.hkv % u and u % problem.hkv:
        return f"neither Hkv {problem.hkv} % U {u} nor U % Hkv is 0"
    return None


def kv_heads_per_member(hkv, u):
    # Split: each member owns Hkv/U K/V heads. Shared (Hkv < U): each member holds the one head its
    # query heads read, and U/Hkv members hold the same head.
    return hkv // u if hkv % u == 0 else 1


def kv_heads_exchanged(hkv, u):
    # What the K/V all-to-all moves, in heads' worth of the shard: Hkv when split; U when shared,
    # since every member must receive its head from every other member, duplicates included.
    return hkv if hkv % u == 0 else u


# ---------------------------------------------------------------------------------------------
# All-to-all
# ---------------------------------------------------------------------------------------------

def a2a_shard_bytes(problem, u):
    """Bytes of each tensor a rank holds before each all-to-all phase, by phase.

    Sequence-sharded and head-sharded forms hold the same bytes (T tokens x all heads, or
    U*T tokens x 1/U of the heads), so one shard size serves both directions of a phase.
    """
    t = problem.batch * problem.tokens_per_gpu
    e = problem.dtype_bytes
    d = problem.dim
    q = t * problem.hq * d * e
    kv = t * kv_heads_exchanged(problem.hkv, u) * d * e
    lse = t * problem.hq * F32
    # dK/dV go back in the caller's dtype, like K/V came: split heads are complete at their member;
    # a shared head's U/Hkv partials are each sent to the destination and summed there (in float32
    # arithmetic, as the engine's grid does), so the volume is K/V's again.
    dkv = kv
    return {
        "fwd_in": {"q": q, "k": kv, "v": kv},
        "fwd_out": {"out": q, "lse": lse},
        "bwd_in": {"q": q, "k": kv, "v": kv, "out": q, "dout": q, "lse": lse},
        "bwd_out": {"dq": q, "dk": dkv, "dv": dkv},
    }


def a2a_peers_by_link(machine, u, rank):
    """(peers on this rank's node, peers on other nodes) within its all-to-all group."""
    g0 = (rank // u) * u
    node = machine.node_of(rank)
    n0 = node * machine.gpus_per_node
    same_node = max(0, min(g0 + u, n0 + machine.gpus_per_node) - max(g0, n0)) - 1
    return same_node, (u - 1) - same_node


def a2a_time(machine, u, shard_bytes, chunks=1):
    """Time of one all-to-all phase (its tensors sent as one exchange), on the slowest rank.

    Each rank sends 1/U of each shard to each of the U-1 other members: (U-1)/U of it. The part
    that stays on the node goes over NVLink, the part that leaves it over the rank's own NIC share;
    the two links run at once, so the slower bounds the phase. One latency per exchange: the
    messages to all peers are in flight together. With chunks, this is one chunk's exchange.
    """
    if u == 1:
        return 0.0
    total = sum(shard_bytes.values()) / chunks
    worst = 0.0
    for rank in range(machine.ranks):
        same, other = a2a_peers_by_link(machine, u, rank)
        t_intra = (machine.intra_latency + total * same / u / machine.intra_bw) if same else 0.0
        t_inter = (machine.inter_latency + total * other / u / machine.inter_bw) if other else 0.0
        worst = max(worst, t_intra, t_inter)
    return worst


# ---------------------------------------------------------------------------------------------
# Ring
# ---------------------------------------------------------------------------------------------

def ring_successor(u, r, rank):
    # Rank (g, u_i) = g*U + u_i sends to (g+1 mod R, u_i): the same member of the next group.
    g, member = divmod(rank, u)
    return ((g + 1) % r) * u + member


def ring_slowest_hop(machine, u):
    """(bandwidth, latency, link name) of the slowest hop between ring neighbours, or None (R = 1).

    Steps are in lockstep, so the slowest hop bounds every step. Each GPU sends on its own links
    (its NVLink share, its own NIC), so hops that run at once do not divide a link.
    """
    r = machine.ranks // u
    if r == 1:
        return None
    links = set()
    for rank in range(machine.ranks):
        if machine.node_of(rank) == machine.node_of(ring_successor(u, r, rank)):
            links.add((machine.intra_bw, -machine.intra_latency, "intra-node"))
        else:
            links.add((machine.inter_bw, -machine.inter_latency, "inter-node"))
    bw, neg_latency, name = min(links)  # the lowest bandwidth; on a tie, the higher latency
    return bw, -neg_latency, name


def step_pairs(block, step, causal):
    # Striped causal: each step is a causal L x L block on local indices, half a block pair; step 0
    # (the rank's own block) keeps the diagonal, L(L+1)/2. Non-causal: the whole block pair.
    if not causal:
        return block * block
    return block * (block + 1) / 2 if step == 0 else block * block / 2


def ring_time(problem, machine, u, pass_, chunks=1):
    """The ring over R groups for one pass (one chunk of 1/chunks of the heads when chunked).

    A step costs max(compute, transfer) + the fixed step cost. Forward: K/V of the next block
    travel during steps 0..R-2. Backward: K/V as in the forward, and the dK/dV partial of the
    block being computed arrives from the predecessor during the step (one hop behind; the owner
    keeps its own contribution home, so partials travel from step 2 on); after the last step the
    complete partial goes home to its owner, a transfer nothing hides.
    Returns (seconds, compute seconds, kv bytes per step, dkv bytes per step).
    """
    r = machine.ranks // u
    block = problem.tokens_per_gpu * u  # tokens of one ring block: the group's S/R
    hq_m = problem.hq // u / chunks
    hkv_m = kv_heads_per_member(problem.hkv, u) / chunks
    per_pair = 4 * problem.batch * hq_m * problem.dim
    rate = (machine.fwd_rate if pass_ == "fwd" else machine.bwd_rate).at(block)
    if pass_ == "bwd":
        per_pair *= BACKWARD_FLOP_FACTOR
    kv_bytes = 2 * problem.batch * block * hkv_m * problem.dim * problem.dtype_bytes
    dkv_bytes = 2 * problem.batch * block * hkv_m * problem.dim * F32 if pass_ == "bwd" else 0
    hop = ring_slowest_hop(machine, u)
    total = compute = 0.0
    for step in range(r):
        c = step_pairs(block, step, problem.causal) * per_pair / rate
        moving = (kv_bytes if step < r - 1 else 0) + (dkv_bytes if step >= 2 else 0)
        x = hop[1] + moving / hop[0] if moving else 0.0
        total += max(c, x) + machine.step_cost
        compute += c
    if dkv_bytes and r > 1:
        total += hop[1] + dkv_bytes / hop[0]
    return total, compute, kv_bytes, dkv_bytes


# ---------------------------------------------------------------------------------------------
# The call
# ---------------------------------------------------------------------------------------------

def compute_alone(problem, machine, u, pass_):
    """The same work on N GPUs with no communication: total FLOPs / N at the rate of this U's block."""
    s = problem.tokens_per_gpu * machine.ranks
    flops = 4 * problem.batch * s * s * problem.hq * problem.dim * (0.5 if problem.causal else 1.0)
    rate = machine.fwd_rate
    if pass_ == "bwd":
        flops *= BACKWARD_FLOP_FACTOR
        rate = machine.bwd_rate
    return flops / machine.ranks / rate.at(problem.tokens_per_gpu * u)


def usable_chunks(problem, u, requested):
    """Head chunks for overlapping the all-to-alls with the ring: whole K/V heads with their query
    heads, so a chunk's ring moves only its own K/V; the largest divisor of the member's K/V heads
    not above the request (1 when heads are shared: the one K/V head cannot be cut; 1 for U = 1,
    which has no all-to-all to hide)."""
    if u == 1:
        return 1
    hkv_m = kv_heads_per_member(problem.hkv, u)
    return max(c for c in range(1, min(requested, hkv_m) + 1) if hkv_m % c == 0)


def pipelined(stage_times, items):
    """Makespan of `items` identical items through stages in order, one item per stage at a time
    (flow shop): finish[i][j] = max(finish[i-1][j], finish[i][j-1]) + t[j]."""
    finish = [0.0] * len(stage_times)
    for _ in range(items):
        prev = 0.0
        for j, t in enumerate(stage_times):
            prev = finish[j] = max(finish[j], prev) + t
    return finish[-1]


def pass_times(problem, machine, u, pass_, chunks):
    """One pass's all-to-all, ring and wall time, with the all-to-alls in head chunks overlapping
    the ring when chunks > 1 (chunk i's all-to-all in runs while chunk i-1's ring does)."""
    shards = a2a_shard_bytes(problem, u)
    a_in = a2a_time(machine, u, shards[pass_ + "_in"])
    a_out = a2a_time(machine, u, shards[pass_ + "_out"])
    ring, ring_compute, kv_bytes, dkv_bytes = ring_time(problem, machine, u, pass_)
    wall = a_in + ring + a_out
    if chunks > 1:
        stages = [a2a_time(machine, u, shards[pass_ + "_in"], chunks), ring_time(problem, machine, u, pass_, chunks)[0],
                  a2a_time(machine, u, shards[pass_ + "_out"], chunks)]
        wall = pipelined(stages, chunks)
    return {
        "a2a_s": a_in + a_out, "ring_s": ring, "ring_compute_s": ring_compute, "wall_s": wall,
        "compute_s": compute_alone(problem, machine, u, pass_),
        "a2a_bytes_in": (u - 1) * sum(shards[pass_ + "_in"].values()) / u,
        "a2a_bytes_out": (u - 1) * sum(shards[pass_ + "_out"].values()) / u,
        "ring_kv_bytes_per_step": kv_bytes if machine.ranks // u > 1 else 0,
        "ring_dkv_bytes_per_step": dkv_bytes if machine.ranks // u > 1 else 0,
    }


def evaluate(problem, machine, u, chunks=1):
    """Everything the model says about one U (or why it is invalid)."""
    n = machine.ranks
    reason = u_invalid_reason(problem, n, u)
    row = {"u": u, "r": n // u if n % u == 0 else None, "valid": reason is None, "reason": reason}
    if reason:
        return row
    hop = ring_slowest_hop(machine, u)
    c = usable_chunks(problem, u, chunks)
    row.update(block_tokens=problem.tokens_per_gpu * u, kv_heads_per_member=kv_heads_per_member(problem.hkv, u),
               kv_heads_exchanged=kv_heads_exchanged(problem.hkv, u), ring_link=hop[2] if hop else None,
               a2a_link="none" if u == 1 else ("intra-node" if all(
                   a2a_peers_by_link(machine, u, k)[1] == 0 for k in range(n)) else "crosses nodes"),
               chunks=c, passes={})
    for p in problem.passes():
        row["passes"][p] = pass_times(problem, machine, u, p, c)
    for key in ("compute_s", "a2a_s", "ring_s"):
        row[key] = sum(v[key] for v in row["passes"].values())
    row["total_s"] = row["a2a_s"] + row["ring_s"]
    row["ratio"] = row["total_s"] / row["compute_s"]
    if c > 1:
        row["total_overlap_s"] = sum(v["wall_s"] for v in row["passes"].values())
        row["ratio_overlap"] = row["total_overlap_s"] / row["compute_s"]
    return row


def evaluate_all(problem, machine, us=None, chunks=1):
    """Rows for the given U (every divisor of N when None), the best valid one marked."""
    n = machine.ranks
    us = us or [d for d in range(1, n + 1) if n % d == 0]
    rows = [evaluate(problem, machine, u, chunks) for u in us]
    valid = [row for row in rows if row["valid"]]
    key = "total_overlap_s" if chunks > 1 else "total_s"
    best = min(valid, key=lambda row: row.get(key, row["total_s"])) if valid else None
    for row in rows:
        row["best"] = row is best
    return rows, (best["u"] if best else None)


# ---------------------------------------------------------------------------------------------
# Output
# ---------------------------------------------------------------------------------------------

def ms(seconds):
    return f"{seconds * 1e3:.3f}"


def print_rows(problem, machine, rows, chunks):
    n = machine.ranks
    print(f"N {n} = {machine.nodes} nodes x {machine.gpus_per_node}, {problem.tokens_per_gpu} tokens per rank "
          f"(S {problem.tokens_per_gpu * n}), B {problem.batch}, Hq {problem.hq}, Hkv {problem.hkv}, D {problem.dim}, "
          f"{'causal' if problem.causal else 'non-causal'}, {problem.dtype_bytes}-byte dtype, {problem.direction}")
    print(f"links: intra-node {machine.intra_bw / 1e9:g} GB/s ({machine.intra_latency * 1e6:g} us), "
          f"inter-node {machine.inter_bw / 1e9:g} GB/s ({machine.inter_latency * 1e6:g} us), "
          f"step cost {machine.step_cost * 1e6:g} us")
    print(f"rates: {machine.fwd_rate.source}; {machine.bwd_rate.source}")
    over = chunks > 1
    head = "| U | R | block tokens | a2a | ring hop | compute ms | a2a ms | ring ms | total ms | total / compute |"
    head += " chunks | overlapped ms | overlapped / compute |" if over else ""
    print(head)
    print("|" + "---|" * (head.count("|") - 1))
    for row in rows:
        if not row["valid"]:
            print(f"| {row['u']} | {row['r'] or '–'} | invalid: {row['reason']} |")
            continue
        line = (f"| {row['u']}{' (best)' if row['best'] else ''} | {row['r']} | {row['block_tokens']} | "
                f"{row['a2a_link']} | {row['ring_link'] or 'none'} | {ms(row['compute_s'])} | {ms(row['a2a_s'])} | "
                f"{ms(row['ring_s'])} | {ms(row['total_s'])} | {row['ratio']:.3f} |")
        if over:
            line += (f" {row['chunks']} | {ms(row.get('total_overlap_s', row['total_s']))} | "
                     f"{row.get('ratio_overlap', row['ratio']):.3f} |")
        print(line)


def table_rows(machine_args, gpus_per_node=8):
    """The --table grid: best U, pure ring and pure Ulysses per (nodes, tokens per GPU)."""
    out = []
    for nodes in TABLE_NODES:
        for tokens in TABLE_TOKENS:
            problem = Problem(tokens, **TABLE_SHAPE)
            machine = make_machine(machine_args, nodes, gpus_per_node, problem)
            rows, best_u = evaluate_all(problem, machine)
            by_u = {row["u"]: row for row in rows}
            out.append({"nodes": nodes, "tokens_per_gpu": tokens, "best": by_u[best_u],
                        "ring": by_u[1], "ulysses": by_u[machine.ranks]})
    return out


def print_table(entries):
    print("| nodes | tokens/GPU | best U | best: total ms | best: time / compute | U = 1 (ring): total ms "
          "| U = 1: time / compute | U = N (Ulysses): time / compute |")
    print("|---|---|---|---|---|---|---|---|")
    for e in entries:
        uly = e["ulysses"]
        uly_text = f"{uly['ratio']:.3f}" if uly["valid"] else f"invalid ({uly['reason']})"
        print(f"| {e['nodes']} | {e['tokens_per_gpu']} | {e['best']['u']} | {ms(e['best']['total_s'])} | "
              f"{e['best']['ratio']:.3f} | {ms(e['ring']['total_s'])} | {e['ring']['ratio']:.3f} | {uly_text} |")


# ---------------------------------------------------------------------------------------------
# Command line
# ---------------------------------------------------------------------------------------------

def make_machine(args, nodes, gpus_per_node, problem):
    unit = {"tflops": 1e12, "gflops": 1e9}[args.rate_unit]
    fwd = (parse_rate_curve(args.fwd_rates, unit, "forward") if args.fwd_rates
           else default_rate_curve(problem.dim, problem.causal, "fwd"))
    bwd = (parse_rate_curve(args.bwd_rates, unit, "backward") if args.bwd_rates
           else default_rate_curve(problem.dim, problem.causal, "bwd"))
    return Machine(nodes, gpus_per_node, args.intra_gbs, args.inter_gbs, args.intra_latency_us,
                   args.inter_latency_us, args.step_cost_us, fwd, bwd)


def parse_args(argv):
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter, epilog=__doc__)
    p.add_argument("--nodes", type=int, default=2)
    p.add_argument("--gpus-per-node", "--ranks-per-node", dest="gpus_per_node", type=int, default=8)
    p.add_argument("--u", default="all", help="all-to-all group size, or 'all' for every divisor of N")
    p.add_argument("--tokens-per-gpu", "--tokens-per-rank", dest="tokens", type=int, default=4096)
    p.add_argument("--batch", type=int, default=1)
    p.add_argument("--hq", type=int, default=32)
    p.add_argument("--hkv", type=int, default=8)
    p.add_argument("--dim", type=int, default=128)
    p.add_argument("--causal", dest="causal", action="store_true", default=True)
    p.add_argument("--non-causal", dest="causal", action="store_false")
    p.add_argument("--dtype-bytes", type=int, default=2, help="2 for bf16/f16, 4 for float32")
    p.add_argument("--direction", choices=("forward", "backward", "both"), default="both")
    p.add_argument("--intra-gbs", type=float, default=DEFAULT_INTRA_GBS, help="GB/s per rank per direction")
    p.add_argument("--inter-gbs", type=float, default=DEFAULT_INTER_GBS, help="GB/s per rank per direction")
    p.add_argument("--intra-latency-us", type=float, default=DEFAULT_INTRA_LATENCY_US)
    p.add_argument("--inter-latency-us", type=float, default=DEFAULT_INTER_LATENCY_US)
    p.add_argument("--step-cost-us", type=float, default=DEFAULT_STEP_COST_US, help="fixed cost per ring step")
    p.add_argument("--fwd-rates", help="forward rate, one number or tokens:rate pairs (default: H200 table)")
    p.add_argument("--bwd-rates", help="backward rate, one number or tokens:rate pairs (default: H200 table)")
    p.add_argument("--rate-unit", choices=("tflops", "gflops"), default="tflops")
    p.add_argument("--overlap", type=int, default=1, metavar="C",
                   help="all-to-alls in C head chunks overlapping the ring (default 1: no overlap)")
    p.add_argument("--table", action="store_true", help="the markdown table for common GPU machines")
    p.add_argument("--json", action="store_true")
    args = p.parse_args(argv)
    positive = ("nodes", "gpus_per_node", "tokens", "batch", "hq", "hkv", "dim", "dtype_bytes", "intra_gbs",
                "inter_gbs", "overlap")
    for name in positive:
        if getattr(args, name) <= 0:
            p.error(f"--{name.replace('_', '-')} must be positive")
    if min(args.intra_latency_us, args.inter_latency_us, args.step_cost_us) < 0:
        p.error("latencies and the step cost must not be negative")
    if args.hq % args.hkv:
        p.error(f"Hq {args.hq} must be a multiple of Hkv {args.hkv}")
    if args.u != "all" and (not args.u.isdigit() or int(args.u) <= 0):
        p.error("--u takes a positive integer or 'all'")
    return args, p


def main(argv):
    args, parser = parse_args(argv)
    if args.table:
        entries = table_rows(args)
        if args.json:
            print(json.dumps(entries, indent=1))
        else:
            print_table(entries)
        return 0
    problem = Problem(args.tokens, args.hq, args.hkv, args.dim, args.causal, args.dtype_bytes, args.batch,
                      args.direction)
    try:
        machine = make_machine(args, args.nodes, args.gpus_per_node, problem)
    except ValueError as e:
        parser.error(str(e))
    us = None if args.u == "all" else [int(args.u)]
    rows, best_u = evaluate_all(problem, machine, us, args.overlap)
    if args.json:
        print(json.dumps({"ranks": machine.ranks, "best_u": best_u, "fwd_rates": machine.fwd_rate.source,
                          "bwd_rates": machine.bwd_rate.source, "rows": rows}, indent=1))
    else:
        print_rows(problem, machine, rows, args.overlap)
    return 0 if best_u is not None else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
