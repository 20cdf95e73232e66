"""Tests of the Julia binding's generator and checkers (no Julia needed).

    .venv-julia/bin/python -m unittest discover -s bindings/julia/tests -v

A synthetic header exercises every mapping rule (padding, nested structs, NTuple, enums of both
signs, opaque handles, function pointers, Julia keywords, macros of every kind); the C checker
must accept its table and reject deliberately wrong entries, for the synthetic header and for
stria.h. STRIA_LIB_PATH (a built libstria.so.0) enables the symbol-check tests.
"""

import copy
import io
import json
import os
import re
import shutil
import sys
import tempfile
import unittest
from contextlib import redirect_stderr, redirect_stdout

HERE = os.path.dirname(os.path.abspath(__file__))
JULIA_DIR = os.path.dirname(HERE)
REPO = os.path.dirname(os.path.dirname(JULIA_DIR))
sys.path.insert(0, JULIA_DIR)

import check_layout  # noqa: E402
import check_symbols  # noqa: E402
import generate  # noqa: E402
import julia_layout  # noqa: E402

SYNTHETIC = r"""
#ifndef SYNTH_SYNTH_H_
#define SYNTH_SYNTH_H_
#include <stddef.h>
#include <stdint.h>

#define SYN_ANSWER 42
#define SYN_EXPR (SYN_ANSWER * 2 - 7 / 2) /* C's integer division: 81 */
#define SYN_NEG (-5)
#define SYN_HEX 0x10u
#define SYN_FLOAT 2.5f
#define SYN_STRING "text"
#define SYN_ATTR __attribute__((unused))
#define SYN_FUNC(x) ((x) + 1)

typedef enum { SYN_A = 0, SYN_B = 7 } syn_unsigned_t;
typedef enum { SYN_NEGATIVE = -1, SYN_POSITIVE = 1 } syn_signed_t;
typedef struct syn_opaque* syn_handle_t;

/* Padding after c, and at the end. */
typedef struct {
  char c;
  double d;
  uint16_t s;
} syn_padded_t;

struct syn_tagged {
  int32_t values[3];
  syn_padded_t inner;
  syn_unsigned_t kind;
  void (*callback)(void*);
  const char* name;
  int end; /* a Julia keyword */
};
typedef struct syn_tagged syn_tagged_t;
typedef struct syn_hidden syn_hidden_t; /* opaque: only pointed to */
typedef void (*syn_callback_t)(void* user);

int syn_none(void);
const char* syn_one(syn_handle_t h);
void syn_unnamed(int, double);
void syn_opaque_args(syn_hidden_t* h, syn_callback_t cb, void (*raw)(int));
syn_signed_t syn_many(const struct syn_tagged* t, syn_padded_t* p, int64_t n, float f, size_t* out, int local);
#endif
"""


def write_header(directory, text, name="synth.h"):
    """Writes directory/synth/<name> and returns (header path, include root)."""
    os.makedirs(os.path.join(directory, "synth"), exist_ok=True)
    path = os.path.join(directory, "synth", name)
    with open(path, "w", encoding="utf-8") as f:
        f.write(text)
    return path, directory


def run_generator(header, root, also=()):
    gen = generate.Generator(header, [root], list(also), "libsynth.so.1", "LibSynth")
    text, _ = gen.generate()
    table = generate.layout_table(text, gen.c_names, gen._file_label(gen.header))
    return text, table


def run_checker(table, includes):
    """check_layout on a table (written to a temp file): (exit status, stdout + stderr)."""
    with tempfile.NamedTemporaryFile("w", suffix=".json", delete=False) as f:
        json.dump(table, f)
        path = f.name
    out, err = io.StringIO(), io.StringIO()
    try:
        with redirect_stdout(out), redirect_stderr(err):
            rc = check_layout.main(["--table", path] + [f"-I{d}" for d in includes])
    finally:
        os.unlink(path)
    return rc, out.getvalue() + err.getvalue()


def struct_entry(table, name):
    return next(s for s in table["structs"] if s["julia"] == name)


def field_entry(table, struct, field):
    return next(f for f in struct_entry(table, struct)["fields"] if f["name"] == field)


