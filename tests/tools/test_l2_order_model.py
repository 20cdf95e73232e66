#!/usr/bin/env python3
"""bench/l2_order_model.py, the model of the DRAM traffic a tile kernel's CTA order causes, checked
against hand counts and against the one point the H200 measured:
  - with an L2 that holds everything, DRAM sees each tile once whatever the order (the first touch
    of every K/V tile, or of every Q, dO, LSE/delta tile and a dQ accumulator written back once);
  - its slot order is CtaSlotAt's (every slot once, a group after the one before, tile-major
    inside, the last group smaller);
  - at causal D 128, 4k tokens and 64 heads, the order before head groups gives what the profile
    of the TMA kernels measured (about 1.22 GB forward and 3.5 GB backward, docs/performance.md)
    within 15%, and the head groups less than a third of it.

Usage: test_l2_order_model.py L2_ORDER_MODEL_PY
"""
import importlib.util
import io
import contextlib
import sys


def load(path):
    spec = importlib.util.spec_from_file_location("l2_order_model", path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def lines(mod, *args):
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        assert mod.main(list(map(str, args))) == 0
    rows = []
    for line in out.getvalue().splitlines():
        rows.append(dict(w.split("=", 1) for w in line.split()[1:]))
    return {(r["pass"], r["order"]): r for r in rows}


def main():
    mod = load(sys.argv[1])
    failures = []

    def check(ok, what):
        if not ok:
            failures.append(what)

    # The slot order.
    for tiles, heads, group in ((3, 7, 2), (4, 5, 5), (2, 6, 0), (5, 1, 1)):
        order = list(mod.slots(tiles, heads, group))
        check(sorted(order) == [(t, h) for t in range(tiles) for h in range(heads)], f"slots {tiles, heads, group}")
        g = heads if group == 0 else group
        check([h // g for _, h in order] == sorted(h // g for _, h in order), f"groups in order {tiles, heads, group}")
    check(list(mod.slots(2, 3, 2)) == [(0, 0), (0, 1), (1, 0), (1, 1), (0, 2), (1, 2)], "tile-major in a group")

    # Everything fits: compulsory traffic only, the same for both orders. 512 tokens, 4 heads, D 64,
    # causal: forward K/V tiles 4 heads x 4 tiles x 2 x 16 KB; backward per head 8 query tiles of Q,
    # dO (8 KB each), LSE/delta (512 B) and a dQ tile (16 KB) written back once; plus the streams.
    r = lines(mod, "--len", 512, "--heads", 4, "--dim", 64, "--l2-mb", 1024)
    kv = 4 * 4 * 2 * 128 * 64 * 2
    bwd_tiles = 4 * 8 * (2 * 64 * 64 * 2 + 64 * 8) + 4 * 8 * 64 * 64 * 4
    tensor = 512 * 4 * 64 * 2
    for order in ("every_head", "head_groups"):
        check(abs(float(r[("fwd", order)]["dram_gb"]) * 1e9 - (kv + 2 * tensor)) < 1e6, f"fwd {order} compulsory")
        check(abs(float(r[("bwd", order)]["dram_gb"]) * 1e9 - (bwd_tiles + 4 * tensor)) < 1e6, f"bwd {order} compulsory")

    # The measured point.
    r = lines(mod, "--len", 4096, "--heads", 64, "--dim", 128)
    for name, measured in (("fwd", 1.22), ("bwd", 3.5)):
        before = float(r[(name, "every_head")]["dram_gb"])
        after = float(r[(name, "head_groups")]["dram_gb"])
        check(abs(before - measured) / measured < 0.15, f"{name}: {before} GB modelled against {measured} measured")
        check(after < before / 3, f"{name}: head groups {after} GB against {before}")

    for f in failures:
        print("FAIL:", f)
    print("ok" if not failures else f"{len(failures)} failed")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
