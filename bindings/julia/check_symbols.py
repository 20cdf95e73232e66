#!/usr/bin/env python3
"""Every exported stria_* symbol of libstria has a wrapper in LibStria.jl, and every wrapper
names an exported symbol.

    python3 bindings/julia/check_symbols.py path/to/libstria.so.0 [--julia LibStria.jl]

The exports come from `nm -D --defined-only` (the dynamic symbol table: what ccall can reach);
the wrappers are the `function f(...)` blocks of LibStria.jl, each one `ccall((:f, libstria),
...)` (generate.signatures_from_julia checks that shape). Exit status 0 when both sets agree.
"""

import argparse
import os
import subprocess
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)


def exported_symbols(library):
    out = subprocess.run(["nm", "-D", "--defined-only", library], capture_output=True, text=True, check=True).stdout
    symbols = set()
    for line in out.splitlines():
        parts = line.split()
        # "<address> <type> <name>"; a versioned name reads name@@VERSION.
        if len(parts) >= 3 and parts[1] in "TtWiDdBbRr":
            name = parts[2].split("@")[0]
            if name.startswith("stria_"):
                symbols.add(name)
    return symbols


def wrapped_symbols(julia_path):
    from generate import signatures_from_julia  # the same reader the layout table is made with

    with open(julia_path, encoding="utf-8") as f:
        source = f.read()
    return {name for name, _, _ in signatures_from_julia(source)}, source.count("ccall(")


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("library")
    ap.add_argument("--julia", default=os.path.join(HERE, "Stria.jl", "src", "LibStria.jl"))
    args = ap.parse_args(argv)
    exported = exported_symbols(args.library)
    wrapped, ccalls = wrapped_symbols(args.julia)
    failures = 0
    if ccalls != len(wrapped):
        print(f"MISMATCH: {ccalls} ccalls in {args.julia} but {len(wrapped)} well-formed wrappers", file=sys.stderr)
        failures += 1
    for name in sorted(exported - wrapped):
        print(f"MISMATCH: {name} is exported by {args.library} but LibStria.jl has no wrapper", file=sys.stderr)
        failures += 1
    for name in sorted(wrapped - exported):
        print(f"MISMATCH: LibStria.jl wraps {name}, which {args.library} does not export", file=sys.stderr)
        failures += 1
    print(f"check_symbols: {len(exported)} exported stria_* symbols, {len(wrapped)} wrappers, {failures} mismatches")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
