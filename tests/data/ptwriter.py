# SPDX-License-Identifier: Apache-2.0
"""ptwriter - ferry's own writer of PyTorch zip checkpoints (standard library only).

Written from the formats' descriptions (PKWARE's APPNOTE for the zip archive,
CPython's pickletools for the opcodes, torch.save's layout), independently of
ferry's C reader and without torch, so that the reader is checked against a
second implementation:

    <archive>/data.pkl     the object tree, pickled (protocol 2 by default);
                           tensors are torch._utils._rebuild_tensor_v2(storage,
                           storage_offset, size, stride, requires_grad,
                           OrderedDict()) whose storage is a persistent id
                           ('storage', torch.<Type>Storage, key, 'cpu', numel)
    <archive>/byteorder    "little" (torch 2.x)
    <archive>/data/<key>   each storage's raw bytes, stored, aligned to 64 bytes
                           by padding the local header's extra field
    <archive>/version      "3\\n"

plus a zip64 end record and locator, as torch's writer always adds them.

Build a tree of dicts, OrderedDicts, lists, tuples, scalars and Tensor objects
(Storage objects hold the bytes), then checkpoint(tree) -> (bytes, layout);
expected(tree, layout, blob) gives the table ferry must report.
"""
import collections
import hashlib
import struct
import zlib

# ferry dtype -> (storage class, element size). Typed storages: torch 1.6+.
STORAGE = {
    "F32": "FloatStorage", "F64": "DoubleStorage", "F16": "HalfStorage", "BF16": "BFloat16Storage",
    "I64": "LongStorage", "I32": "IntStorage", "I16": "ShortStorage", "I8": "CharStorage",
    "U8": "ByteStorage", "BOOL": "BoolStorage", "C64": "ComplexFloatStorage",
}
# dtypes torch 2.x writes as an UntypedStorage (numel = bytes) + _rebuild_tensor_v3(..., dtype)
V3_DTYPE = {
    "U16": "uint16", "U32": "uint32", "U64": "uint64", "F8_E4M3": "float8_e4m3fn", "F8_E5M2": "float8_e5m2",
    "F8_E4M3FNUZ": "float8_e4m3fnuz", "F8_E5M2FNUZ": "float8_e5m2fnuz", "F8_E8M0": "float8_e8m0fnu",
    "F32": "float32", "I64": "int64", "U8": "uint8",
}
ELSIZE = {"F32": 4, "F64": 8, "F16": 2, "BF16": 2, "I64": 8, "I32": 4, "I16": 2, "I8": 1, "U8": 1, "BOOL": 1,
          "C64": 8, "U16": 2, "U32": 4, "U64": 8, "F8_E4M3": 1, "F8_E5M2": 1, "F8_E4M3FNUZ": 1,
          "F8_E5M2FNUZ": 1, "F8_E8M0": 1}


class Storage:
    """A storage: key (the data/<key> entry), ferry dtype, raw bytes.
    untyped: written as torch.storage.UntypedStorage (numel counts bytes)."""

    def __init__(self, key, dtype, data, untyped=False, numel=None):
        self.key, self.dtype, self.data, self.untyped = str(key), dtype, bytes(data), untyped
        el = 1 if untyped else ELSIZE[dtype]
        self.numel = len(self.data) // el if numel is None else numel


class Tensor:
    """A view: storage, shape, stride (None: row-major), storage offset in elements.
    rebuild: "v2" (default), "v1" (_rebuild_tensor), "v3" (UntypedStorage + dtype).
    param: wrap in torch._utils._rebuild_parameter(t, requires_grad, OrderedDict())."""

    def __init__(self, storage, shape, stride=None, offset=0, requires_grad=False, param=False, rebuild="v2",
                 dtype=None, metadata=None):
        self.storage, self.shape, self.offset = storage, list(shape), offset
        self.stride = list(stride) if stride is not None else row_major(shape)
        self.requires_grad, self.param, self.rebuild = requires_grad, param, rebuild
        self.dtype = dtype or storage.dtype
        self.metadata = metadata


class StateDict(collections.OrderedDict):
    """An OrderedDict with nn.Module.state_dict()'s _metadata attribute: pickled
    as OrderedDict() + SETITEMS + BUILD({'_metadata': ...})."""


class Raw:
    """Opcodes written as they are (for hostile pickles)."""

    def __init__(self, data):
        self.data = bytes(data)


class Global:
    """A bare global (module, name), e.g. a dtype."""

    def __init__(self, module, name):
        self.module, self.name = module, name


