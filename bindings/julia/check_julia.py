#!/usr/bin/env python3
"""Static checks of the hand-written Julia (no Julia runs here).

    python3 bindings/julia/check_julia.py

- every .jl file of Stria.jl (src, test, examples) parses with tree-sitter-julia, with no
  error or missing node;
- every `LibStria.name` the hand-written files use exists in the generated LibStria.jl, and a
  call `LibStria.f(...)` passes as many arguments as the wrapper takes;
- every internal helper the package calls (`_name(...)`) is defined in src/, every name that
  module Stria exports is defined there, and every include() names an existing file;
- Project.toml's version is the header's STRIA_VERSION_MAJOR.MINOR.PATCH.

Needs the Python packages tree-sitter and tree-sitter-julia (scripts/test-julia.sh installs
them into .venv-julia). Exit status 0 when everything holds.
"""

import os
import re
import sys
import tomllib

import tree_sitter
import tree_sitter_julia

HERE = os.path.dirname(os.path.abspath(__file__))
PACKAGE = os.path.join(HERE, "Stria.jl")
sys.path.insert(0, HERE)

from generate import signatures_from_julia  # noqa: E402


def parser():
    return tree_sitter.Parser(tree_sitter.Language(tree_sitter_julia.language()))


def text(node, source):
    return source[node.start_byte:node.end_byte].decode()


def walk(node):
    yield node
    for child in node.children:
        yield from walk(child)


def syntax_errors(tree, source):
    errors = []
    for node in walk(tree.root_node):
        if node.type == "ERROR" or node.is_missing:
            line = node.start_point[0] + 1
            snippet = text(node, source).splitlines()[0][:60] if text(node, source) else node.type
            errors.append(f"line {line}: {'missing ' + node.type if node.is_missing else 'cannot parse'}: {snippet!r}")
    return errors


def callee_name(call, source):
    """The name a call_expression calls: `f` for f(x); None for a.b(x) or anything else."""
    head = call.named_children[0] if call.named_children else None
    return text(head, source) if head is not None and head.type == "identifier" else None


def defined_names(tree, source):
    """Names that a Julia file defines: functions (long and short form), consts, globals,
    structs, primitive types, macros and modules."""
    names = set()

    def signature_name(node):
        while node is not None and node.type in ("where_expression", "signature", "typed_expression"):
            node = node.named_children[0] if node.named_children else None
        if node is not None and node.type == "call_expression":
            return callee_name(node, source)
        if node is not None and node.type == "identifier":
            return text(node, source)
        return None

    for node in walk(tree.root_node):
        if node.type == "function_definition":
            sig = next((c for c in node.named_children if c.type == "signature"), None)
            name = signature_name(sig)
        elif node.type == "assignment":
            name = signature_name(node.named_children[0])
        elif node.type in ("struct_definition", "primitive_definition", "abstract_definition"):
            head = next((c for c in node.named_children if c.type == "type_head"), None)
            first = head.named_children[0] if head is not None else None
            while first is not None and first.type != "identifier":
                first = first.named_children[0] if first.named_children else None
            name = text(first, source) if first is not None else None
        elif node.type == "macro_definition":
            sig = next((c for c in node.named_children if c.type == "signature"), None)
            name = "@" + (signature_name(sig) or "")
        elif node.type == "module_definition":
            name = text(node.named_children[0], source)
        else:
            continue
        if name:
            names.add(name)
    return names


def libstria_uses(tree, source):
    """[(name, number of positional arguments or None, line)] of LibStria.name uses."""
    uses = []
    for node in walk(tree.root_node):
        if node.type != "field_expression" or len(node.named_children) != 2:
            continue
        base, field = node.named_children
        if text(base, source) != "LibStria" or field.type != "identifier":
            continue
        arity = None
        parent = node.parent
        if parent is not None and parent.type == "call_expression" and parent.named_children[0] == node:
            args = next((c for c in parent.named_children if c.type == "argument_list"), None)
            if args is not None:
                items = [c for c in args.named_children if c.type not in ("named_argument", "comment")]
                if not any(c.type == "splat_expression" for c in items) and ";" not in text(args, source):
                    arity = len(items)
        uses.append((text(field, source), arity, node.start_point[0] + 1))
    return uses


