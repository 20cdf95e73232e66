#!/usr/bin/env python3
"""Generates the raw Julia binding LibStria.jl from the C header, with libclang.

    python3 bindings/julia/generate.py            # writes the committed files
    python3 bindings/julia/generate.py --out X --table Y   # elsewhere (the up-to-date check)

Reads capi/include/stria/stria.h and the DLPack header it includes, and writes
  - bindings/julia/Stria.jl/src/LibStria.jl: every constant macro, enum, struct, typedef and
    function of those headers; each function a `ccall((:name, libstria), ...)`;
  - bindings/julia/layout_table.json: what the Julia side assumes (struct sizes and field
    offsets by Julia's layout rules, alias sizes, constant values, ccall signatures), for the C
    checker (check_layout.py) to hold against the C compiler.

Anything the generator cannot represent exactly in Julia (bit-fields, unions, packed or
over-aligned structs, variadic functions, long double, ...) is an error, never a guess.
Needs Debian's python3-clang-14 (run it with /usr/bin/python3 when another Python is first on
PATH).
"""

import argparse
import glob
import json
import os
import re
import sys

import clang.cindex as ci

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(os.path.dirname(HERE))
DEFAULT_HEADER = os.path.join(REPO, "capi", "include", "stria", "stria.h")
DEFAULT_OUT = os.path.join(HERE, "Stria.jl", "src", "LibStria.jl")
DEFAULT_TABLE = os.path.join(HERE, "layout_table.json")

sys.path.insert(0, HERE)
import julia_layout  # noqa: E402  (after the path tweak)

# Typedef names kept as their Julia equivalents instead of following them to the builtin types
# (which differ between platforms: int64_t is `long` here and `long long` elsewhere).
STDINT = {
    "int8_t": "Int8",
    "int16_t": "Int16",
    "int32_t": "Int32",
    "int64_t": "Int64",
    "uint8_t": "UInt8",
    "uint16_t": "UInt16",
    "uint32_t": "UInt32",
    "uint64_t": "UInt64",
    "size_t": "Csize_t",
    "ssize_t": "Cssize_t",
    "ptrdiff_t": "Cptrdiff_t",
    "intptr_t": "Int",
    "uintptr_t": "UInt",
    "wchar_t": "Cwchar_t",
}

K = ci.TypeKind
BUILTINS = {
    K.VOID: "Cvoid",
    K.BOOL: "Bool",
    K.CHAR_S: "Cchar",
    K.CHAR_U: "Cchar",
    K.SCHAR: "Int8",
    K.UCHAR: "Cuchar",
    K.SHORT: "Cshort",
    K.USHORT: "Cushort",
    K.INT: "Cint",
    K.UINT: "Cuint",
    K.LONG: "Clong",
    K.ULONG: "Culong",
    K.LONGLONG: "Clonglong",
    K.ULONGLONG: "Culonglong",
    K.FLOAT: "Cfloat",
    K.DOUBLE: "Cdouble",
    K.WCHAR: "Cwchar_t",
}

# Julia words that cannot be plain identifiers (a C field or parameter with such a name is
# written var"name", Julia 1.3+).
JULIA_RESERVED = {
    "abstract", "baremodule", "begin", "break", "catch", "const", "continue", "do", "else",
    "elseif", "end", "export", "false", "finally", "for", "function", "global", "if", "import",
    "in", "isa", "let", "local", "macro", "module", "mutable", "outer", "primitive", "quote",
    "return", "struct", "true", "try", "type", "using", "where", "while",
}


class GenerationError(Exception):
    pass


def load_libclang():
    """Points clang.cindex at libclang: $LIBCLANG_PATH, else the LLVM 14 that python3-clang-14
    belongs to, else the newest /usr/lib/llvm-*/lib/libclang.so.1."""
    if ci.Config.loaded:
        return
    candidates = [os.environ.get("LIBCLANG_PATH", ""), "/usr/lib/llvm-14/lib/libclang.so.1"]
    candidates += sorted(glob.glob("/usr/lib/llvm-*/lib/libclang.so.1"), reverse=True)
    candidates += sorted(glob.glob("/usr/lib/*/libclang-*.so.1"), reverse=True)
    for path in candidates:
        if path and os.path.exists(path):
            ci.Config.set_library_file(path)
            return
    raise GenerationError("libclang not found: apt-get install libclang1-14, or set LIBCLANG_PATH")