def row_major(shape):
    st, acc = [], 1
    for d in reversed(shape):
        st.append(acc)
        acc *= d
    return list(reversed(st))


class Pickler:
    """Emits the opcodes CPython's pickler emits for these objects (protocol 2
    to 5), memoizing globals and shared containers / tensors."""

    def __init__(self, protocol=2):
        assert 2 <= protocol <= 5
        self.proto = protocol
        self.out = bytearray()
        self.memo = {}      # key -> memo index
        self.nmemo = 0
        self.storages = {}  # key -> Storage, in first-use order

    def dumps(self, obj):
        self.save(obj)
        body = bytes(self.out) + b"."
        head = b"\x80" + bytes([self.proto])
        if self.proto >= 4:
            head += b"\x95" + struct.pack("<Q", len(body))
        return head + body

    def w(self, b):
        self.out += b

    def put(self, key):
        idx = self.nmemo
        self.nmemo += 1
        self.memo[key] = idx
        if self.proto >= 4:
            self.w(b"\x94")
        elif idx < 256:
            self.w(b"q" + bytes([idx]))
        else:
            self.w(b"r" + struct.pack("<I", idx))

    def get(self, key):
        idx = self.memo[key]
        self.w(b"h" + bytes([idx]) if idx < 256 else b"j" + struct.pack("<I", idx))

    def glob(self, module, name):
        key = ("global", module, name)
        if key in self.memo:
            return self.get(key)
        if self.proto >= 4:
            self.save_str(module)
            self.save_str(name)
            self.w(b"\x93")
        else:
            self.w(b"c" + module.encode() + b"\n" + name.encode() + b"\n")
        self.put(key)

    def save_str(self, s):
        b = s.encode("utf-8", "surrogatepass")
        if self.proto >= 4 and len(b) < 256:
            self.w(b"\x8c" + bytes([len(b)]) + b)
        else:
            self.w(b"X" + struct.pack("<I", len(b)) + b)

    def save_int(self, v):
        if 0 <= v < 256:
            self.w(b"K" + bytes([v]))
        elif 0 <= v < 65536:
            self.w(b"M" + struct.pack("<H", v))
        elif -(1 << 31) <= v < (1 << 31):
            self.w(b"J" + struct.pack("<i", v))
        else:
            n = (v.bit_length() + 8) // 8
            self.w(b"\x8a" + bytes([n]) + v.to_bytes(n, "little", signed=True))

    def save_tuple(self, items):
        if not items:
            return self.w(b")")
        if len(items) <= 3:
            for x in items:
                self.save(x)
            return self.w(bytes([0x84 + len(items)]))
        self.w(b"(")
        for x in items:
            self.save(x)
        self.w(b"t")

    def odict(self):
        self.glob("collections", "OrderedDict")
        self.w(b")R")

    def items(self, pairs):
        pairs = list(pairs)
        for i in range(0, len(pairs), 1000):
            batch = pairs[i:i + 1000]
            if len(batch) == 1:
                self.save(batch[0][0])
                self.save(batch[0][1])
                self.w(b"s")
            else:
                self.w(b"(")
                for k, v in batch:
                    self.save(k)
                    self.save(v)
                self.w(b"u")

    def persid(self, st):
        self.storages.setdefault(st.key, st)
        self.w(b"(")
        self.save_str("storage")
        if st.untyped:
            self.glob("torch.storage", "UntypedStorage")
        else:
            self.glob("torch", STORAGE[st.dtype])
        self.save_str(st.key)
        self.save_str("cpu")
        self.save_int(st.numel)
        self.w(b"tQ")

    def tensor(self, t):
        if t.param:
            self.glob("torch._utils", "_rebuild_parameter")
        name = {"v1": "_rebuild_tensor", "v2": "_rebuild_tensor_v2", "v3": "_rebuild_tensor_v3"}[t.rebuild]
        self.glob("torch._utils", name)
        self.w(b"(")
        self.persid(t.storage)
        self.save_int(t.offset)
        self.save_tuple(list(t.shape))
        self.save_tuple(list(t.stride))
        if t.rebuild != "v1":
            self.save(t.requires_grad and not t.param)
            self.odict()
        if t.rebuild == "v3":
            self.glob("torch", V3_DTYPE[t.dtype])
        if t.metadata is not None:
            self.save(t.metadata)
        self.w(b"tR")
        if t.param:
            self.save(t.requires_grad)
            self.odict()
            self.w(b"\x87R")

    def save(self, obj):
        if isinstance(obj, Raw):
            return self.w(obj.data)
        if isinstance(obj, Global):
            return self.glob(obj.module, obj.name)
        if obj is None:
            return self.w(b"N")
        if obj is True or obj is False:
            return self.w(b"\x88" if obj else b"\x89")
        if isinstance(obj, int):
            return self.save_int(obj)
        if isinstance(obj, float):
            return self.w(b"G" + struct.pack(">d", obj))
        if isinstance(obj, str):
            return self.save_str(obj)
        if isinstance(obj, bytes):
            return self.w(b"C" + bytes([len(obj)]) + obj if len(obj) < 256 else b"B" + struct.pack("<I", len(obj)) + obj)
        key = ("obj", id(obj))
        if key in self.memo:
            return self.get(key)
        if isinstance(obj, Tensor):
            self.tensor(obj)
        elif isinstance(obj, tuple):
            self.save_tuple(list(obj))
        elif isinstance(obj, list):
            self.w(b"]")
            self.put(key)
            if len(obj) == 1:
                self.save(obj[0])
                self.w(b"a")
            elif obj:
                self.w(b"(")
                for x in obj:
                    self.save(x)
                self.w(b"e")
            return None
        elif isinstance(obj, collections.OrderedDict):
            self.odict()
            self.put(key)
            self.items(obj.items())
            if isinstance(obj, StateDict):
                self.w(b"}")
                self.items([("_metadata", collections.OrderedDict([("", {"version": 1})]))])
                self.w(b"b")
            return None
        elif isinstance(obj, dict):
            self.w(b"}")
            self.put(key)
            self.items(obj.items())
            return None
        else:
            raise TypeError(f"ptwriter cannot pickle {type(obj).__name__}")
        self.put(key)
        return None