def internal_calls(tree, source):
    """[(name, line)] of calls to `_helper(...)` functions."""
    calls = []
    for node in walk(tree.root_node):
        if node.type == "call_expression":
            name = callee_name(node, source)
            if name and name.startswith("_"):
                calls.append((name, node.start_point[0] + 1))
    return calls


def main():
    failures = []
    p = parser()
    generated_path = os.path.join(PACKAGE, "src", "LibStria.jl")
    with open(generated_path, encoding="utf-8") as f:
        generated = f.read()
    wrappers = {name: len(args) for name, _, args in signatures_from_julia(generated)}
    generated_names = set(wrappers) | set(re.findall(r"^(?:const|struct) (\w+)", generated, re.M))
    generated_names.add("libstria")

    files = []
    for sub in ("src", "test", "examples"):
        for root, _, names in os.walk(os.path.join(PACKAGE, sub)):
            files += [os.path.join(root, n) for n in sorted(names) if n.endswith(".jl")]
    src_defined, src_calls, exports = set(), [], []
    for path in sorted(files):
        rel = os.path.relpath(path, HERE)
        with open(path, "rb") as f:
            source = f.read()
        tree = p.parse(source)
        failures += [f"{rel}: {e}" for e in syntax_errors(tree, source)]
        if os.path.basename(path) == "LibStria.jl":
            continue
        for name, arity, line in libstria_uses(tree, source):
            if name not in generated_names:
                failures.append(f"{rel}:{line}: LibStria.{name} is not in the generated LibStria.jl")
            elif arity is not None and name in wrappers and arity != wrappers[name]:
                failures.append(f"{rel}:{line}: LibStria.{name} takes {wrappers[name]} arguments, given {arity}")
        for m in re.finditer(rb'include\("([^"]+)"\)', source):
            if not os.path.isfile(os.path.join(os.path.dirname(path), m.group(1).decode())):
                failures.append(f"{rel}: include(\"{m.group(1).decode()}\") names no file")
        if path.startswith(os.path.join(PACKAGE, "src")):
            src_defined |= defined_names(tree, source)
            src_calls += [(rel, name, line) for name, line in internal_calls(tree, source)]
            for node in walk(tree.root_node):
                if node.type == "export_statement":
                    exports += [(rel, text(c, source)) for c in node.named_children if c.type == "identifier"]
    for rel, name, line in src_calls:
        if name not in src_defined:
            failures.append(f"{rel}:{line}: {name}(...) is called but not defined in src/")
    for rel, name in exports:
        if name not in src_defined:
            failures.append(f"{rel}: exports {name}, which src/ does not define")

    with open(os.path.join(PACKAGE, "Project.toml"), "rb") as f:
        project = tomllib.load(f)
    consts = dict(re.findall(r"^const (STRIA_VERSION_(?:MAJOR|MINOR|PATCH)) = (\d+)$", generated, re.M))
    header_version = ".".join(consts.get(f"STRIA_VERSION_{k}", "?") for k in ("MAJOR", "MINOR", "PATCH"))
    if project.get("version") != header_version:
        failures.append(f"Project.toml version {project.get('version')} is not the header's {header_version}")
    if project.get("name") != "Stria" or not re.fullmatch(r"[0-9a-f]{8}(-[0-9a-f]{4}){3}-[0-9a-f]{12}",
                                                            project.get("uuid", "")):
        failures.append("Project.toml needs name = \"Stria\" and a UUID")

    for failure in failures:
        print(f"FAIL {failure}", file=sys.stderr)
    print(f"check_julia: {len(files)} Julia files parsed, {len(exports)} exports, "
          f"{len(src_calls)} internal calls, {len(failures)} problems")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
