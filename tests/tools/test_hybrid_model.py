#!/usr/bin/env python3
"""bench/hybrid_model.py, the model of one hybrid-parallel attention call (an all-to-all group of U
ranks, a ring of R groups), checked through its --json output against sums done here by hand: U = 1
is the plain ring, U = N sends nothing around a ring, the all-to-all moves the bytes the head split
says (K/V heads split over the group, or shared when Hkv < U), invalid U are listed as such, more
bandwidth never slows a call, and the 2-node H200 configuration the project's bar names.

Usage: test_hybrid_model.py HYBRID_MODEL_PY
"""
import json
import math
import subprocess
import sys

F32 = 4
SCRIPT = None


def run(*args, check=True):
    proc = subprocess.run([sys.executable, SCRIPT, *map(str, args)], capture_output=True, text=True)
    if check and proc.returncode != 0:
        raise RuntimeError(f"{args}: status {proc.returncode}: {proc.stderr}")
    return proc


def model(*args):
    return json.loads(run("--json", *args).stdout)


def rows_by_u(answer):
    return {row["u"]: row for row in answer["rows"]}


def close(a, b, rel=1e-9):
    return math.isclose(a, b, rel_tol=rel, abs_tol=1e-15)


# A small machine with flat kernel rates and round links, so that the sums below are done by hand.
FLAT = ["--nodes", 2, "--ranks-per-node", 4, "--tokens-per-rank", 1000, "--hq", 8, "--hkv", 2, "--dim", 64,
        "--dtype-bytes", 2, "--fwd-rates", 100, "--bwd-rates", 40, "--intra-gbs", 100, "--inter-gbs", 10,
        "--intra-latency-us", 1, "--inter-latency-us", 2, "--step-cost-us", 5]


def plain_ring_by_hand(n, tokens, hq, hkv, dim, e, fwd_rate, bwd_rate, bw, latency, step_cost, causal=True):
    """The plain striped ring, written out from its definition: N steps on L-token blocks; a step is
    max(compute, transfer) + step cost; forward sends K/V on every step but the last; backward also
    the float32 dK/dV partial from step 2 on, and the last partial goes home after the loop."""
    length = tokens
    out = {}
    for p, rate, factor in (("fwd", fwd_rate, 1.0), ("bwd", bwd_rate, 2.5)):
        kv = 2 * length * hkv * dim * e
        dkv = 2 * length * hkv * dim * F32 if p == "bwd" else 0
        t = 0.0
        for s in range(n):
            pairs = (length * (length + 1) / 2 if s == 0 else length * length / 2) if causal else length * length
            c = 4 * pairs * hq * dim * factor / rate
            moving = (kv if s < n - 1 else 0) + (dkv if s >= 2 else 0)
            t += max(c, latency + moving / bw if moving else 0.0) + step_cost
        if dkv:
            t += latency + dkv / bw
        out[p] = t
    return out


