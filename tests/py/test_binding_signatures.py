# SPDX-License-Identifier: Apache-2.0
"""The Python mirror of include/ferry.h and include/ferry_experimental.h: every
function the headers export is bound by python/ferry/_lib.py with the same
return and argument types, or listed in _lib.UNBOUND with a reason; every
bound function is in a header.
The header's declarations are read with the parser of
scripts/gen_signatures.py, which writes python/ferry/_signatures.py from them
(ctest python_signatures checks that file is its output); the ctypes types
expected here are worked out apart from it."""
import ctypes
import importlib.util
import os
import re

import pytest

from ferry import _lib

_spec = importlib.util.spec_from_file_location(
    "gen_signatures", os.path.join(os.path.dirname(__file__), "..", "..", "scripts", "gen_signatures.py"))
gen = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(gen)

# C scalar type -> the ctypes type the binding must use
SCALARS = {
    "int": ctypes.c_int, "unsigned": ctypes.c_uint, "unsigned int": ctypes.c_uint,
    "int32_t": ctypes.c_int32, "uint32_t": ctypes.c_uint32,
    "int64_t": ctypes.c_int64, "uint64_t": ctypes.c_uint64,
    "size_t": ctypes.c_size_t, "double": ctypes.c_double, "float": ctypes.c_float,
}
OPAQUE = gen.OPAQUE


def expected(ctype, enums, mirrors):
    """The ctypes type (or None for void) a C type must be bound as; a tuple
    ("P", inner) for a typed pointer."""
    t = " ".join(ctype.replace("*", " * ").split())
    t = re.sub(r"\bconst\b", "", t)
    t = " ".join(t.split())
    stars = t.count("*")
    base = t.replace("*", "").strip()
    if base.startswith("struct "):
        base = base[len("struct "):]
    if stars == 0:
        if base == "void":
            return None
        if base in enums:
            return ctypes.c_int
        return SCALARS[base]
    if stars == 1:
        if base == "char":
            return ctypes.c_char_p
        if base == "void" or base in OPAQUE:
            return ctypes.c_void_p
        if base in mirrors:
            return ("P", mirrors[base])
        if base.startswith("ferry_") and base not in enums:
            return ctypes.c_void_p  # a struct the binding has no mirror of: passed as NULL
        if base in enums:
            return ("P", ctypes.c_int)
        return ("P", SCALARS[base])
    if stars == 2:
        if base == "char":
            return ("P", ctypes.c_char_p)
        if base == "void" or base in OPAQUE:
            return ("P", ctypes.c_void_p)
    raise AssertionError(f"no ctypes rule for the C type {ctype!r}")


def same(want, got):
    if isinstance(want, tuple):
        return (isinstance(got, type) and issubclass(got, ctypes._Pointer) and
                ctypes.sizeof(got._type_) == ctypes.sizeof(want[1]) and same(want[1], got._type_))
    if want is None or got is None:
        return want is got
    # c_int and c_int32 are one type on every platform ferry builds for; compare
    # the kind and the size, as the ABI does
    return got is want or (getattr(got, "_type_", None) == getattr(want, "_type_", None) and
                           ctypes.sizeof(got) == ctypes.sizeof(want))


@pytest.fixture(scope="module")
def header():
    return gen.header_functions(gen.read_headers())


def mirrors():
    return {cls._ferry_name_: cls for cls in _lib.MIRRORS} | {
        getattr(cls, "_ferry_name_", None): cls for cls in vars(_lib).values()
        if isinstance(cls, type) and issubclass(cls, ctypes.Structure) and getattr(cls, "_ferry_name_", None)}


def test_the_parser_reads_the_header(header):
    # a few declarations written out, so a parser that reads nothing fails
    assert header["ferry_version"][:2] == ("int", [])
    assert header["ferry_file_tensor_read"][1] == ["const ferry_file *", "int64_t", "uint64_t", "void *", "size_t"]
    assert len(header) > 90
    assert header["ferry_store_use_keeper"][:2] == ("int", ["ferry_store *", "const char *", "int"])  # the second header


def test_every_exported_function_is_bound_or_listed(header):
    missing = sorted(n for n in header if n not in _lib.SIGNATURES and n not in _lib.UNBOUND)
    assert not missing, f"the headers export functions the binding neither binds nor lists in UNBOUND: {missing}"
    both = sorted(n for n in _lib.UNBOUND if n in _lib.SIGNATURES)
    assert not both, f"bound and listed as unbound: {both}"
    stale = sorted(n for n in list(_lib.SIGNATURES) + list(_lib.UNBOUND) if n not in header)
    assert not stale, f"the binding names functions the headers do not export: {stale}"


def test_every_binding_matches_the_header(header):
    table = mirrors()
    wrong = []
    for name, (res, args) in sorted(_lib.SIGNATURES.items()):
        cret, cargs, enums = header[name]
        if not same(expected(cret, enums, table), res):
            wrong.append(f"{name}: returns {cret}, bound as {res}")
        if len(cargs) != len(args):
            wrong.append(f"{name}: {len(cargs)} arguments in the header, {len(args)} bound")
            continue
        for k, (c, got) in enumerate(zip(cargs, args)):
            if not same(expected(c, enums, table), got):
                wrong.append(f"{name}: argument {k} is {c}, bound as {got}")
    assert not wrong, "\n".join(wrong)


def test_the_check_catches_a_wrong_binding(header):
    """The comparison itself: a pointer bound as an integer, a uint64 bound as
    int32, or a struct pointer of another type do not pass."""
    table = mirrors()
    enums = header["ferry_version"][2]
    assert not same(expected("uint64_t", enums, table), ctypes.c_int32)
    assert not same(expected("void *", enums, table), ctypes.c_int64)
    assert not same(expected("ferry_load_opts *", enums, table), ctypes.POINTER(_lib.StoreOpts))
    assert same(expected("ferry_load_opts *", enums, table), ctypes.POINTER(_lib.LoadOpts))
    assert same(expected("const char **", enums, table), ctypes.POINTER(ctypes.c_char_p))
    assert not same(expected("int64_t *", enums, table), ctypes.POINTER(ctypes.c_uint64))