def dumps(obj, protocol=2):
    """(pickle bytes, storages in first-use order)."""
    p = Pickler(protocol)
    data = p.dumps(obj)
    return data, list(p.storages.values())


# ---- zip ------------------------------------------------------------------

def zip_bytes(entries, align=64, zip64=True, descriptor=True, zip64_extra=False, comment=b""):
    """entries: list of (name, data[, method]) written as given (method 0 =
    stored; other methods store zlib's deflate stream). Returns (bytes, layout):
    layout["entries"][name] = {"header", "data", "size", "csize", "central"},
    plus "cd", "cd_size", "z64" (zip64 end record), "locator", "end"."""
    out = bytearray()
    cen = []
    lay = {"entries": {}}
    for ent in entries:
        name, data = ent[0], bytes(ent[1])
        method = ent[2] if len(ent) > 2 else 0
        nb = name.encode("utf-8") if isinstance(name, str) else name
        payload = data
        if method == 8:
            c = zlib.compressobj(6, zlib.DEFLATED, -15)
            payload = c.compress(data) + c.flush()
        crc = zlib.crc32(data)
        hdr = len(out)
        flags = 0x0800 | (0x0008 if descriptor and data else 0)
        extra = b""
        if align:
            pad = (-(hdr + 30 + len(nb) + 4)) % align
            extra = b"FB" + struct.pack("<H", pad) + b"Z" * pad
        lsz = 0 if flags & 8 else len(payload)
        lusz = 0 if flags & 8 else len(data)
        out += struct.pack("<IHHHHHIIIHH", 0x04034b50, 20, flags, method, 0, 0x21, 0 if flags & 8 else crc,
                           lsz, lusz, len(nb), len(extra)) + nb + extra
        doff = len(out)
        out += payload
        if flags & 8:
            out += struct.pack("<IIII", 0x08074b50, crc, len(payload), len(data))
        lay["entries"][name] = {"header": hdr, "data": doff, "size": len(data), "csize": len(payload)}
        cen.append((name, nb, flags, method, crc, len(payload), len(data), hdr))
    cd = len(out)
    for (name, nb, flags, method, crc, csize, usize, hdr) in cen:
        x = b""
        c32, u32, o32 = csize, usize, hdr
        if zip64_extra:
            x = struct.pack("<HHQQQ", 1, 24, usize, csize, hdr)
            c32 = u32 = o32 = 0xFFFFFFFF
        lay["entries"][name]["central"] = len(out)
        out += struct.pack("<IHHHHHHIIIHHHHHII", 0x02014b50, 0x031E, 20, flags, method, 0, 0x21, crc, c32, u32,
                           len(nb), len(x), 0, 0, 0, 0, o32) + nb + x
    cd_size = len(out) - cd
    lay["cd"], lay["cd_size"] = cd, cd_size
    n = len(cen)
    if zip64:
        lay["z64"] = len(out)
        out += struct.pack("<IQHHIIQQQQ", 0x06064b50, 44, 0x031E, 45, 0, 0, n, n, cd_size, cd)
        lay["locator"] = len(out)
        out += struct.pack("<IIQI", 0x07064b50, 0, lay["z64"], 1)
    lay["end"] = len(out)
    out += struct.pack("<IHHHHIIH", 0x06054b50, 0, 0, min(n, 0xFFFF), min(n, 0xFFFF), min(cd_size, 0xFFFFFFFF),
                       min(cd, 0xFFFFFFFF), len(comment)) + comment
    return bytes(out), lay