def check_plain_ring(failures):
    rows = rows_by_u(model(*FLAT))
    ring = rows[1]
    hand = plain_ring_by_hand(8, 1000, 8, 2, 64, 2, 100e12, 40e12, 10e9, 2e-6, 5e-6)
    if ring["a2a_s"] != 0 or ring["ring_link"] != "inter-node":
        failures.append(f"U = 1: an all-to-all of {ring['a2a_s']} s, ring hop {ring['ring_link']}")
    for p in ("fwd", "bwd"):
        if not close(ring["passes"][p]["ring_s"], hand[p]):
            failures.append(f"U = 1 {p}: ring {ring['passes'][p]['ring_s']} s, plain ring by hand {hand[p]} s")
    if not close(ring["total_s"], hand["fwd"] + hand["bwd"]):
        failures.append(f"U = 1: total {ring['total_s']} s against the plain ring's {hand['fwd'] + hand['bwd']} s")
    # On one node of 8 every hop is NVLink: the same ring on the intra-node link.
    one_node = FLAT[:]
    one_node[1], one_node[3] = 1, 8
    ring1 = rows_by_u(model(*one_node))[1]
    hand1 = plain_ring_by_hand(8, 1000, 8, 2, 64, 2, 100e12, 40e12, 100e9, 1e-6, 5e-6)
    if ring1["ring_link"] != "intra-node" or not close(ring1["total_s"], hand1["fwd"] + hand1["bwd"]):
        failures.append(f"U = 1 on one node: {ring1['ring_link']}, {ring1['total_s']} s against {hand1}")
    # Non-causal: whole block pairs.
    dense = rows_by_u(model(*FLAT, "--non-causal"))[1]
    hand_d = plain_ring_by_hand(8, 1000, 8, 2, 64, 2, 100e12, 40e12, 10e9, 2e-6, 5e-6, causal=False)
    if not close(dense["total_s"], hand_d["fwd"] + hand_d["bwd"]):
        failures.append(f"U = 1 non-causal: {dense['total_s']} s against {hand_d}")


def check_pure_ulysses(failures):
    uly = rows_by_u(model(*FLAT))[8]
    if not uly["valid"]:
        failures.append(f"U = N with Hq 8, Hkv 2 on N 8: {uly['reason']}")
        return
    if uly["r"] != 1 or uly["ring_link"] is not None:
        failures.append(f"U = N: R {uly['r']}, ring hop {uly['ring_link']}")
    for p, v in uly["passes"].items():
        if v["ring_kv_bytes_per_step"] or v["ring_dkv_bytes_per_step"]:
            failures.append(f"U = N {p}: ring bytes {v['ring_kv_bytes_per_step']} + {v['ring_dkv_bytes_per_step']}")
        # One local step: its compute and the step's fixed cost, no transfer.
        if not close(v["ring_s"], v["ring_compute_s"] + 5e-6):
            failures.append(f"U = N {p}: ring {v['ring_s']} s, its compute {v['ring_compute_s']} s + 5 us")
    if uly["a2a_s"] <= 0:
        failures.append("U = N: no all-to-all")


def a2a_expected(t, hq, hkv, dim, e, u):
    """Bytes one rank sends in each all-to-all phase, from the head split: (U-1)/U of each tensor's
    shard. K/V are Hkv heads' worth when split and U heads' worth when shared (each member receives
    its head from every other member); dK/dV come back in the dtype, as many bytes as K/V went."""
    shared = hkv % u != 0
    kvh = u if shared else hkv
    share = (u - 1) / u
    return {
        "fwd_in": share * t * dim * e * (hq + 2 * kvh),
        "fwd_out": share * t * hq * (dim * e + F32),
        "bwd_in": share * t * (3 * hq * dim * e + 2 * kvh * dim * e + hq * F32),
        "bwd_out": share * t * dim * e * (hq + 2 * kvh),
    }