class SyntheticHeader(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.tmp = tempfile.mkdtemp(prefix="stria-julia-test-")
        cls.header, cls.root = write_header(cls.tmp, SYNTHETIC)
        cls.text, cls.table = run_generator(cls.header, cls.root)

    @classmethod
    def tearDownClass(cls):
        shutil.rmtree(cls.tmp)

    def assertLine(self, line):
        self.assertIn(line + "\n", self.text, f"missing line: {line}\n--- generated:\n{self.text}")

    def test_macros(self):
        self.assertLine("const SYN_ANSWER = 42")
        self.assertLine("const SYN_EXPR = 81")
        self.assertLine("const SYN_NEG = -5")
        self.assertLine("const SYN_HEX = 16")
        self.assertLine("const SYN_FLOAT = 2.5")
        self.assertNotIn("SYN_FUNC", self.text)  # function-like: not expandable by a binding
        self.assertNotIn("const SYNTH_SYNTH_H_", self.text)  # an empty include guard
        self.assertIn("not translated): SYN_STRING, SYN_ATTR.", self.text)

    def test_enums(self):
        self.assertLine("const syn_unsigned_t = Cuint  # C enum")
        self.assertLine("const SYN_B = syn_unsigned_t(7)")
        self.assertLine("const syn_signed_t = Cint  # C enum")
        self.assertLine("const SYN_NEGATIVE = syn_signed_t(-1)")

    def test_types(self):
        self.assertLine("const syn_handle_t = Ptr{Cvoid}")
        self.assertIn("# Padding after c, and at the end.\nstruct syn_padded_t\n    c::Cchar\n    d::Cdouble\n"
                      "    s::UInt16\nend\n", self.text)
        self.assertLine("    values::NTuple{3, Int32}")
        self.assertLine("    inner::syn_padded_t")
        self.assertLine("    callback::Ptr{Cvoid}")
        self.assertLine("    name::Ptr{Cchar}")
        self.assertLine('    var"end"::Cint  # a Julia keyword')
        self.assertLine("const syn_tagged_t = syn_tagged")
        self.assertNotIn("syn_hidden_t =", self.text)
        self.assertLine("const syn_callback_t = Ptr{Cvoid}")

    def test_functions(self):
        self.assertIn("function syn_none()\n    ccall((:syn_none, libstria), Cint, ())\nend", self.text)
        self.assertIn("function syn_one(h)\n    ccall((:syn_one, libstria), Ptr{Cchar}, (syn_handle_t,), h)\nend",
                      self.text)
        self.assertIn("function syn_unnamed(arg1, arg2)", self.text)
        self.assertIn("(Cint, Cdouble)", self.text)
        self.assertIn("(Ptr{Cvoid}, syn_callback_t, Ptr{Cvoid})", self.text)
        sig = next(f for f in self.table["functions"] if f["name"] == "syn_many")
        self.assertEqual([a["julia_type"] for a in sig["args"]],
                         ["Ptr{syn_tagged}", "Ptr{syn_padded_t}", "Int64", "Cfloat", "Ptr{Csize_t}", "Cint"])
        self.assertEqual(sig["args"][-1]["name"], 'var"local"')
        self.assertEqual(sig["return"], "syn_signed_t")

    def test_layout_by_julia_rules(self):
        padded = struct_entry(self.table, "syn_padded_t")
        self.assertEqual((padded["size"], padded["align"]), (24, 8))
        self.assertEqual([f["offset"] for f in padded["fields"]], [0, 8, 16])
        tagged = struct_entry(self.table, "syn_tagged")
        self.assertEqual(tagged["c"], "struct syn_tagged")
        self.assertEqual([f["offset"] for f in tagged["fields"]], [0, 16, 40, 48, 56, 64])
        self.assertEqual(tagged["size"], 72)

    def test_output_is_deterministic(self):
        again, table = run_generator(self.header, self.root)
        self.assertEqual(again, self.text)
        self.assertEqual(table, self.table)
        self.assertNotIn(self.tmp, self.text)  # no absolute paths in the output

    def test_checker_accepts_the_table(self):
        rc, output = run_checker(self.table, [self.root])
        self.assertEqual(rc, 0, output)
        self.assertRegex(output, r"check_layout: \d+ checks, 0 mismatches")

    def test_checker_catches_wrong_entries(self):
        cases = {
            "offset": lambda t: field_entry(t, "syn_padded_t", "d").update(offset=4),
            "size": lambda t: struct_entry(t, "syn_tagged").update(size=64),
            "alignment": lambda t: struct_entry(t, "syn_padded_t").update(align=4),
            "field size": lambda t: field_entry(t, "syn_tagged", "values").update(size=16),
            "signedness": lambda t: next(a for a in t["aliases"] if a["julia"] == "syn_signed_t").update(
                kind="unsigned"),
            "pointer alias": lambda t: next(a for a in t["aliases"] if a["julia"] == "syn_handle_t").update(
                kind="signed"),
            "constant": lambda t: next(c for c in t["constants"] if c["name"] == "SYN_EXPR").update(value=80),
            "parameter": lambda t: next(f for f in t["functions"] if f["name"] == "syn_many")["args"][2].update(
                julia_type="Cint"),
            "return": lambda t: next(f for f in t["functions"] if f["name"] == "syn_one").update(
                **{"return": "Ptr{Cvoid}"}),
            "missing field": lambda t: struct_entry(t, "syn_padded_t")["fields"].append(
                {"name": "extra", "julia_type": "Cint", "offset": 24, "size": 4}),
            "missing function": lambda t: t["functions"].pop(),
        }
        for what, mutate in cases.items():
            with self.subTest(what):
                table = copy.deepcopy(self.table)
                mutate(table)
                rc, output = run_checker(table, [self.root])
                self.assertEqual(rc, 1, f"{what}: not caught\n{output}")
                self.assertIn("MISMATCH", output)

    def test_a_wrong_julia_type_fails_the_check(self):
        # The table follows the Julia text: a Float32 where C has a double moves every later
        # offset, and the C compiler disagrees.
        wrong = self.text.replace("    d::Cdouble\n", "    d::Cfloat\n")
        gen = generate.Generator(self.header, [self.root], [], "libsynth.so.1", "LibSynth")
        gen.generate()
        table = generate.layout_table(wrong, gen.c_names, gen._file_label(gen.header))
        self.assertEqual(struct_entry(table, "syn_padded_t")["size"], 12)
        rc, output = run_checker(table, [self.root])
        self.assertEqual(rc, 1, output)
        self.assertIn("MISMATCH sizeof(syn_padded_t): C has 24, LibStria.jl assumes 12", output)


class Refusals(unittest.TestCase):
    """What Julia cannot represent exactly is an error, never a guess."""

    CASES = {
        "bit-field": "typedef struct { int a : 3; } t;",
        "union": "typedef union { int a; float b; } u; typedef struct { u x; } t;",
        "top-level union": "union u { int a; float b; };",
        "variadic": "int f(int n, ...);",
        "long double": "long double f(void);",
        "no prototype": "int f();",
        "flexible array": "typedef struct { int n; int data[]; } t;",
        "packed": "typedef struct __attribute__((packed)) { char c; int i; } t;",
        "over-aligned": "typedef struct __attribute__((aligned(16))) { char c; } t;",
        "global variable": "extern int counter;",
        "does not parse": "int f(void",
    }

    def test_refusals(self):
        with tempfile.TemporaryDirectory() as tmp:
            for what, body in self.CASES.items():
                with self.subTest(what):
                    header, root = write_header(tmp, f"#include <stddef.h>\n{body}\n", name=f"case{len(what)}.h")
                    with self.assertRaises(generate.GenerationError):
                        run_generator(header, root)


class JuliaLayoutRules(unittest.TestCase):
    def test_parse_type(self):
        self.assertEqual(julia_layout.parse_type("NTuple{128, Cchar}"),
                         ("apply", "NTuple", [("int", 128), ("name", "Cchar")]))
        with self.assertRaises(julia_layout.LayoutError):
            julia_layout.parse_type("Ptr{Cint")

    def test_sizes(self):
        lay = julia_layout.JuliaLayout({"A": [("c", "Cchar"), ("x", "Int64"), ("t", "NTuple{3, UInt16}")]},
                                       {"handle": "Ptr{Cvoid}", "e": "Cuint"})
        self.assertEqual(lay.struct_layout("A")["size"], 24)
        self.assertEqual([f["offset"] for f in lay.struct_layout("A")["fields"]], [0, 8, 16])
        self.assertEqual(lay.size_align("handle"), (8, 8))
        self.assertEqual(lay.kind("e"), "unsigned")
        with self.assertRaises(julia_layout.LayoutError):
            lay.size_align("Cvoid")
        with self.assertRaises(julia_layout.LayoutError):
            lay.size_align("Unknown")


class StriaHeader(unittest.TestCase):
    """The committed table of stria.h: correct, and a wrong entry in it is caught."""

    @classmethod
    def setUpClass(cls):
        with open(os.path.join(JULIA_DIR, "layout_table.json"), encoding="utf-8") as f:
            cls.table = json.load(f)
        cls.includes = [os.path.join(REPO, "capi", "include")]

    def test_committed_table_matches_the_compiler(self):
        rc, output = run_checker(self.table, self.includes)
        self.assertEqual(rc, 0, output)

    def test_wrong_entries_are_caught(self):
        cases = {
            "DLTensor.shape": lambda t: field_entry(t, "DLTensor", "shape").update(offset=20),
            "config.timeout_s": lambda t: field_entry(t, "stria_context_config_t", "timeout_s").update(offset=156),
            # The size before ideal_latency: a table left behind by the header.
            "sizeof(stria_balance_t)": lambda t: struct_entry(t, "stria_balance_t").update(size=40),
            "stria_status_t": lambda t: next(a for a in t["aliases"] if a["julia"] == "stria_status_t").update(
                size=8),
            "STRIA_VERSION": lambda t: next(c for c in t["constants"] if c["name"] == "STRIA_VERSION").update(
                value=99),
            "stria_layout_positions seq_len": lambda t: next(
                f for f in t["functions"] if f["name"] == "stria_layout_positions")["args"][1].update(
                julia_type="Cint"),
        }
        for what, mutate in cases.items():
            with self.subTest(what):
                table = copy.deepcopy(self.table)
                mutate(table)
                rc, output = run_checker(table, self.includes)
                self.assertEqual(rc, 1, f"{what}: not caught\n{output}")

    def test_generated_file_has_every_function_of_the_header(self):
        with open(os.path.join(JULIA_DIR, "Stria.jl", "src", "LibStria.jl"), encoding="utf-8") as f:
            text = f.read()
        with open(os.path.join(REPO, "capi", "include", "stria", "stria.h"), encoding="utf-8") as f:
            declared = set(re.findall(r"STRIA_API [^;]*?\b(stria_\w+)\(", f.read()))
        wrapped = {name for name, _, _ in generate.signatures_from_julia(text)}
        self.assertEqual(declared, wrapped)


@unittest.skipUnless(os.environ.get("STRIA_LIB_PATH"), "STRIA_LIB_PATH (a built libstria.so.0) is not set")
class Symbols(unittest.TestCase):
    def run_check(self, julia_text):
        with tempfile.NamedTemporaryFile("w", suffix=".jl", delete=False) as f:
            f.write(julia_text)
            path = f.name
        out = io.StringIO()
        try:
            with redirect_stdout(out), redirect_stderr(out):
                rc = check_symbols.main([os.environ["STRIA_LIB_PATH"], "--julia", path])
        finally:
            os.unlink(path)
        return rc, out.getvalue()

    def setUp(self):
        with open(os.path.join(JULIA_DIR, "Stria.jl", "src", "LibStria.jl"), encoding="utf-8") as f:
            self.text = f.read()

    def test_committed_wrappers_match_the_exports(self):
        rc, output = self.run_check(self.text)
        self.assertEqual(rc, 0, output)

    def test_a_missing_wrapper_is_caught(self):
        without = re.sub(r"function stria_context_abort\(.*?\nend\n", "", self.text, flags=re.S)
        self.assertNotEqual(without, self.text)
        rc, output = self.run_check(without)
        self.assertEqual(rc, 1)
        self.assertIn("stria_context_abort is exported", output)

    def test_a_wrapper_of_nothing_is_caught(self):
        extra = (self.text + "\nfunction stria_no_such_thing()\n"
                 "    ccall((:stria_no_such_thing, libstria), Cint, ())\nend\n")
        rc, output = self.run_check(extra)
        self.assertEqual(rc, 1)
        self.assertIn("stria_no_such_thing, which", output)


class StaticJuliaChecks(unittest.TestCase):
    """check_julia's detectors on small snippets (skipped without tree-sitter)."""

    @classmethod
    def setUpClass(cls):
        try:
            import check_julia
        except ImportError as e:
            raise unittest.SkipTest(f"tree-sitter-julia is not installed: {e}")
        cls.cj = check_julia
        cls.parser = check_julia.parser()

    def parse(self, code):
        source = code.encode()
        return self.parser.parse(source), source

    def test_syntax_errors_are_found(self):
        for code in ("function f(x)\n  x + (1\nend\n", "function f(x)\n  if x\n 1\nend\n", "struct S\n  a::Int\n"):
            tree, source = self.parse(code)
            self.assertTrue(self.cj.syntax_errors(tree, source), code)
        tree, source = self.parse("@static if true\n  f(::Type{T}) where {T} = 1\nend\n")
        self.assertEqual(self.cj.syntax_errors(tree, source), [])

    def test_libstria_uses_and_arity(self):
        tree, source = self.parse("x = LibStria.f(a, b)\ny = LibStria.C\nz = LibStria.g(xs...)\n")
        self.assertEqual(self.cj.libstria_uses(tree, source), [("f", 2, 1), ("C", None, 2), ("g", None, 3)])

    def test_definitions(self):
        code = ("f(x) = 1\nfunction g(y::Int; k = 1) where {T}\nend\nconst C = 2\nmutable struct S\n a::Int\nend\n"
                "primitive type P <: AbstractFloat 16 end\nBase.show(io::IO, x::P) = 1\n_h(::Type{T}) where {T} = 1\n")
        tree, source = self.parse(code)
        names = self.cj.defined_names(tree, source)
        self.assertTrue({"f", "g", "C", "S", "P", "_h"} <= names, names)
        self.assertNotIn("show", names)

    def test_the_package_passes(self):
        out = io.StringIO()
        with redirect_stdout(out), redirect_stderr(out):
            rc = self.cj.main()
        self.assertEqual(rc, 0, out.getvalue())


if __name__ == "__main__":
    unittest.main()
