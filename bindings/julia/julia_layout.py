"""Julia's C-compatible layout rules, applied to the Julia source text that generate.py emits.

The layout table that the C checker verifies is computed here from the *Julia* declarations
(field types as written in LibStria.jl), never from libclang's offsets: that is what lets the
check fail when the generator maps a C type to a Julia type of another size or alignment.

Julia lays out an isbits `struct` like C: each field at the next multiple of its alignment, the
size rounded up to the largest field alignment; an isbits struct or NTuple field is stored
inline. The sizes below are those of a 64-bit Linux Julia (LP64: Clong is 64 bits), the only
target this binding claims.
"""

import re

POINTER_SIZE = 8

# Julia primitive type name -> (size, kind). Alignment of a primitive equals its size here.
# kind: "signed", "unsigned", "float", "bool", "char" (C's plain char: signed on x86-64, unsigned
# on aarch64; Julia's Cchar follows the platform).
PRIMITIVES = {
    "Cvoid": (0, "void"),
    "Bool": (1, "bool"),
    "Cchar": (1, "char"),
    "Int8": (1, "signed"),
    "UInt8": (1, "unsigned"),
    "Cuchar": (1, "unsigned"),
    "Int16": (2, "signed"),
    "UInt16": (2, "unsigned"),
    "Cshort": (2, "signed"),
    "Cushort": (2, "unsigned"),
    "Int32": (4, "signed"),
    "UInt32": (4, "unsigned"),
    "Cint": (4, "signed"),
    "Cuint": (4, "unsigned"),
    "Cwchar_t": (4, "signed"),
    "Int64": (8, "signed"),
    "UInt64": (8, "unsigned"),
    "Int": (8, "signed"),
    "UInt": (8, "unsigned"),
    "Clong": (8, "signed"),
    "Culong": (8, "unsigned"),
    "Clonglong": (8, "signed"),
    "Culonglong": (8, "unsigned"),
    "Csize_t": (8, "unsigned"),
    "Cssize_t": (8, "signed"),
    "Cptrdiff_t": (8, "signed"),
    "Float16": (2, "float"),
    "Float32": (4, "float"),
    "Cfloat": (4, "float"),
    "Float64": (8, "float"),
    "Cdouble": (8, "float"),
}


class LayoutError(Exception):
    pass


def parse_type(text):
    """Parses a Julia type expression of the subset we emit: Name, Name{args...}, integers.

    Returns a nested tuple: ("name", "Cint"), ("int", 128) or ("apply", "NTuple", [args]).
    """
    tokens = re.findall(r"[A-Za-z_][A-Za-z_0-9]*|\d+|[{},]|\S", text)
    pos = 0

    def expr():
        nonlocal pos
        if pos >= len(tokens):
            raise LayoutError(f"unexpected end of type {text!r}")
        tok = tokens[pos]
        pos += 1
        if tok.isdigit():
            return ("int", int(tok))
        if not re.match(r"[A-Za-z_]", tok):
            raise LayoutError(f"unexpected {tok!r} in type {text!r}")
        if pos < len(tokens) and tokens[pos] == "{":
            pos += 1
            args = [expr()]
            while pos < len(tokens) and tokens[pos] == ",":
                pos += 1
                args.append(expr())
            if pos >= len(tokens) or tokens[pos] != "}":
                raise LayoutError(f"expected '}}' in type {text!r}")
            pos += 1
            return ("apply", tok, args)
        return ("name", tok)

    result = expr()
    if pos != len(tokens):
        raise LayoutError(f"trailing text in type {text!r}")
    return result


_STRUCT_RE = re.compile(r"^struct (\w+)\n(.*?)^end\n", re.M | re.S)
_FIELD_RE = re.compile(r'^\s+(\w+|var"\w+")::([^#]+?)\s*(?:#.*)?$')
_ALIAS_RE = re.compile(r"^const (\w+) = (.+?)\s*(?:#.*)?$", re.M)