def check_a2a_volume(failures):
    t, dim, e = 1000, 64, 2
    base = ["--nodes", 1, "--ranks-per-node", 8, "--tokens-per-rank", t, "--dim", dim, "--dtype-bytes", e,
            "--intra-gbs", 100, "--intra-latency-us", 1, "--fwd-rates", 100, "--bwd-rates", 40]
    # hq 8, hkv 4: U 2 and 4 split the K/V heads, U 8 shares them (two members per head).
    for hkv, u, kind in ((4, 4, "split"), (4, 2, "split"), (2, 4, "shared"), (4, 8, "shared"), (1, 8, "shared")):
        row = rows_by_u(model(*base, "--hq", 8, "--hkv", hkv, "--u", u))[u]
        want = a2a_expected(t, 8, hkv, dim, e, u)
        kvh_member = hkv // u if kind == "split" else 1
        if row["kv_heads_per_member"] != kvh_member:
            failures.append(f"Hkv {hkv}, U {u}: {row['kv_heads_per_member']} K/V heads per member, want {kvh_member}")
        for p in ("fwd", "bwd"):
            got_in, got_out = row["passes"][p]["a2a_bytes_in"], row["passes"][p]["a2a_bytes_out"]
            if not (close(got_in, want[p + "_in"]) and close(got_out, want[p + "_out"])):
                failures.append(f"Hkv {hkv}, U {u} ({kind}) {p}: all-to-all bytes {got_in:.0f} / {got_out:.0f}, "
                                f"by hand {want[p + '_in']:.0f} / {want[p + '_out']:.0f}")
            # Within a node: one latency and the bytes at NVLink's rate, per phase.
            a2a = 2e-6 + (want[p + "_in"] + want[p + "_out"]) / 100e9
            if not close(row["passes"][p]["a2a_s"], a2a):
                failures.append(f"Hkv {hkv}, U {u} {p}: all-to-all {row['passes'][p]['a2a_s']} s, by hand {a2a} s")
    # A group over two nodes: 7 of 15 peers on the rank's node, 8 beyond it at the NIC's rate.
    row = rows_by_u(model("--nodes", 2, "--ranks-per-node", 8, "--tokens-per-rank", t, "--hq", 16, "--hkv", 16,
                          "--dim", dim, "--u", 16, "--direction", "forward", "--intra-latency-us", 0,
                          "--inter-latency-us", 0))[16]
    shard = t * dim * e * 48
    want = max(shard * 7 / 16 / 450e9, shard * 8 / 16 / 50e9) + max(
        t * 16 * (dim * e + F32) * 7 / 16 / 450e9, t * 16 * (dim * e + F32) * 8 / 16 / 50e9)
    if row["a2a_link"] != "crosses nodes" or not close(row["a2a_s"], want):
        failures.append(f"U 16 over 2 nodes: {row['a2a_link']}, {row['a2a_s']} s, by hand {want} s")


def check_invalid_u(failures):
    # N 12, Hq 24, Hkv 6: U 4 splits the query heads but neither splits nor shares the K/V heads.
    answer = model("--nodes", 1, "--ranks-per-node", 12, "--hq", 24, "--hkv", 6)
    rows = rows_by_u(answer)
    if sorted(rows) != [1, 2, 3, 4, 6, 12]:
        failures.append(f"N 12: U listed {sorted(rows)}, want every divisor")
    if 4 not in rows or rows[4]["valid"] or "Hkv" not in (rows[4]["reason"] or ""):
        failures.append(f"Hkv 6, U 4: {rows.get(4)}")
    if not all(u in rows and rows[u]["valid"] for u in (1, 2, 3, 6, 12)):
        failures.append("N 12, Hq 24, Hkv 6: a valid U marked invalid")
    # Hq 32 on N 12: U 3, 6, 12 do not split the query heads.
    rows = rows_by_u(model("--nodes", 1, "--ranks-per-node", 12, "--hq", 32, "--hkv", 8))
    bad = sorted(u for u, row in rows.items() if not row["valid"])
    if sorted(rows) != [1, 2, 3, 4, 6, 12] or bad != [3, 6, 12] or any("Hq" not in rows[u]["reason"] for u in bad):
        failures.append(f"Hq 32 on N 12: invalid U {bad}")
    # One U asked for and invalid: reported, and the status says no valid U.
    proc = run("--json", "--u", 3, check=False)
    listed = json.loads(proc.stdout)["rows"] if proc.stdout else []
    row = listed[0] if listed else {}
    if proc.returncode != 1 or row.get("valid") is not False or "divide" not in (row.get("reason") or ""):
        failures.append(f"--u 3 on N 16: status {proc.returncode}, {row}")
    # The text output lists them too.
    text = run("--nodes", 1, "--ranks-per-node", 12, "--hq", 24, "--hkv", 6).stdout
    if "| 4 | 3 | invalid:" not in text:
        failures.append("the text output drops the invalid U")