def jl_ident(name):
    return f'var"{name}"' if name in JULIA_RESERVED else name


def _unnamed(cursor):
    s = cursor.spelling
    return not s or "(unnamed" in s or "(anonymous" in s


def _loc_key(cursor):
    loc = cursor.location
    return (loc.file.name if loc.file else "", loc.offset)


def _comment(cursor):
    """The declaration's C comment as Julia `#` lines (the text only, no delimiters)."""
    raw = cursor.raw_comment
    if not raw:
        return []
    text = raw.strip()
    if text.startswith("/*"):
        text = text[2:-2] if text.endswith("*/") else text[2:]
        text = text.lstrip("*!<")
    lines = []
    for line in text.splitlines():
        line = line.strip()
        line = re.sub(r"^(///?<?|\*+)\s?", "", line) if not line.startswith("*/") else ""
        line = re.sub(r"^\\brief\s+", "", line)  # Doxygen markup (DLPack's comments)
        lines.append(line.rstrip())
    while lines and not lines[0]:
        lines.pop(0)
    while lines and not lines[-1]:
        lines.pop()
    return ["# " + line if line else "#" for line in lines]


class Generator:
    def __init__(self, header, include_dirs, extra_headers, libname, module):
        self.header = os.path.realpath(header)
        self.include_dirs = include_dirs
        self.extra_headers = extra_headers  # path suffixes, e.g. "dlpack/dlpack.h"
        self.libname = libname
        self.module = module
        self.names = {}  # emitted Julia name -> what it is (to refuse clashes)
        self.record_names = {}  # location key of a record/enum definition -> Julia name
        self.typedef_of = {}  # location key of a record/enum -> typedef name naming it
        self.emitted_records = set()  # location keys of records emitted so far
        self.alias_names = set()  # typedef names emitted as `const X = T`
        self.c_names = {}  # Julia struct/alias name -> its C spelling (for the checker)
        self.out = []
        self.skipped_macros = []

    # ---- parsing -------------------------------------------------------------------------

    def _args(self):
        # Comments become the Julia side's comments, also those of DLPack (a system header).
        flags = ["-x", "c", "-std=c99", "-fparse-all-comments", "-fretain-comments-from-system-headers"]
        return flags + [f"-I{d}" for d in self.include_dirs]

    def parse(self):
        load_libclang()
        index = ci.Index.create()
        opts = ci.TranslationUnit.PARSE_DETAILED_PROCESSING_RECORD | ci.TranslationUnit.PARSE_SKIP_FUNCTION_BODIES
        self.tu = index.parse(self.header, args=self._args(), options=opts)
        errors = [str(d) for d in self.tu.diagnostics if d.severity >= ci.Diagnostic.Error]
        if errors:
            raise GenerationError("the header does not parse:\n  " + "\n  ".join(errors))
        self.index = index

    def _file_label(self, path):
        """A stable label for a source file (no absolute paths in the output)."""
        path = os.path.realpath(path)
        if path == self.header:
            parent = os.path.basename(os.path.dirname(path))
            return f"{parent}/{os.path.basename(path)}"
        for suffix in self.extra_headers:
            if path.endswith("/" + suffix):
                return suffix
        return None

    def _in_target(self, cursor):
        f = cursor.location.file
        return f is not None and self._file_label(f.name) is not None

    # ---- types -------------------------------------------------------------------------

    def _record_name(self, decl):
        key = _loc_key(decl)
        if key in self.record_names:
            return self.record_names[key]
        if not _unnamed(decl):
            return decl.spelling
        return self.typedef_of.get(key)

    def jl_type(self, t, where):
        """The Julia type for C type t (`where` names the declaration, for error messages)."""
        if t.kind == K.ELABORATED:
            return self.jl_type(t.get_named_type(), where)
        if t.kind == K.TYPEDEF:
            decl = t.get_declaration()
            name = decl.spelling
            if name in STDINT:
                return STDINT[name]
            if name in self.alias_names or (name in self.names and self._in_target(decl)):
                return name
            return self.jl_type(decl.underlying_typedef_type, where)
        if t.kind in BUILTINS:
            return BUILTINS[t.kind]
        if t.kind == K.POINTER:
            pointee = t.get_pointee()
            canon = pointee.get_canonical()
            if canon.kind in (K.FUNCTIONPROTO, K.FUNCTIONNOPROTO):
                return "Ptr{Cvoid}"  # a C function pointer: Julia passes it as an address
            if canon.kind == K.RECORD:
                decl = canon.get_declaration()
                definition = decl.get_definition()
                if definition is None:
                    return "Ptr{Cvoid}"  # opaque handle
                if _loc_key(definition) not in self.emitted_records:
                    # A pointer to a struct defined further down: Julia has no forward
                    # declarations, so it is passed as an untyped address.
                    return "Ptr{Cvoid}"
            return f"Ptr{{{self.jl_type(pointee, where)}}}"
        if t.kind == K.CONSTANTARRAY:
            return f"NTuple{{{t.element_count}, {self.jl_type(t.element_type, where)}}}"
        if t.kind == K.RECORD:
            decl = t.get_declaration()
            if decl.kind == ci.CursorKind.UNION_DECL:
                raise GenerationError(f"{where}: unions have no exact Julia equivalent")
            definition = decl.get_definition()
            if definition is None or _loc_key(definition) not in self.emitted_records:
                what = decl.spelling or "(unnamed)"
                raise GenerationError(f"{where}: struct {what} is used by value but not defined in the bound headers "
                                      "before this point")
            return self._record_name(definition)
        if t.kind == K.ENUM:
            decl = t.get_declaration()
            name = self._record_name(decl)
            if name:
                return name
            return self.jl_type(decl.enum_type, where)
        raise GenerationError(f"{where}: C type '{t.spelling}' ({t.kind.name}) has no exact Julia mapping")

    # ---- declarations ------------------------------------------------------------------

    def _claim(self, name, what):
        if name in self.names:
            raise GenerationError(f"Julia name {name} would name both {self.names[name]} and {what}")
        self.names[name] = what

    def _collect_typedefs(self):
        for cursor in self.tu.cursor.get_children():
            if cursor.kind != ci.CursorKind.TYPEDEF_DECL or not self._in_target(cursor):
                continue
            under = cursor.underlying_typedef_type
            if under.kind == K.ELABORATED:
                under = under.get_named_type()
            if under.kind in (K.RECORD, K.ENUM):
                decl = under.get_declaration()
                key = _loc_key(decl)
                if _unnamed(decl) and key not in self.typedef_of:
                    self.typedef_of[key] = cursor.spelling

    def emit_enum(self, cursor):
        name = self._record_name(cursor)
        int_type = self.jl_type(cursor.enum_type, f"enum {name}")
        self.out += _comment(cursor)
        if name:
            self._claim(name, "an enum")
            self.record_names[_loc_key(cursor)] = name
            self.alias_names.add(name)
            self.c_names[name] = name if name in self.typedef_of.values() else f"enum {name}"
            self.out.append(f"const {name} = {int_type}  # C enum")
            type_name = name
        else:
            type_name = int_type
        for const in cursor.get_children():
            if const.kind != ci.CursorKind.ENUM_CONSTANT_DECL:
                continue
            self._claim(const.spelling, "an enum constant")
            comment = _comment(const)
            self.out += comment
            self.out.append(f"const {const.spelling} = {type_name}({const.enum_value})")
        self.out.append("")

    def emit_struct(self, cursor):
        if cursor.kind == ci.CursorKind.UNION_DECL:
            raise GenerationError(f"union {cursor.spelling or '(unnamed)'}: unions have no exact Julia equivalent")
        name = self._record_name(cursor)
        if not name:
            raise GenerationError(f"an unnamed struct at {cursor.location} has no typedef to name it")
        for child in cursor.get_children():
            if child.kind in (ci.CursorKind.PACKED_ATTR,):
                raise GenerationError(f"struct {name} is packed: Julia structs cannot be")
            if child.kind == ci.CursorKind.ALIGNED_ATTR:
                raise GenerationError(f"struct {name} has an alignment attribute: Julia structs cannot")
            if child.kind in (ci.CursorKind.STRUCT_DECL, ci.CursorKind.UNION_DECL) and child.is_definition():
                if _unnamed(child):
                    raise GenerationError(f"struct {name}: anonymous nested structs/unions are not supported")
                self.emit_struct(child)  # a nested named definition: hoisted, C scopes it globally
        fields = []
        for child in cursor.get_children():
            if child.kind != ci.CursorKind.FIELD_DECL:
                continue
            where = f"{name}.{child.spelling}"
            if child.is_bitfield():
                raise GenerationError(f"{where} is a bit-field: Julia has no bit-fields")
            if child.type.get_canonical().kind == K.INCOMPLETEARRAY:
                raise GenerationError(f"{where} is a flexible array member")
            fields.append((child, self.jl_type(child.type, where)))
        if not fields:
            raise GenerationError(f"struct {name} has no fields")
        self._claim(name, "a struct")
        key = _loc_key(cursor)
        self.record_names[key] = name
        self.emitted_records.add(key)
        self.c_names[name] = name if self.typedef_of.get(key) == name else f"struct {name}"
        self.out += _comment(cursor)
        self.out.append(f"struct {name}")
        for child, jtype in fields:
            comment = _comment(child)
            line = f"    {jl_ident(child.spelling)}::{jtype}"
            if len(comment) == 1 and len(line) + 2 + len(comment[0]) <= 100:
                self.out.append(f"{line}  {comment[0]}")  # a short comment trails its field
            else:
                self.out += ["    " + c for c in comment]
                self.out.append(line)
        self.out.append("end")
        self.out.append("")

    def emit_typedef(self, cursor):
        name = cursor.spelling
        under = cursor.underlying_typedef_type
        named = under.get_named_type() if under.kind == K.ELABORATED else under
        if named.kind in (K.RECORD, K.ENUM):
            decl = named.get_declaration()
            target = self._record_name(decl)
            if target == name:
                return  # `typedef struct {...} name;` or `typedef struct name {...} name;`
            if decl.get_definition() is None:
                return  # an opaque struct: C can only point to it, and pointers to it are Ptr{Cvoid}
        if name in STDINT:
            return
        jtype = self.jl_type(under, f"typedef {name}")
        self._claim(name, "a typedef")
        self.alias_names.add(name)
        self.c_names[name] = name
        self.out += _comment(cursor)
        self.out.append(f"const {name} = {jtype}")
        self.out.append("")

    def emit_function(self, cursor):
        name = cursor.spelling
        ftype = cursor.type
        if ftype.kind == K.FUNCTIONNOPROTO:
            raise GenerationError(f"{name}() has no prototype: declare it {name}(void)")
        if ftype.is_function_variadic():
            raise GenerationError(f"{name} is variadic: ccall needs a fixed signature")
        ret = self.jl_type(ftype.get_result(), f"{name} (return)")
        params = list(cursor.get_arguments())
        types = [self.jl_type(t, f"{name} (parameter {i + 1})") for i, t in enumerate(ftype.argument_types())]
        taken = set(self.names) | {"libstria", self.module}
        args = []
        for i, p in enumerate(params):
            arg = p.spelling or f"arg{i + 1}"
            while arg in taken or arg in args:  # a parameter must not shadow a type or constant
                arg += "_"
            args.append(jl_ident(arg))
        self._claim(name, "a function")
        if len(types) == 0:
            tuple_text = "()"
        elif len(types) == 1:
            tuple_text = f"({types[0]},)"  # a 1-tuple needs its comma in Julia
        else:
            tuple_text = "(" + ", ".join(types) + ")"
        self.out += _comment(cursor)
        self.out.append(f"function {name}({', '.join(args)})")
        head = f"    ccall((:{name}, libstria), {ret},"
        call_args = ", ".join(args)
        one_line = f"{head} {tuple_text}" + (f", {call_args})" if args else ")")
        if len(one_line) <= 100:
            self.out.append(one_line)
        else:
            self.out.append(head)
            self.out += self._wrap(tuple_text, "          ", "," if args else ")")
            if args:
                self.out.append(f"          {call_args})")
        self.out.append("end")
        self.out.append("")

    @staticmethod
    def _wrap(tuple_text, indent, end):
        """A ccall type tuple over lines of at most 100 characters (breaking after commas)."""
        lines, cur = [], indent
        for part in re.split(r"(?<=,) ", tuple_text):
            if len(cur) + len(part) + 1 > 100 and cur.strip():
                lines.append(cur.rstrip())
                cur = indent + " "
            cur += part + " "
        lines.append(cur.rstrip() + end)
        return lines

    # ---- macros ------------------------------------------------------------------------

    _OPERATORS = {"(", ")", "+", "-", "*", "/", "%", "<<", ">>", "&", "|", "^", "~", "!", "<", ">", "<=", ">=",
                  "==", "!=", "&&", "||", "?", ":"}

    def _macro_candidates(self):
        """Object-like macros of the bound headers, with their replacement tokens."""
        macros = []
        for cursor in self.tu.cursor.get_children():
            if cursor.kind != ci.CursorKind.MACRO_DEFINITION or not self._in_target(cursor):
                continue
            tokens = list(cursor.get_tokens())
            if not tokens:
                continue
            body = tokens[1:]
            if body and body[0].spelling == "(" and body[0].extent.start.offset == tokens[0].extent.end.offset:
                continue  # function-like: a binding cannot expand it
            macros.append((cursor, [t for t in body]))
        return macros

    def _evaluate_macros(self, macros):
        """name -> ("int", value) | ("float", text) | None (not a constant)."""
        values, integer_exprs = {}, []
        for cursor, body in macros:
            name = cursor.spelling
            if not body:
                values[name] = None  # an include guard or an empty marker
                continue
            kinds_ok = True
            has_float = False
            for tok in body:
                s = tok.spelling
                if tok.kind == ci.TokenKind.LITERAL:
                    if s.startswith(("'", '"')):
                        kinds_ok = False
                    elif re.fullmatch(r"(0[xX][0-9a-fA-F]+|\d+)[uUlL]*", s) is None:
                        has_float = True
                elif tok.kind == ci.TokenKind.PUNCTUATION:
                    kinds_ok &= s in self._OPERATORS
                elif tok.kind == ci.TokenKind.IDENTIFIER:
                    kinds_ok &= values.get(s) is not None and values[s][0] == "int"
                else:
                    kinds_ok = False
            if not kinds_ok:
                values[name] = None
                self.skipped_macros.append(name)
            elif has_float:
                if len(body) == 1 and re.fullmatch(r"[0-9.eE+-]+[fFlL]?", body[0].spelling):
                    values[name] = ("float", repr(float(body[0].spelling.rstrip("fFlL"))))
                else:
                    values[name] = None
                    self.skipped_macros.append(name)
            else:
                values[name] = ("int", None)  # filled below by the compiler's own evaluation
                integer_exprs.append(name)
        if integer_exprs:
            # Let clang evaluate the integer expressions with C's rules (integer division,
            # promotions): as enumerators of one enum in a translation unit that includes
            # the header.
            lines = [f'#include "{self.header}"', "enum stria_generate_macro_values_ {"]
            lines += [f"  stria_generate_macro_value_{i} = ({n})," for i, n in enumerate(integer_exprs)]
            lines.append("};")
            src = "stria_generate_macros.c"
            tu = self.index.parse(src, args=self._args(), unsaved_files=[(src, "\n".join(lines) + "\n")])
            errors = [str(d) for d in tu.diagnostics if d.severity >= ci.Diagnostic.Error]
            if errors:
                raise GenerationError("evaluating macros failed:\n  " + "\n  ".join(errors))
            found = {}
            for cursor in tu.cursor.get_children():
                if cursor.kind == ci.CursorKind.ENUM_DECL and cursor.spelling == "stria_generate_macro_values_":
                    for c in cursor.get_children():
                        found[c.spelling] = c.enum_value
            for i, n in enumerate(integer_exprs):
                values[n] = ("int", found[f"stria_generate_macro_value_{i}"])
        return values

    def emit_macros(self):
        macros = self._macro_candidates()
        values = self._evaluate_macros(macros)
        for cursor, _ in macros:
            value = values[cursor.spelling]
            if value is None:
                continue
            self._claim(cursor.spelling, "a macro constant")
            self.out += _comment(cursor)
            self.out.append(f"const {cursor.spelling} = {value[1]}")
        self.out.append("")
        return values

    # ---- the whole file ----------------------------------------------------------------

    def generate(self):
        self.parse()
        self._collect_typedefs()
        labels = [self._file_label(self.header)] + list(self.extra_headers)
        body_start = len(self.out)
        self.out.append("# ---- constants (object-like macros, evaluated by the C front end) ----")
        macro_values = self.emit_macros()
        current = None
        for cursor in self.tu.cursor.get_children():
            if not self._in_target(cursor):
                continue
            kind = cursor.kind
            if kind in (ci.CursorKind.MACRO_DEFINITION, ci.CursorKind.INCLUSION_DIRECTIVE,
                        ci.CursorKind.MACRO_INSTANTIATION):
                continue
            label = self._file_label(cursor.location.file.name)
            if label != current:
                self.out.append(f"# ---- {label} ----")
                self.out.append("")
                current = label
            if kind == ci.CursorKind.ENUM_DECL and cursor.is_definition():
                self.emit_enum(cursor)
            elif kind in (ci.CursorKind.STRUCT_DECL, ci.CursorKind.UNION_DECL):
                if cursor.is_definition():
                    self.emit_struct(cursor)
            elif kind == ci.CursorKind.TYPEDEF_DECL:
                self.emit_typedef(cursor)
            elif kind == ci.CursorKind.FUNCTION_DECL:
                self.emit_function(cursor)
            elif kind == ci.CursorKind.VAR_DECL:
                raise GenerationError(f"global variable {cursor.spelling}: not supported (use cglobal by hand)")
            elif kind == ci.CursorKind.ENUM_DECL:
                continue  # a forward declaration
            else:
                raise GenerationError(f"unexpected declaration {cursor.spelling} ({kind.name})")
        body = self.out[body_start:]
        while body and body[-1] == "":
            body.pop()

        head = [
            f"# Generated by bindings/julia/generate.py from {' and '.join(labels)}: do not edit.",
            "# Regenerate with `/usr/bin/python3 bindings/julia/generate.py` after changing the header;",
            "# scripts/test-julia.sh fails while this file is out of date.",
            "#",
            "# The raw C ABI, one to one: C enums are integer aliases with typed constants, C structs",
            "# are isbits `struct`s (Julia lays them out like C; layout_table.json records what this",
            "# file assumes and a C program checks it), pointers are Ptr{T}, `const` is dropped, C",
            "# function pointers and opaque handles are Ptr{Cvoid}, fixed-size arrays are NTuple.",
            "# Every function returns what the C function returns (a status code: check it).",
        ]
        if self.skipped_macros:
            head.append(f"# Macros that are not constants (not translated): {', '.join(self.skipped_macros)}.")
        head += [
            f"module {self.module}",
            "",
            "# The library is named by its SONAME, so that ccall resolves it by the dynamic linker's",
            "# search (LD_LIBRARY_PATH, the ld.so cache), or to a copy already loaded by its full path",
            "# (Stria.jl does that for STRIA_LIB): the dynamic linker matches a loaded library by SONAME.",
            f'const libstria = "{self.libname}"',
            "",
        ]
        exported = list(self.names)
        export_lines, line = [], "export"
        for n in exported:
            if len(line) + len(n) + 2 > 100:
                export_lines.append(line.rstrip(","))
                line = "export"
            line += f" {n},"
        export_lines.append(line.rstrip(","))
        text = "\n".join(head + body + [""] + export_lines + ["", f"end # module {self.module}", ""])
        return text, macro_values