def checkpoint(obj, archive="archive", protocol=2, pickle_bytes=None, byteorder=b"little", extra_entries=(),
               skip_storages=(), **zkw):
    """A torch.save-like zip of obj. pickle_bytes overrides data.pkl (its
    storages still come from obj). Returns (bytes, layout)."""
    pkl, storages = dumps(obj, protocol)
    if pickle_bytes is not None:
        pkl = pickle_bytes
    ents = [(f"{archive}/data.pkl", pkl)]
    if byteorder is not None:
        ents.append((f"{archive}/byteorder", byteorder))
    for st in storages:
        if st.key not in skip_storages:
            ents.append((f"{archive}/data/{st.key}", st.data))
    ents += list(extra_entries)
    ents.append((f"{archive}/version", b"3\n"))
    blob, lay = zip_bytes(ents, **zkw)
    lay["archive"] = archive
    return blob, lay


# ---- what ferry must report -------------------------------------------------

def _contiguous(shape, stride):
    if any(d == 0 for d in shape):
        return True
    expect = 1
    for d, s in zip(reversed(shape), reversed(stride)):
        if d != 1 and s != expect:
            return False
        expect *= d
    return True


def _gather(blob, off, el, shape, stride):
    out = bytearray()
    idx = [0] * len(shape)
    total = 1
    for d in shape:
        total *= d
    for _ in range(total):
        at = off + el * sum(i * s for i, s in zip(idx, stride))
        out += blob[at:at + el]
        for d in reversed(range(len(shape))):
            idx[d] += 1
            if idx[d] < shape[d]:
                break
            idx[d] = 0
    return bytes(out)


def named_tensors(obj):
    """(name, Tensor) in ferry's walk order: dict order, list index, dotted."""
    out = []

    def walk(v, path, depth):
        if isinstance(v, Tensor):
            out.append((path, v))
        elif isinstance(v, dict):
            for k, x in v.items():
                if isinstance(x, (Tensor, dict, list, tuple)):
                    key = str(k)
                    walk(x, key if depth == 0 else path + "." + key, depth + 1)
        elif isinstance(v, (list, tuple)):
            for i, x in enumerate(v):
                if isinstance(x, (Tensor, dict, list, tuple)):
                    walk(x, str(i) if depth == 0 else f"{path}.{i}", depth + 1)

    walk(obj, "", 0)
    return out


def expected(obj, layout, blob):
    """The tensors ferry must list, in its order (by offset, then walk order):
    name, dtype, shape, nbytes, offset, sha256 of those bytes, strides (None
    when row-major) and flags."""
    arch = layout["archive"]
    named = named_tensors(obj)
    users = collections.Counter(t.storage.key for _, t in named)
    rows = []
    for seq, (name, t) in enumerate(named):
        el = ELSIZE[t.dtype]
        ent = layout["entries"][f"{arch}/data/{t.storage.key}"]
        numel = 1
        for d in t.shape:
            numel *= d
        contig = _contiguous(t.shape, t.stride)
        if numel == 0:
            nbytes = 0
        elif contig:
            nbytes = numel * el
        else:
            nbytes = (1 + sum((d - 1) * s for d, s in zip(t.shape, t.stride))) * el
        off = ent["data"] + t.offset * el
        flags = ([] if contig else ["noncontiguous"]) + (["shared_storage"] if users[t.storage.key] > 1 else [])
        row = {
            "name": name, "dtype": t.dtype, "shape": list(t.shape), "nbytes": nbytes, "offset": off, "file": "",
            "sha256": hashlib.sha256(blob[off:off + nbytes]).hexdigest(),
            "strides": None if contig else list(t.stride), "flags": flags,
        }
        if not contig:  # the elements in row-major order (what a converter writes)
            row["gathered_sha256"] = hashlib.sha256(_gather(blob, off, el, t.shape, t.stride)).hexdigest()
            row["gathered_nbytes"] = numel * el
        rows.append((off, seq, row))
    rows.sort(key=lambda r: (r[0], r[1]))
    return [r[2] for r in rows]
