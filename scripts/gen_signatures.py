#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
"""gen_signatures.py - write python/ferry/_signatures.py from the headers.

The binding's ctypes restype and argtypes of every FERRY_API function of
include/ferry.h and include/ferry_experimental.h, but those python/ferry/_lib.py
declares itself (the ones it passes to _bind as a dict literal: version, ABI
queries, ferry_store_get_stats) and those it lists in _lib.UNBOUND. Struct
pointers are typed with the mirror of python/ferry/_structs.py whose
_ferry_name_ is the struct's; a struct with no mirror there is a void pointer.

  scripts/gen_signatures.py           rewrite python/ferry/_signatures.py
  scripts/gen_signatures.py --check   exit 1, with a diff, where it differs

The header's declarations are read with a small parser of its FERRY_API lines
(one declaration may span several lines; comments and preprocessor lines are
dropped first); tests/py/test_binding_signatures.py uses it too. Standard
library only: it imports neither ferry nor libferry.so.
"""
import ast
import difflib
import os
import re
import sys

ROOT = os.path.normpath(os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
HEADERS = [os.path.join(ROOT, "include", h) for h in ("ferry.h", "ferry_experimental.h")]
LIB = os.path.join(ROOT, "python", "ferry", "_lib.py")
STRUCTS = os.path.join(ROOT, "python", "ferry", "_structs.py")
OUT = os.path.join(ROOT, "python", "ferry", "_signatures.py")

# C scalar type -> the name of the ctypes type the binding uses
SCALARS = {
    "int": "_i32", "unsigned": "_u32", "unsigned int": "_u32",
    "int32_t": "_i32", "uint32_t": "_u32",
    "int64_t": "_i64", "uint64_t": "_u64",
    "size_t": "ctypes.c_size_t", "double": "ctypes.c_double", "float": "ctypes.c_float",
}
# opaque handles (pointers to them are void pointers in the binding)
OPAQUE = {"ferry_ctx", "ferry_file", "ferry_device", "ferry_store", "ferry_model", "ferry_loaded",
          "ferry_op", "ferry_streamer", "ferry_keep"}


def read_headers(paths=HEADERS):
    text = ""
    for h in paths:
        with open(h) as f:
            text += f.read() + "\n"
    return text


def header_functions(text):
    """{name: (return C type, [argument C types], enum type names)} of every
    FERRY_API function, in the headers' order."""
    text = re.sub(r"/\*.*?\*/", " ", text, flags=re.S)
    text = re.sub(r"//[^\n]*", " ", text)
    text = "\n".join(line for line in text.splitlines() if not line.lstrip().startswith("#"))
    enums = set(re.findall(r"typedef\s+enum\s+\w*\s*\{[^}]*\}\s*(\w+)\s*;", text, flags=re.S))
    out = {}
    for decl in re.findall(r"FERRY_API\s+([^;{}]*?\))\s*;", text, flags=re.S):
        decl = " ".join(decl.split())
        m = re.match(r"(.*?)\b(\w+)\s*\((.*)\)$", decl)
        if not m:
            raise ValueError(f"cannot read the declaration {decl!r}")
        ret, name, args = m.group(1).strip(), m.group(2), m.group(3).strip()
        params = [] if args in ("", "void") else [a.strip() for a in args.split(",")]
        out[name] = (ret, [strip_name(p) for p in params], enums)
    return out


def strip_name(param):
    """"const char *name" -> "const char *"; "int i" -> "int"."""
    m = re.match(r"(.*?[\s*])(\w+)$", param)
    if m and m.group(2) not in SCALARS and not m.group(2).startswith("ferry_"):
        return m.group(1).strip()
    return param


def ctypes_expr(ctype, enums, mirrors):
    """The Python expression (in _signatures' names) a C type is bound as."""
    t = " ".join(ctype.replace("*", " * ").split())
    t = " ".join(re.sub(r"\bconst\b", "", t).split())
    stars = t.count("*")
    base = t.replace("*", "").strip()
    if base.startswith("struct "):
        base = base[len("struct "):]
    if stars == 0:
        if base == "void":
            return "None"
        if base in enums:
            return "_i32"
        return SCALARS[base]
    if stars == 1:
        if base == "char":
            return "_cp"
        if base == "void" or base in OPAQUE:
            return "_vp"
        if base in mirrors:
            return f"_P({mirrors[base]})"
        if base.startswith("ferry_") and base not in enums:
            return "_vp"  # a struct the binding has no mirror of: passed as NULL
        if base in enums:
            return "_P(_i32)"
        return f"_P({SCALARS[base]})"
    if stars == 2:
        if base == "char":
            return "_P(_cp)"
        if base == "void" or base in OPAQUE:
            return "_P(_vp)"
    raise ValueError(f"no ctypes rule for the C type {ctype!r}")


def struct_mirrors(path=STRUCTS):
    """{C struct name: class name} of the mirrors in _structs.py."""
    out = {}
    for node in ast.parse(open(path).read()).body:
        if isinstance(node, ast.ClassDef):
            for st in node.body:
                if (isinstance(st, ast.Assign) and [getattr(t, "id", None) for t in st.targets] == ["_ferry_name_"]
                        and isinstance(st.value, ast.Constant) and st.value.value):
                    out[st.value.value] = node.name
    return out


def lib_names(path=LIB):
    """(names _lib binds itself, names _lib.UNBOUND lists) read from _lib.py."""
    own, unbound = set(), set()
    for node in ast.walk(ast.parse(open(path).read())):
        if (isinstance(node, ast.Call) and getattr(node.func, "id", None) == "_bind" and node.args
                and isinstance(node.args[0], ast.Dict)):
            own.update(k.value for k in node.args[0].keys if isinstance(k, ast.Constant))
        if isinstance(node, ast.Assign) and [getattr(t, "id", None) for t in node.targets] == ["UNBOUND"]:
            unbound.update(eval(compile(ast.Expression(node.value), path, "eval"), {"__builtins__": {}}))
    return own, unbound


HEAD = '''# SPDX-License-Identifier: Apache-2.0
# Generated from include/ferry.h and include/ferry_experimental.h by
# scripts/gen_signatures.py: edit the headers (or _lib.py, _structs.py) and run it
# again; ctest python_signatures fails while this file differs from its output.
"""_signatures - the restype and argtypes of each function of ferry.h the
binding calls, beyond the few _lib declares itself to load and check the
library (version, ABI queries, ferry_store_get_stats, whose struct _lib
declares). _lib binds them; tests/py/test_binding_signatures.py checks every
one against include/ferry.h.
"""
import ctypes

'''

TYPES = '''
_vp = ctypes.c_void_p
_i32, _u32, _i64, _u64 = ctypes.c_int, ctypes.c_uint32, ctypes.c_int64, ctypes.c_uint64
_cp = ctypes.c_char_p
_P = ctypes.POINTER

# name: (restype, argtypes)
FUNCTIONS = {
'''


def generate():
    funcs = header_functions(read_headers())
    mirrors = struct_mirrors()
    own, unbound = lib_names()
    lines, used = [], set()
    for name, (ret, args, enums) in funcs.items():
        if name in own or name in unbound:
            continue
        exprs = [ctypes_expr(c, enums, mirrors) for c in [ret] + args]
        used.update(m.group(1) for e in exprs for m in [re.match(r"_P\((\w+)\)$", e)]
                    if m and m.group(1) in mirrors.values())
        lines.append(f'    "{name}": ({exprs[0]}, [{", ".join(exprs[1:])}]),\n')
    imports = ""
    if used:
        names, row, rows = sorted(used), "from ._structs import (", []
        for i, n in enumerate(names):
            piece = n + (", " if i < len(names) - 1 else ")")
            if len(row) + len(piece.rstrip()) > 110:
                rows.append(row.rstrip())
                row = "                       "
            row += piece
        rows.append(row)
        imports = "\n".join(rows) + "\n"
    return HEAD + imports + TYPES + "".join(lines) + "}\n"


def main(argv):
    text = generate()
    if argv[1:] == ["--check"]:
        with open(OUT) as f:
            have = f.read()
        if have != text:
            sys.stdout.writelines(difflib.unified_diff(have.splitlines(True), text.splitlines(True),
                                                       OUT, "generated"))
            print(f"{OUT} differs from what scripts/gen_signatures.py makes of the headers: run it",
                  file=sys.stderr)
            return 1
        return 0
    if argv[1:]:
        print(__doc__, file=sys.stderr)
        return 2
    with open(OUT, "w") as f:
        f.write(text)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
