# SPDX-License-Identifier: Apache-2.0
"""golden_pt - the PyTorch zip checkpoint cases of gen_golden.py.

Written by hand with ptwriter (zip and pickle bytes from the formats'
descriptions; no torch needed): valid checkpoints (every dtype torch.save
writes, nested and Lightning-like trees, strided views, shared storages,
protocols 2 to 5, zip64 fields) with the table ferry must report, and invalid
ones, one per class of damage to the archive, the pickle or the tensor
geometry, each with a substring of the message ferry must give.
"""
import collections
import struct

import ptwriter as pw

TYPED = list(pw.STORAGE)            # dtypes with a typed storage class
V3 = ["U16", "U32", "U64", "F8_E4M3", "F8_E5M2", "F8_E4M3FNUZ", "F8_E5M2FNUZ", "F8_E8M0"]


def patch(blob, off, fmt, *vals):
    b = bytearray(blob)
    struct.pack_into(fmt, b, off, *vals)
    return bytes(b)


def pk(*parts, proto=2):
    """A hand-written pickle: PROTO, the opcodes given, STOP."""
    return b"\x80" + bytes([proto]) + b"".join(parts) + b"."


def s(text):
    """BINUNICODE."""
    b = text.encode()
    return b"X" + struct.pack("<I", len(b)) + b