def check_monotonic(failures):
    """More bandwidth (or less latency) never makes a call slower, for any U, pass or machine."""
    for nodes, tokens, hkv, causal in ((1, 1024, 8, True), (2, 4096, 8, True), (4, 32768, 32, False),
                                       (2, 2048, 2, True), (4, 8192, 32, True)):
        base = ["--nodes", nodes, "--tokens-per-gpu", tokens, "--hkv", hkv] + ([] if causal else ["--non-causal"])
        prev = None
        for intra, inter, lat in ((100, 10, 8), (200, 10, 8), (200, 25, 8), (450, 50, 8), (450, 50, 1),
                                  (900, 200, 1), (4000, 4000, 0)):
            answer = model(*base, "--intra-gbs", intra, "--inter-gbs", inter, "--intra-latency-us", lat,
                           "--inter-latency-us", lat)
            rows = rows_by_u(answer)
            if prev:
                for u, row in rows.items():
                    if row["valid"] and row["total_s"] > prev[0][u]["total_s"] * (1 + 1e-12):
                        failures.append(f"{base} U {u}: faster links ({intra}, {inter}, {lat} us) slower: "
                                        f"{prev[0][u]['total_s']} -> {row['total_s']} s")
                if rows[answer["best_u"]]["total_s"] > prev[1] * (1 + 1e-12):
                    failures.append(f"{base}: the best call got slower with faster links")
            prev = rows, rows[answer["best_u"]]["total_s"]
            # Communication only adds: no U is faster than its compute alone.
            for u, row in rows.items():
                if row["valid"] and row["ratio"] < 1 - 1e-9:
                    failures.append(f"{base} U {u}: total below compute alone ({row['ratio']})")


def check_overlap(failures):
    """Head chunks pipelined with the ring never lose when chunks cost nothing extra (no latency, no
    step cost), and cannot cut a K/V head that several members share."""
    free = ["--intra-latency-us", 0, "--inter-latency-us", 0, "--step-cost-us", 0, "--overlap", 4]
    for args in (["--hkv", 8], ["--hkv", 32], ["--nodes", 4, "--hkv", 32, "--tokens-per-gpu", 1024]):
        for u, row in rows_by_u(model(*args, *free)).items():
            if not row["valid"]:
                continue
            if row.get("total_overlap_s", row["total_s"]) > row["total_s"] * (1 + 1e-9):
                failures.append(f"{args} U {u}: overlapped {row.get('total_overlap_s')} > {row['total_s']} s")
            hkv = int(args[args.index("--hkv") + 1])
            if hkv < u and row["chunks"] != 1:
                failures.append(f"{args} U {u}: {row['chunks']} chunks of a shared K/V head")
    row = rows_by_u(model("--hkv", 32, "--u", 4, *free))[4]
    if row["chunks"] != 4 or not row["total_overlap_s"] < row["total_s"]:
        failures.append(f"Hkv 32, U 4, 4 chunks: {row['chunks']} chunks, {row.get('total_overlap_s')} s "
                        f"against {row['total_s']} s")


def check_rates(failures):
    """The default rates are the H200 table's, interpolated in log(tokens)."""
    for tokens, fwd in ((4096, 470), (32768, 654), (1 << 20, 654)):
        row = rows_by_u(model("--nodes", 1, "--tokens-per-gpu", tokens, "--u", 1, "--direction", "forward"))[1]
        s = tokens * 8
        want = 4 * s * s * 32 * 128 / 2 / 8 / (fwd * 1e12)
        if not close(row["compute_s"], want):
            failures.append(f"{tokens} tokens: compute {row['compute_s']} s, by hand {want} s at {fwd} TFLOP/s")
    # Halfway between 4k and 8k in log(tokens) (5793 tokens), halfway between their rates.
    row = rows_by_u(model("--nodes", 1, "--tokens-per-gpu", 5793, "--u", 1, "--direction", "backward"))[1]
    w = (math.log(5793) - math.log(4096)) / math.log(2)
    rate = (276 + w * (304 - 276)) * 1e12
    want = 2.5 * 4 * (5793 * 8) ** 2 * 32 * 128 / 2 / 8 / rate
    if not close(row["compute_s"], want):
        failures.append(f"5793 tokens backward: compute {row['compute_s']} s, by hand {want} s")