def signatures_from_julia(source):
    """[(name, return type, [(arg, type)])] of the ccall wrappers in LibStria.jl text."""
    result = []
    for m in re.finditer(r"^function (\w+)\((.*?)\)\n(.*?)^end$", source, re.M | re.S):
        name, params, body = m.group(1), m.group(2), " ".join(m.group(3).split())
        call = re.fullmatch(r"ccall\(\(:(\w+), libstria\), (.*)\)", body)
        if not call:
            raise GenerationError(f"wrapper {name}: its body is not one ccall((:name, libstria), ...)")
        if call.group(1) != name:
            raise GenerationError(f"wrapper {name} calls the C symbol {call.group(1)}")
        ret, types_text, *passed = split_top_level(call.group(2))
        if not (types_text.startswith("(") and types_text.endswith(")")):
            raise GenerationError(f"wrapper {name}: the argument types are not a tuple: {types_text}")
        types = split_top_level(types_text[1:-1])
        args = [a.strip() for a in params.split(",")] if params.strip() else []
        if len(types) != len(args) or passed != args:
            raise GenerationError(f"wrapper {name}: parameters {args}, ccall types {types}, passed {passed}")
        result.append((name, ret, list(zip(args, types))))
    return result


def split_top_level(text):
    """Splits `A, Ptr{B}, NTuple{2, C}` at the commas outside brackets; drops a trailing comma."""
    parts, depth, cur = [], 0, ""
    for ch in text:
        if ch in "{(":
            depth += 1
        elif ch in "})":
            depth -= 1
        if ch == "," and depth == 0:
            parts.append(cur.strip())
            cur = ""
        else:
            cur += ch
    if cur.strip():
        parts.append(cur.strip())
    return parts