def parse_julia(source):
    """Extracts the structs (name -> [(field, type text)]) and type aliases of LibStria.jl-style text.

    `const X = T` counts as an alias when T parses as a type expression naming a known type;
    `const K = T(1)` or `const V = 60` are value constants and are skipped.
    """
    structs = {}
    order = []
    for m in _STRUCT_RE.finditer(source):
        fields = []
        for line in m.group(2).splitlines():
            if not line.strip() or line.strip().startswith("#"):
                continue
            fm = _FIELD_RE.match(line)
            if not fm:
                raise LayoutError(f"struct {m.group(1)}: cannot read field line {line!r}")
            name = fm.group(1)
            if name.startswith('var"'):
                name = name[4:-1]
            fields.append((name, fm.group(2)))
        structs[m.group(1)] = fields
        order.append(m.group(1))
    aliases = {}
    for m in _ALIAS_RE.finditer(source):
        rhs = m.group(2)
        if "(" in rhs or '"' in rhs or re.fullmatch(r"-?\d+(\.\d*)?", rhs):
            continue
        aliases[m.group(1)] = rhs
    return order, structs, aliases


class JuliaLayout:
    """Sizes, alignments and field offsets of Julia types, by Julia's rules."""

    def __init__(self, structs, aliases):
        self.structs = structs
        self.aliases = aliases
        self._cache = {}

    def size_align(self, type_text):
        return self._size_align(parse_type(type_text))

    def kind(self, type_text):
        """"pointer", "struct", or a PRIMITIVES kind, after resolving aliases."""
        t = parse_type(type_text)
        while t[0] == "name" and t[1] in self.aliases:
            t = parse_type(self.aliases[t[1]])
        if t[0] == "apply" and t[1] == "Ptr":
            return "pointer"
        if t[0] == "apply" and t[1] == "NTuple":
            return "tuple"
        if t[0] == "name" and t[1] in self.structs:
            return "struct"
        if t[0] == "name" and t[1] in PRIMITIVES:
            return PRIMITIVES[t[1]][1]
        raise LayoutError(f"unknown Julia type {type_text!r}")

    def _size_align(self, t):
        if t[0] == "apply":
            if t[1] == "Ptr":
                return POINTER_SIZE, POINTER_SIZE
            if t[1] == "NTuple":
                if len(t[2]) != 2 or t[2][0][0] != "int":
                    raise LayoutError(f"NTuple needs a count and a type: {t}")
                size, align = self._size_align(t[2][1])
                return t[2][0][1] * size, align
            raise LayoutError(f"no layout rule for {t[1]}{{...}}")
        if t[0] != "name":
            raise LayoutError(f"not a type: {t}")
        name = t[1]
        if name in PRIMITIVES:
            size = PRIMITIVES[name][0]
            if size == 0:
                raise LayoutError("Cvoid has no layout (only Ptr{Cvoid} has)")
            return size, size
        if name in self.aliases:
            return self.size_align(self.aliases[name])
        if name in self.structs:
            return self.struct_layout(name)["size"], self.struct_layout(name)["align"]
        raise LayoutError(f"unknown Julia type {name!r}")

    def struct_layout(self, name):
        """{"size", "align", "fields": [{"name", "julia_type", "offset", "size"}]}."""
        if name in self._cache:
            return self._cache[name]
        offset, max_align, fields = 0, 1, []
        for field, type_text in self.structs[name]:
            size, align = self.size_align(type_text)
            offset = (offset + align - 1) // align * align
            fields.append({"name": field, "julia_type": type_text, "offset": offset, "size": size})
            offset += size
            max_align = max(max_align, align)
        if not fields:
            raise LayoutError(f"struct {name} has no fields (C has no empty structs)")
        size = (offset + max_align - 1) // max_align * max_align
        result = {"size": size, "align": max_align, "fields": fields}
        self._cache[name] = result
        return result