def check_headline(failures):
    """2 nodes x 8 H200s, 4k tokens per GPU, Hq 32, Hkv 8, D 128, causal, bf16, forward + backward.

    The bar: the best hybrid within 1.15x of its compute, and the pure ring at least 2x. The model
    meets the first; it puts the pure ring at about 1.07x, so the second is not asserted: with GQA
    4:1 a 4k-token step moves 16.8 MB forward (0.34 ms at 50 GB/s, against 0.29 ms of compute) and
    50 MB backward (1.0 ms, against 1.25 ms): the forward is 15% transfer-bound, the backward hides.
    """
    answer = model("--nodes", 2, "--gpus-per-node", 8, "--tokens-per-gpu", 4096, "--hq", 32, "--hkv", 8,
                   "--dim", 128, "--dtype-bytes", 2, "--direction", "both")
    rows = rows_by_u(answer)
    best, ring = rows[answer["best_u"]], rows[1]
    print(f"headline: best U {best['u']}: {best['total_s'] * 1e3:.3f} ms, {best['ratio']:.3f}x compute; "
          f"pure ring: {ring['total_s'] * 1e3:.3f} ms, {ring['ratio']:.3f}x compute (bar >= 2.0x: "
          f"{'met' if ring['ratio'] >= 2 else 'not met by the model'})")
    if best["ratio"] > 1.15:
        failures.append(f"best hybrid U {best['u']} at {best['ratio']:.3f}x compute, bar 1.15x")
    if best["u"] in (1, 16) or best["total_s"] >= ring["total_s"]:
        failures.append(f"best U {best['u']} is not a hybrid faster than the ring")
    # The group of a node: K/V all-to-all on NVLink, ring over InfiniBand.
    if best["a2a_link"] != "intra-node" or best["ring_link"] != "inter-node":
        failures.append(f"best U {best['u']}: all-to-all {best['a2a_link']}, ring {best['ring_link']}")


def check_table(failures):
    text = run("--table").stdout.splitlines()
    rows = [line for line in text if line.startswith("| ") and line[2].isdigit()]
    if len(rows) != 18 or not text[0].startswith("| nodes | tokens/GPU | best U"):
        failures.append(f"--table: {len(rows)} rows")
    entries = json.loads(run("--table", "--json").stdout)
    for e in entries:
        if e["best"]["total_s"] > e["ring"]["total_s"] or (e["ulysses"]["valid"] and
                                                          e["best"]["total_s"] > e["ulysses"]["total_s"]):
            failures.append(f"--table {e['nodes']} nodes, {e['tokens_per_gpu']}: the best is not the fastest")
    if [e["ulysses"]["valid"] for e in entries if e["tokens_per_gpu"] == 4096] != [True, True] + [False] * 4:
        failures.append("--table: pure Ulysses should be valid up to N 32 (Hq 32) only")


def main(script):
    global SCRIPT
    SCRIPT = script
    failures = []
    for check in (check_plain_ring, check_pure_ulysses, check_a2a_volume, check_invalid_u, check_monotonic,
                  check_overlap, check_rates, check_headline, check_table):
        before = len(failures)
        check(failures)
        if len(failures) > before:
            print(f"{check.__name__}: failed")
    for f in failures:
        print("FAIL:", f)
    print("hybrid_model: " + ("ok" if not failures else f"{len(failures)} checks failed"))
    return 1 if failures else 0


if __name__ == "__main__":
    if len(sys.argv) != 2:
        sys.exit(__doc__)
    sys.exit(main(sys.argv[1]))