class PtGen:
    def __init__(self, g):
        self.g = g
        self.keys = 0

    def st(self, dtype, numel, untyped=False):
        key = str(self.keys)
        self.keys += 1
        n = numel * pw.ELSIZE[dtype]
        return pw.Storage(key, dtype, self.g.data(n), untyped=untyped)

    def write(self, rel, blob):
        with open(self.g.path(rel), "wb") as f:
            f.write(blob)

    def valid(self, rel, cls, obj, **kw):
        extra = {k: kw.pop(k) for k in ("same_model_as", "cat_sample") if k in kw}
        blob, lay = pw.checkpoint(obj, **kw)
        self.write(rel, blob)
        self.g.valid(rel, cls, pw.expected(obj, lay, blob), fmt="pytorch", **extra)
        return blob, lay

    def bad(self, rel, cls, expect, blob):
        self.g.blob("pt_bad/" + rel, cls, expect, blob)

    def bad_pickle(self, rel, cls, expect, pickle, obj=None):
        blob, _ = pw.checkpoint(obj if obj is not None else {}, pickle_bytes=pickle)
        self.bad(rel, cls, expect, blob)

    # ---- valid ------------------------------------------------------------

    def gen_valid(self):
        self.keys = 0
        sd = pw.StateDict()
        for i, dt in enumerate(TYPED):
            sd[f"model.layers.{i}.{dt.lower()}"] = pw.Tensor(self.st(dt, 6), [2, 3])
        self.valid("pt/dtypes.pt", "PyTorch: every typed storage dtype (state_dict)", sd)

        self.keys = 0
        obj = collections.OrderedDict()
        for dt in V3:
            obj[dt.lower()] = pw.Tensor(self.st(dt, 8, untyped=True), [2, 4], rebuild="v3")
        obj["f32.v3"] = pw.Tensor(self.st("F32", 3, untyped=True), [3], rebuild="v3")
        self.valid("pt/v3.pt", "PyTorch 2.x: _rebuild_tensor_v3 over UntypedStorage (uint16..64, float8)", obj)

        # A Lightning-like checkpoint: non-tensor leaves everywhere, int keys.
        self.keys = 0
        w, b = self.st("F32", 12), self.st("F32", 3)
        sd = pw.StateDict([("model.encoder.weight", pw.Tensor(w, [3, 4])), ("model.encoder.bias", pw.Tensor(b, [3])),
                           ("model.head.weight", pw.Tensor(self.st("BF16", 8), [2, 4]))])
        opt = {"state": {0: {"step": pw.Tensor(self.st("F32", 1), []), "exp_avg": pw.Tensor(self.st("F32", 12), [3, 4]),
                             "exp_avg_sq": pw.Tensor(self.st("F32", 12), [3, 4])},
                         1: {"step": pw.Tensor(self.st("F32", 1), []), "exp_avg": pw.Tensor(self.st("F32", 3), [3])}},
               "param_groups": [{"lr": 0.001, "betas": (0.9, 0.999), "eps": 1e-08, "weight_decay": 0.0,
                                 "amsgrad": False, "params": [0, 1], "foreach": None}]}
        obj = {"epoch": 3, "global_step": 1200, "pytorch-lightning_version": "2.1.0", "state_dict": sd,
               "loops": {"fit_loop": {"state_dict": {}, "epoch_progress": {"total": {"ready": 4, "completed": 3}}}},
               "callbacks": {"ModelCheckpoint{'monitor': 'val_loss', 'mode': 'min'}": {
                   "best_model_score": pw.Tensor(self.st("F64", 1), []), "best_model_path": "/ckpt/epoch=2.ckpt",
                   "kth_best_model_path": "", "dirpath": "/ckpt"}},
               "optimizer_states": [opt], "lr_schedulers": [{"last_epoch": 3, "_step_count": 4}],
               "hparams_name": "kwargs", "hyper_parameters": {"lr": 0.001, "hidden": [64, 32], "name": "model"}}
        self.valid("pt/lightning.ckpt", "PyTorch Lightning-like checkpoint (nested dicts, int keys, leaves)", obj)

        # Views: transposed, expanded (stride 0), sliced (storage offset), shared
        # storages, the same tensor object twice, scalars, empty tensors, a
        # size-1 dimension with any stride (still row-major), an empty storage.
        self.keys = 0
        a, c, e = self.st("F32", 12), self.st("I64", 10), self.st("F16", 0)
        base = pw.Tensor(a, [3, 4])
        obj = collections.OrderedDict([
            ("base", base),
            ("transposed", pw.Tensor(a, [4, 3], [1, 4])),
            ("column", pw.Tensor(a, [3], [4], offset=1)),
            ("window", pw.Tensor(a, [2, 2], [4, 1], offset=5)),
            ("expanded", pw.Tensor(self.st("F32", 3), [4, 3], [0, 1])),
            ("slice", pw.Tensor(c, [4], offset=6)),
            ("slice.head", pw.Tensor(c, [2, 3], offset=0)),
            ("alias", base),
            ("scalar", pw.Tensor(self.st("F64", 1), [])),
            ("scalar.view", pw.Tensor(c, [], offset=9)),
            ("empty", pw.Tensor(e, [0])),
            ("empty.2d", pw.Tensor(self.st("F32", 0), [3, 0], [0, 1])),
            ("empty.at.end", pw.Tensor(c, [0], offset=10)),
            ("size1", pw.Tensor(self.st("U8", 3), [3, 1], [1, 7])),
            ("param", pw.Tensor(self.st("F32", 4), [2, 2], param=True, requires_grad=True)),
        ])
        self.valid("pt/views.pt", "PyTorch: strided views, shared storages, scalars, empty tensors", obj)

        # A transposed weight and a strided column of a 50 x 32 float32
        # weight. Their bytes are their elements in row-major order (the column:
        # 50 x 4 = 200, not its 6,276-byte span), so W.t() hashes unlike W and the
        # file hashes as its `ferry convert` copy does (tests/golden/run_convert.py).
        self.keys = 0
        w = self.st("F32", 50 * 32)
        obj = collections.OrderedDict([
            ("w", pw.Tensor(w, [50, 32])),
            ("w.t", pw.Tensor(w, [32, 50], [1, 32])),
            ("w.col3", pw.Tensor(w, [50], [32], offset=3)),
        ])
        self.valid("pt/strided.pt", "PyTorch: a transposed weight and a strided column of it", obj)

        for proto in (3, 4, 5):
            self.keys = 0
            obj = {"layers": [{"w": pw.Tensor(self.st("F32", 4), [2, 2]), "b": pw.Tensor(self.st("F16", 2), [2])}
                              for _ in range(3)], "names": ("a", "b"), "step": 10 ** 12}
            self.valid(f"pt/protocol{proto}.pt", f"PyTorch: pickle protocol {proto} (lists by index)", obj,
                       protocol=proto)

        self.keys = 0
        obj = {"w": pw.Tensor(self.st("F32", 6), [3, 2]), "b": pw.Tensor(self.st("I8", 5), [5])}
        self.valid("pt/zip64_extra.pt", "PyTorch: zip64 extra fields in the central directory", obj,
                   zip64_extra=True)
        self.keys = 0
        obj = {"w": pw.Tensor(self.st("F32", 6), [3, 2]), "b": pw.Tensor(self.st("I8", 5), [5])}
        self.valid("pt/plain_zip.pt", "PyTorch: no zip64 record, no data descriptors, unaligned, no byteorder",
                   obj, zip64=False, descriptor=False, align=0, byteorder=None)
        self.keys = 0
        obj = [pw.Tensor(self.st("F32", 2), [2], rebuild="v1"), (pw.Tensor(self.st("I32", 3), [3], rebuild="v1"),)]
        self.valid("pt/root_list.pt", "PyTorch: a list at the top, legacy _rebuild_tensor calls", obj,
                   archive="my model ✓", comment=b"a zip comment")
        self.valid("pt/no_tensors.pt", "PyTorch: no tensors at all", {"epoch": 1, "note": "nothing here"})

        # Thousands of tensors: SETITEMS in batches of 1000, LONG_BINPUT memo.
        self.keys = 0
        obj = pw.StateDict()
        for i in range(2500):
            dt = self.g.rng.choice(["F32", "F16", "I64", "U8"])
            obj[f"blocks.{i // 10}.p{i % 10}"] = pw.Tensor(self.st(dt, i % 4), [i % 4])
        exp_names = [f"blocks.{i // 10}.p{i % 10}" for i in range(0, 2500, 53)]
        self.valid("pt/many.pt", "PyTorch: 2500 tensors", obj, cat_sample=exp_names)

        # The same tensors as a safetensors file: same model hash.
        self.keys = 0
        ts = [self.g.t(f"w.{d.lower()}", d, [3, 4]) for d in ("F32", "F16", "BF16", "I64", "U8", "BOOL")]
        obj = collections.OrderedDict((n, pw.Tensor(pw.Storage(str(i), dt, data), shape))
                                      for i, (n, dt, shape, data) in enumerate(ts))
        self.valid("pt/same.pt", "PyTorch: the same tensors as a safetensors file", obj,
                   same_model_as="pt/same.safetensors")
        self.g.valid("pt/same.safetensors", "safetensors: the same tensors as a PyTorch file",
                     self.g.st_file("pt/same.safetensors", list(reversed(ts))), same_model_as="pt/same.pt")

    # ---- invalid: the archive ------------------------------------------------

    def gen_invalid_zip(self):
        self.keys = 0
        obj = {"w": pw.Tensor(self.st("F32", 6), [2, 3]), "b": pw.Tensor(self.st("I64", 2), [2])}
        good, lay = pw.checkpoint(obj)
        ents = lay["entries"]
        pkl = ents["archive/data.pkl"]
        n = len(ents)
        B = self.bad

        blob, _ = pw.zip_bytes([("archive/data.pkl", pw.dumps(obj)[0], 8), ("archive/data/0", bytes(24)),
                                ("archive/data/1", bytes(16))])
        B("deflated_pickle.pt", "data.pkl compressed (deflate)", "is compressed (method 8, deflate)", blob)
        blob, _ = pw.zip_bytes([("archive/data.pkl", pw.dumps(obj)[0]), ("archive/data/0", bytes(24), 8),
                                ("archive/data/1", bytes(16))])
        B("deflated_storage.pt", "a storage compressed (deflate)", "'archive/data/0' is compressed", blob)
        B("truncated_end.pt", "file cut in the end record", "no zip end of central directory record", good[:-7])
        B("truncated_cd.pt", "file cut in the central directory", "no zip end of central directory record",
          good[:lay["cd"] + 20])
        B("tiny.pt", "zip magic and 8 more bytes", "too short for a zip archive", b"PK\x03\x04" + bytes(8))
        blob = patch(patch(good, lay["end"] + 8, "<HH", n + 1, n + 1), lay["z64"] + 24, "<QQ", n + 1, n + 1)
        B("cd_count_more.pt", "central directory: one entry more than there are",
          f"central directory ends after {n} of its {n + 1} entries", blob)
        blob = patch(patch(good, lay["end"] + 8, "<HH", 1000, 1000), lay["z64"] + 24, "<QQ", 1000, 1000)
        B("cd_count_huge.pt", "central directory: implausible entry count", "claims 1000 entries", blob)
        blob = patch(patch(good, lay["end"] + 8, "<HH", n - 1, n - 1), lay["z64"] + 24, "<QQ", n - 1, n - 1)
        B("cd_count_less.pt", "central directory: one entry fewer than there are", "bytes after its", blob)
        blob = patch(patch(good, lay["end"] + 16, "<I", lay["cd"] + 1), lay["z64"] + 48, "<Q", lay["cd"] + 1)
        B("cd_offset.pt", "central directory offset off by one", "does not end where the zip64 end record begins",
          blob)
        blob = patch(good, lay["end"] + 16, "<I", lay["cd"] + 2)
        B("zip64_disagrees.pt", "zip64 lies: its directory offset differs from the end record's",
          "zip64 end record says directory offset", blob)
        blob = patch(good, lay["z64"] + 32, "<Q", n + 5)
        B("zip64_count.pt", "zip64 lies: its entry count differs from the end record's",
          f"zip64 end record says entry count {n + 5}", blob)
        blob = patch(good, lay["locator"] + 8, "<Q", len(good) + 100)
        B("zip64_locator.pt", "zip64 locator points past the file", "zip64 locator points at offset", blob)
        blob = patch(good, lay["z64"] + 4, "<Q", 1 << 40)
        B("zip64_record_size.pt", "zip64 end record claims 2^40 bytes", "which do not fit between it", blob)
        blob = patch(good, lay["z64"], "<I", 0x12345678)
        B("zip64_signature.pt", "zip64 end record signature wrong", "zip64 end record at offset", blob)
        blob = patch(patch(good, lay["z64"] + 16, "<I", 1), lay["end"] + 4, "<H", 0xFFFF)
        B("zip64_disk.pt", "zip64 record on disk 1", "spans several disks", blob)
        blob = patch(good, lay["end"] + 4, "<H", 2)
        B("disk_disagrees.pt", "zip64 lies: end record on disk 2, zip64 record on disk 0",
          "zip64 end record says disk number 0", blob)
        plain, play = pw.checkpoint(obj, zip64=False)
        B("multi_disk.pt", "end record (no zip64) on disk 2", "spans several disks",
          patch(plain, play["end"] + 4, "<H", 2))

        c = ents["archive/data/0"]["central"]
        blob = patch(good, c + 42, "<I", ents["archive/data/0"]["header"] + 1)
        B("local_offset.pt", "a local header offset off by one", "has signature", blob)
        blob = patch(good, c + 42, "<I", lay["cd"] + 10)
        B("local_offset_past.pt", "a local header offset inside the central directory", "leaves no room", blob)
        blob = patch(good, c + 42, "<I", ents["archive/data/1"]["header"])
        B("local_name.pt", "central entry points at another entry's local header", "its local header at", blob)
        blob = patch(good, c + 20, "<II", 1 << 20, 1 << 20)
        B("size_past_cd.pt", "entry size runs into the central directory", "runs past the start of the central directory",
          blob)
        blob = patch(good, c + 20, "<I", 25)
        B("stored_sizes_differ.pt", "stored entry whose sizes differ", "is stored but its sizes differ", blob)
        blob = patch(good, c + 20, "<II", 0xFFFFFFFF, 0xFFFFFFFF)
        B("zip64_extra_missing.pt", "sizes 0xFFFFFFFF without a zip64 extra field", "no zip64 extra field", blob)
        z64, zl = pw.checkpoint(obj, zip64_extra=True)
        zc = zl["entries"]["archive/data/0"]["central"]
        blob = patch(z64, zc + 46 + len("archive/data/0") + 2, "<H", 16)  # the zip64 block: 16 of 24 bytes
        B("zip64_extra_short.pt", "zip64 extra field too short for the saturated fields", "zip64 extra field holds 16",
          blob)
        blob = patch(z64, zc + 46 + len("archive/data/0") + 20, "<Q", 1 << 50)
        B("zip64_extra_offset.pt", "zip64 lies: extra field's local header offset past the file", "leaves no room",
          blob)
        blob = patch(good, c + 8, "<H", 0x0809)
        B("encrypted.pt", "an encrypted storage entry", "is encrypted", blob)
        blob = patch(good, c + 34, "<H", 1)
        B("entry_disk.pt", "an entry on disk 1", "multi-disk archives are not supported", blob)

        blob, _ = pw.zip_bytes([("archive/data.pkl", pw.dumps(obj)[0]), ("archive/data/0", bytes(24)),
                                ("archive/data/0", bytes(24)), ("archive/data/1", bytes(16))])
        B("duplicate_entry.pt", "an entry name twice", "'archive/data/0' appears twice", blob)
        blob, _ = pw.zip_bytes([("archive/data.pkl", pw.dumps(obj)[0]), (b"archive/data/\xff", bytes(4))])
        B("name_utf8.pt", "an entry name that is not UTF-8", "not valid UTF-8", blob)
        blob, _ = pw.zip_bytes([("archive/data.pkl", pw.dumps(obj)[0]), ("archive/da\x00ta/0", bytes(4))])
        B("name_nul.pt", "an entry name holding NUL", "holds a NUL byte", blob)
        blob, _ = pw.zip_bytes([("archive/data/0", bytes(24)), ("archive/data/1", bytes(16)), ("archive/version", b"3\n")])
        B("no_pickle.pt", "no data.pkl", "no entry 'archive/data.pkl'", blob)
        blob, _ = pw.zip_bytes([("data.pkl", pw.dumps(obj)[0])])
        B("no_folder.pt", "records not in a folder", "is not in a folder", blob)
        B("prepended.pt", "8 bytes prepended, offsets not adjusted (self-extractor style)",
          "zip64 end record at offset", b"PK\x03\x04junk" + good)
        B("not_zip.pt", "zip magic then zeros", "no zip end of central directory record", b"PK\x03\x04" + bytes(60))
        blob, _ = pw.checkpoint(obj, byteorder=b"big")
        B("big_endian.pt", "byteorder says big", "a big-endian checkpoint", blob)
        blob, _ = pw.checkpoint(obj, byteorder=b"middle")
        B("byteorder_bad.pt", "byteorder is neither", "is neither \"little\" nor \"big\"", blob)
        self.g.blob("pt_bad/legacy.pt", "legacy (pre-1.6) torch.save format", "legacy (pre-1.6, non-zip)",
                    b"\x80\x02\x8a\x0al\xfc\x9cF\xf9 j\xa8P\x19." + bytes(32))

    # ---- invalid: the pickle --------------------------------------------------

    def gen_invalid_pickle(self):
        P = self.bad_pickle
        P("os_system.pt", "a pickle calling os.system", "refuses global 'os.system'",
          pk(b"cos\nsystem\n", s("touch MARKER"), b"\x85R"))
        P("posix_system.pt", "a pickle calling posix.system", "refuses global 'posix.system'",
          pk(b"cposix\nsystem\n", s("id"), b"\x85R"))
        P("builtins_eval.pt", "builtins.eval through STACK_GLOBAL", "refuses global 'builtins.eval'",
          pk(b"\x8c\x08builtins\x8c\x04eval\x93", s("1"), b"\x85R", proto=4))
        P("subprocess.pt", "subprocess.Popen inside a state dict", "refuses global 'subprocess.Popen'",
          pk(b"}(", s("w"), b"csubprocess\nPopen\n", s("ls"), b"\x85Ru"))
        P("inst_os_system.pt", "INST opcode naming os.system", "refuses global 'os.system'",
          pk(b"(", s("id"), b"ios\nsystem\n"))
        P("whole_module.pt", "a whole nn.Module pickled", "refuses global 'torch.nn.modules.linear.Linear'",
          pk(b"ctorch.nn.modules.linear\nLinear\n)\x81}b"))
        P("torch_load.pt", "an allowed module, a disallowed name", "refuses global 'torch.load'",
          pk(b"ctorch\nload\n", s("x"), b"\x85R"))
        P("unknown_opcode.pt", "byte 0xff where an opcode belongs", "unknown opcode 0xff", pk(b"}\xff"))
        P("ext1.pt", "EXT1 (extension registry)", "opcode EXT1 (0x82) is not read", pk(b"\x82\x01"))
        P("newobj_ex.pt", "NEWOBJ_EX", "opcode NEWOBJ_EX (0x92) is not read", pk(b"ccollections\nOrderedDict\n)}\x92"))
        P("stack_underflow.pt", "TUPLE2 with one value", "stack underflow", pk(b"K\x01\x86"))
        P("stack_underflow_mark.pt", "APPEND right after a MARK", "stack underflow", pk(b"](K\x01a"))
        P("setitems_no_mark.pt", "SETITEMS without a MARK", "no MARK is open", pk(b"}K\x01K\x02u"))
        P("memo_unset.pt", "BINGET of a memo entry never stored", "memo index 7 was never stored", pk(b"]q\x00h\x07"))
        P("memo_huge.pt", "LONG_BINPUT 2^31", "memo index 2147483648 is out of range",
          pk(b"]r\x00\x00\x00\x80"))
        P("deep_nesting.pt", "300 nested lists", "nest deeper than 256 levels", pk(b"]" * 300 + b"a" * 299))
        P("self_cycle.pt", "a list that holds itself", "a container holds itself", pk(b"]q\x00h\x00a"))
        P("no_stop.pt", "a pickle without STOP", "ends without STOP", b"\x80\x02}")
        P("after_stop.pt", "bytes after STOP", "2 bytes follow STOP", b"\x80\x02}.xx")
        P("two_values.pt", "two values left at STOP", "STOP with 2 values", pk(b"}}"))
        P("protocol6.pt", "pickle protocol 6", "pickle protocol 6", pk(b"}", proto=6))
        P("protocol0.pt", "no PROTO opcode (protocol 0)", "does not start with PROTO", b"(dp0\n.")
        P("truncated_operand.pt", "BINUNICODE longer than the pickle", "runs past the end of the pickle",
          pk(b"X\xff\x00\x00\x00ab"))
        P("frame_past_end.pt", "FRAME longer than the pickle", "a frame of 4096 bytes",
          b"\x80\x04\x95\x00\x10\x00\x00\x00\x00\x00\x00}.")

        # The tensor calls.
        self.keys = 0
        st = self.st("F32", 6)

        def tens(*args, fn=b"_rebuild_tensor_v2", pid=None):
            pid = pid if pid is not None else (b"(" + s("storage") + b"ctorch\nFloatStorage\n" + s(st.key) + s("cpu")
                                               + b"K\x06tQ")
            return (b"}(" + s("t") + b"ctorch._utils\n" + fn + b"\n(" + pid + b"".join(args) + b"tRu")

        hooks = b"ccollections\nOrderedDict\n)R"
        ok_args = [b"K\x00", b"K\x02K\x03\x86", b"K\x03K\x01\x86", b"\x89", hooks]
        obj = {"t": pw.Tensor(st, [2, 3])}
        P("tensor_args.pt", "_rebuild_tensor_v2 with 4 arguments", "takes 6 or more arguments, got 4",
          pk(tens(*ok_args[:2], b"\x89")), obj)
        P("tensor_storage_arg.pt", "a tensor whose storage is an int", "not a storage (BINPERSID)",
          pk(b"}(" + s("t") + b"ctorch._utils\n_rebuild_tensor_v2\n(K\x00" + b"".join(ok_args) + b"tRu"), obj)
        P("negative_stride.pt", "a negative stride", "ferry reads non-negative sizes and strides only",
          pk(tens(ok_args[0], ok_args[1], b"K\x03J\xff\xff\xff\xff\x86", *ok_args[3:])), obj)
        P("stride_rank.pt", "stride rank differs from size rank", "stride has 1 entries for 2 dimensions",
          pk(tens(ok_args[0], ok_args[1], b"K\x01\x85", *ok_args[3:])), obj)
        P("huge_dim.pt", "a dimension beyond 64 bits", "does not fit in 64 bits",
          pk(tens(ok_args[0], b"\x8a\x09" + b"\xff" * 8 + b"\x01\x85", b"K\x01\x85", *ok_args[3:])), obj)
        P("too_many_dims.pt", "1025 dimensions", "size has 1025 dimensions (limit 1024)",
          pk(tens(ok_args[0], b"(" + b"K\x01" * 1025 + b"t", b"(" + b"K\x01" * 1025 + b"t", *ok_args[3:])), obj)
        P("odict_args.pt", "OrderedDict called with arguments", "collections.OrderedDict called with 1 arguments",
          pk(b"ccollections\nOrderedDict\n]\x85R"))
        P("reduce_storage.pt", "a storage class called", "calls torch.FloatStorage", pk(b"ctorch\nFloatStorage\n)R"))
        P("reduce_dtype.pt", "a dtype called", "calls torch.float32", pk(b"ctorch\nfloat32\n)R"))
        P("build_list.pt", "BUILD on a list", "sets the state of a list", pk(b"]}b"))
        P("pid_not_storage.pt", "a persistent id that is not ('storage', ...)", "is not a ('storage', ...) tuple",
          pk(b"(" + s("module") + b"tQ"))
        P("pid_short.pt", "a persistent id of 4 fields", "has 4 fields, not 5",
          pk(b"(" + s("storage") + b"ctorch\nFloatStorage\n" + s("0") + s("cpu") + b"tQ"))
        P("pid_type.pt", "a persistent id whose type is a dtype", "storage type torch.float32 is not a storage class",
          pk(b"(" + s("storage") + b"ctorch\nfloat32\n" + s("0") + s("cpu") + b"K\x01tQ"))
        P("pid_key_slash.pt", "a storage key with a slash", "is not a plain name",
          pk(b"(" + s("storage") + b"ctorch\nFloatStorage\n" + s("../x") + s("cpu") + b"K\x01tQ"))
        P("complex128.pt", "a complex128 storage", "has no ferry equivalent",
          pk(b"(" + s("storage") + b"ctorch\nComplexDoubleStorage\n" + s("0") + s("cpu") + b"K\x01tQ"))
        P("v3_dtype.pt", "_rebuild_tensor_v3 whose dtype is a storage class",
          "dtype argument torch.FloatStorage is not a torch dtype",
          pk(tens(*ok_args, b"ctorch\nFloatStorage\n", fn=b"_rebuild_tensor_v3")), obj)
        P("param_of_int.pt", "_rebuild_parameter of an int", "the data argument is an int",
          pk(b"ctorch._utils\n_rebuild_parameter\nK\x01\x88" + hooks + b"\x87R"))
        P("float_key.pt", "a tensor under a float dict key", "only str and int dict keys name tensors",
          pk(b"}(G?\xf8\x00\x00\x00\x00\x00\x00" + tens(*ok_args)[2 + 6:]), obj)
        P("bad_key_utf8.pt", "a dict key that is not UTF-8", "is not valid UTF-8",
          pk(b"}(X\x02\x00\x00\x00\xed\xa0" + tens(*ok_args)[2 + 6:]), obj)

        # Geometry against the archive.
        self.keys = 0
        st = self.st("F32", 6)
        self.bad_tree("view_past_end.pt", "a view past its storage's end", "ends at byte 28 of storage '0', which holds 24",
                      {"t": pw.Tensor(st, [7])})
        self.bad_tree("view_offset_past.pt", "a storage offset past the end", "ends at byte 28",
                      {"t": pw.Tensor(st, [2, 3], offset=1)})
        self.bad_tree("view_strided_past.pt", "strides reaching past the end", "ends at byte 32",
                      {"t": pw.Tensor(st, [2, 2], [4, 3])})
        self.bad_tree("empty_offset_past.pt", "an empty view offset past the end", "ends at byte 28",
                      {"t": pw.Tensor(st, [0], offset=7)})
        self.bad_tree("missing_storage.pt", "a storage entry missing", "storage '0' is not in the archive",
                      {"t": pw.Tensor(st, [6])}, skip_storages=("0",))
        self.bad_tree("storage_size.pt", "storage entry shorter than its persistent id says",
                      "holds 24 bytes, but its persistent id says 7 elements of torch.FloatStorage (28 bytes)",
                      {"t": pw.Tensor(pw.Storage("0", "F32", st.data, numel=7), [6])})
        self.bad_tree("storage_twice.pt", "one storage key with two types", "is described twice",
                      {"a": pw.Tensor(st, [6]), "b": pw.Tensor(pw.Storage("0", "I32", st.data), [6])})
        self.bad_tree("duplicate_name.pt", "two tensors flatten to one name", "two tensors are named 'a.b'",
                      {"a.b": pw.Tensor(st, [6]), "a": {"b": pw.Tensor(st, [3])}})

    def bad_tree(self, rel, cls, expect, obj, **kw):
        blob, _ = pw.checkpoint(obj, **kw)
        self.bad(rel, cls, expect, blob)


def gen(g):
    """Add the PyTorch cases to gen_golden's Gen g."""
    p = PtGen(g)
    p.gen_valid()
    p.gen_invalid_zip()
    p.gen_invalid_pickle()