def constants_from_julia(source):
    """[(name, int value)] of `const NAME = 60` and `const NAME = T(60)` lines."""
    pattern = re.compile(r"^const (\w+) = (?:\w+\()?(-?\d+)\)?\s*$", re.M)
    return [(m.group(1), int(m.group(2))) for m in pattern.finditer(source)]


def layout_table(source, c_names, label):
    """What the Julia text assumes, computed by Julia's rules from the Julia text itself."""
    order, structs, aliases = julia_layout.parse_julia(source)
    layout = julia_layout.JuliaLayout(structs, aliases)
    table = {
        "comment": "Generated by bindings/julia/generate.py: the layouts LibStria.jl assumes, computed by "
                   "Julia's C layout rules from its own field types. check_layout.py holds them against the C "
                   "compiler.",
        "header": label,
        "pointer_size": julia_layout.POINTER_SIZE,
        "structs": [],
        "aliases": [],
        "constants": [{"name": n, "value": v} for n, v in constants_from_julia(source)],
        "functions": [],
    }
    for name in order:
        lay = layout.struct_layout(name)
        table["structs"].append({"julia": name, "c": c_names.get(name, name), "size": lay["size"],
                                 "align": lay["align"], "fields": lay["fields"]})
    for name, rhs in aliases.items():
        if name == "libstria":
            continue
        size, align = layout.size_align(rhs)
        table["aliases"].append({"julia": name, "c": c_names.get(name, name), "julia_type": rhs, "size": size,
                                 "align": align, "kind": layout.kind(rhs)})
    for name, ret, args in signatures_from_julia(source):
        arg_entries = [{"name": a, "julia_type": t} for a, t in args]
        table["functions"].append({"name": name, "return": ret, "args": arg_entries})
    return table


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--header", default=DEFAULT_HEADER)
    ap.add_argument("-I", dest="include_dirs", action="append", default=None,
                    help="include directories (default: the header's include root)")
    ap.add_argument("--also", action="append", default=None,
                    help="bind the declarations of included headers with this path suffix too "
                         "(default: dlpack/dlpack.h)")
    ap.add_argument("--libname", default=None, help="the library's SONAME (default libstria.so.<MAJOR>)")
    ap.add_argument("--module", default="LibStria")
    ap.add_argument("--out", default=DEFAULT_OUT)
    ap.add_argument("--table", default=DEFAULT_TABLE)
    args = ap.parse_args(argv)
    include_dirs = args.include_dirs or [os.path.dirname(os.path.dirname(os.path.realpath(args.header)))]
    also = args.also if args.also is not None else ["dlpack/dlpack.h"]
    gen = Generator(args.header, include_dirs, also, args.libname or "", args.module)
    try:
        if not args.libname:
            # The SONAME carries the major version; read it from the header itself.
            probe = Generator(args.header, include_dirs, also, "", args.module)
            probe.parse()
            values = probe._evaluate_macros(probe._macro_candidates())
            major = values.get("STRIA_VERSION_MAJOR")
            if not major:
                raise GenerationError("no STRIA_VERSION_MAJOR in the header: pass --libname")
            gen.libname = f"libstria.so.{major[1]}"
        text, _ = gen.generate()
        table = layout_table(text, gen.c_names, gen._file_label(gen.header))
    except (GenerationError, julia_layout.LayoutError) as e:
        print(f"generate.py: error: {e}", file=sys.stderr)
        return 1
    os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)
    with open(args.out, "w", encoding="utf-8") as f:
        f.write(text)
    with open(args.table, "w", encoding="utf-8") as f:
        json.dump(table, f, indent=1, sort_keys=False)
        f.write("\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
