#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
"""`ferry inspect DIR`: a diffusers model folder (model_index.json naming its
component subfolders) or a folder of one checkpoint opens as its components,
in text and in --json; which file a component's checkpoint is (the plain one
over its variants, a variant when alone, an index over its shards); folders
with nothing to read, or too much to choose from, are usage errors (exit 2)
naming the folder. `ferry load DIR` takes every folder the same way: it loads
exactly the checkpoints inspect lists, in its order, and refuses the same
folders with the same message and exit status.

    run_inspect_folder.py FERRY
"""
import json
import os
import shutil
import subprocess
import sys
import tempfile

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "data"))
import stwriter  # noqa: E402
import gguf_writer as gw  # noqa: E402

problems = []


def check(ok, msg):
    if not ok:
        problems.append(msg)
    return ok


def st(path, tensors, metadata=None):
    """tensors: [(name, dtype, shape)], zero bytes"""
    os.makedirs(os.path.dirname(path), exist_ok=True)
    stwriter.write(path, [(n, d, s, bytes(stwriter.nbytes(d, s))) for n, d, s in tensors], metadata=metadata)


def ferry(*args):
    return subprocess.run([sys.argv[1], "inspect", *args], capture_output=True, text=True)


def load(*args):
    return subprocess.run([sys.argv[1], "load", "--device", "sim:64MiB", *args], capture_output=True, text=True)


def usage_error(folder, *words):
    r = ferry(folder)
    check(r.returncode == 2, f"inspect {folder}: exit {r.returncode}, expected 2 (stderr {r.stderr!r})")
    check(r.stdout == "", f"inspect {folder}: wrote to stdout: {r.stdout[:200]!r}")
    err = r.stderr
    check(err.startswith("ferry inspect: ") and err.count("\n") == 1,
          f"inspect {folder}: stderr is not one 'ferry inspect: ' line: {err!r}")
    for w in (folder,) + words:
        check(w in err, f"inspect {folder}: message lacks {w!r}: {err!r}")
    same_refusal(folder, r)


def same_refusal(folder, r):
    """load refuses folder as inspect did (r): the same exit status and message, nothing loaded."""
    lr = load(folder)
    check(lr.returncode == r.returncode and lr.stdout == "",
          f"load {folder}: exit {lr.returncode}, inspect's {r.returncode}; stdout {lr.stdout[:200]!r}")
    def words(e, cmd):  # the message less the command's name
        return e.replace(f"ferry {cmd}: ", "ferry: ").replace(f"'ferry {cmd} --help'", "HELP")
    check(words(lr.stderr, "load") == words(r.stderr, "inspect"),
          f"load {folder}: message {lr.stderr!r} is not inspect's {r.stderr!r}")


def loads_as_inspect_lists(folder, *inspect_args):
    """load --json folder loads the checkpoints inspect --json lists, in its order, each named by its component."""
    r = ferry("--json", *inspect_args, folder)
    lr = load("--json", "--verify", folder)
    if not check(r.returncode == 0 and lr.returncode == 0,
                 f"load {folder}: exit {lr.returncode} (inspect {r.returncode}): {lr.stderr or r.stderr}"):
        return
    want = [(c["name"], c["path"], c["tensor_count"]) for c in json.loads(r.stdout)["components"] if c["path"]]
    got = json.loads(lr.stdout)
    files = [(f.get("component"), f["path"], f["tensors"]) for f in got["files"]]
    check(files == want, f"load {folder} loaded {files}, inspect lists {want}")
    check(all(f.get("folder") == folder for f in got["files"]) and got["verified"] and got["ok"],
          f"load {folder}: {got}")


def make_pipeline(d):
    with open(os.path.join(d, "model_index.json"), "w") as f:
        json.dump({"_class_name": "FluxPipeline", "_diffusers_version": "0.30.0",
                   "transformer": ["diffusers", "FluxTransformer2DModel"], "vae": ["diffusers", "AutoencoderKL"],
                   "text_encoder": ["transformers", "CLIPTextModel"], "tokenizer": ["transformers", "CLIPTokenizer"],
                   "scheduler": ["diffusers", "FlowMatchEulerDiscreteScheduler"],
                   "safety_checker": [None, None]}, f)
    # the plain file beside its fp16 variant: the plain one is picked
    st(f"{d}/transformer/diffusion_pytorch_model.safetensors",
       [("blk.0.w", "F32", [4, 4]), ("blk.0.bias", "F32", [4])])
    st(f"{d}/transformer/diffusion_pytorch_model.fp16.safetensors",
       [("blk.0.w", "F16", [4, 4]), ("blk.0.bias", "F16", [4])])
    # sharded: the index, not its shards
    st(f"{d}/text_encoder/model-00001-of-00002.safetensors", [("emb.w", "BF16", [8, 2])])
    st(f"{d}/text_encoder/model-00002-of-00002.safetensors", [("fc.w", "BF16", [2, 2]), ("fc.bias", "BF16", [2])])
    with open(f"{d}/text_encoder/model.safetensors.index.json", "w") as f:
        json.dump({"metadata": {"total_size": 44}, "weight_map": {
            "emb.w": "model-00001-of-00002.safetensors", "fc.w": "model-00002-of-00002.safetensors",
            "fc.bias": "model-00002-of-00002.safetensors"}}, f)
    # only a variant: that variant
    st(f"{d}/vae/diffusion_pytorch_model.fp16.safetensors", [("dec.w", "F16", [3])])
    # no weights
    os.makedirs(f"{d}/scheduler")
    with open(f"{d}/scheduler/scheduler_config.json", "w") as f:
        f.write("{}")
    os.makedirs(f"{d}/tokenizer")
    with open(f"{d}/tokenizer/vocab.json", "w") as f:
        f.write("{}")


def check_pipeline(d):
    r = ferry("--json", d)
    if not check(r.returncode == 0, f"inspect --json {d}: exit {r.returncode}: {r.stderr}"):
        return
    j = json.loads(r.stdout)
    check(j.get("folder") == d, f"folder: {j.get('folder')!r}")
    comps = {c["name"]: c for c in j.get("components", [])}
    check([c["name"] for c in j["components"]] ==
          ["safety_checker", "scheduler", "text_encoder", "tokenizer", "transformer", "vae"],
          f"components: {[c['name'] for c in j['components']]}")
    for name, note in (("scheduler", "no weights"), ("tokenizer", "no weights"), ("safety_checker", "no such folder")):
        c = comps.get(name, {})
        check(c.get("path", "absent") is None and c.get("note") == note and "tensors" not in c,
              f"{name}: {c}, expected path null, note {note!r}")
    te = comps["text_encoder"]
    check(te["path"] == f"{d}/text_encoder/model.safetensors.index.json", f"text_encoder path {te['path']}")
    check(list(te)[:3] == ["name", "path", "format"], f"text_encoder keys begin {list(te)[:3]}")
    check((te["format"], te["tensor_count"], te["total_bytes"], te["total_numel"], len(te["files"])) ==
          ("safetensors-index", 3, 44, 22, 2), f"text_encoder: {te}")
    check(te["metadata"] == {"total_size": 44} and isinstance(te["metadata"]["total_size"], int),
          f"text_encoder metadata {te['metadata']}")
    tr = comps["transformer"]
    check(tr["path"] == f"{d}/transformer/diffusion_pytorch_model.safetensors", f"transformer path {tr['path']}")
    check("fp16" in tr.get("note", ""), f"transformer note {tr.get('note')!r} does not name the fp16 variant")
    check([t["name"] for t in tr["tensors"]] == ["blk.0.w", "blk.0.bias"] and tr["total_bytes"] == 80,
          f"transformer tensors {tr['tensors']}")
    vae = comps["vae"]
    check(vae["path"] == f"{d}/vae/diffusion_pytorch_model.fp16.safetensors", f"vae path {vae['path']}")
    check("fp16 variant" in vae.get("note", ""), f"vae note {vae.get('note')!r}")
    check(vae["tensors"][0]["dtype"] == "F16", f"vae tensors {vae['tensors']}")

    # --filter: each component's listing and totals are the matching tensors'
    r = ferry("--json", "--filter", "*.bias", d)
    j = json.loads(r.stdout) if r.returncode == 0 else {"components": []}
    got = {c["name"]: [t["name"] for t in c.get("tensors", [])] for c in j["components"]}
    check(got.get("transformer") == ["blk.0.bias"] and got.get("text_encoder") == ["fc.bias"] and got.get("vae") == [],
          f"--filter '*.bias': {got}")

    # text: a line per component, then each checkpoint's own listing
    r = ferry(d)
    if not check(r.returncode == 0, f"inspect {d}: exit {r.returncode}: {r.stderr}"):
        return
    out = r.stdout
    check(out.startswith(f"folder:      {d}\ncomponents:  6\n"), f"text head: {out[:200]!r}")
    lines = {ln.split()[0]: ln for ln in out.splitlines()[2:8]}
    check(lines.get("scheduler", "").split()[1:] == ["(no", "weights)"], f"scheduler line {lines.get('scheduler')!r}")
    te = lines.get("text_encoder", "")
    for w in (f"{d}/text_encoder/model.safetensors.index.json", "safetensors-index", "3 tensors", "44 bytes",
              "22 parameters"):
        check(w in te, f"text_encoder line lacks {w!r}: {te!r}")
    check("fp16" in lines.get("transformer", ""), f"transformer line: {lines.get('transformer')!r}")
    for sec in ("== text_encoder\npath:        " + f"{d}/text_encoder/model.safetensors.index.json",
                "== transformer\npath:        " + f"{d}/transformer/diffusion_pytorch_model.safetensors"):
        check(sec in out, f"text lacks the section {sec!r}")
    check("== scheduler" not in out, "text has a section for the scheduler, which has no weights")
    for t in ("blk.0.w", "blk.0.bias", "emb.w", "fc.bias", "dec.w"):
        check(f"\n{t} " in out, f"text does not list tensor {t}")
    r = ferry("--filter", "emb.*", d)
    check(r.returncode == 0 and "\nemb.w " in r.stdout and "\nblk.0.w " not in r.stdout and
          "safetensors-index  1 tensor  32 bytes" in r.stdout, f"text --filter emb.*: {r.stdout[:600]!r}")


def main():
    base = tempfile.mkdtemp(prefix="ferry-folder-")
    d = os.path.join(base, "pipe")
    os.makedirs(d)
    make_pipeline(d)
    check_pipeline(d)
    loads_as_inspect_lists(d)
    # a folder beside a file: each loaded in the order given
    one = f"{d}/vae/diffusion_pytorch_model.fp16.safetensors"
    lr = load("--json", one, d)
    got = json.loads(lr.stdout)["files"] if lr.returncode == 0 else []
    first = [(f["path"], f.get("component")) for f in got][:2]
    check(first == [(one, None), (f"{d}/text_encoder/model.safetensors.index.json", "text_encoder")] and
          len(got) == 4 and "folder" not in got[0], f"load FILE DIR: exit {lr.returncode}, {got} {lr.stderr}")

    # a transformers folder: its one checkpoint beside config files, as component "."
    m = os.path.join(base, "bert")
    st(f"{m}/model.safetensors", [("w", "F32", [2])], metadata={"format": "pt"})
    with open(f"{m}/config.json", "w") as f:
        f.write("{}")
    r = ferry("--json", m)
    j = json.loads(r.stdout) if r.returncode == 0 else {}
    c = (j.get("components") or [{}])[0]
    check(r.returncode == 0 and j.get("folder") == m and len(j["components"]) == 1 and c.get("name") == "." and
          c.get("path") == f"{m}/model.safetensors" and c.get("metadata") == {"format": "pt"},
          f"single-checkpoint folder: exit {r.returncode}, {j} {r.stderr}")
    # a folder of one GGUF file under any name; a trailing slash is the same folder
    g = os.path.join(base, "gguf")
    os.makedirs(g)
    gw.write(f"{g}/tiny-q8.gguf", [], [("general.architecture", gw.STRING, "llama")])
    r = ferry("--json", g + "/")
    j = json.loads(r.stdout) if r.returncode == 0 else {}
    check(r.returncode == 0 and j["components"][0]["path"] == f"{g}/tiny-q8.gguf" and
          j["components"][0]["format"] == "gguf", f"GGUF folder: exit {r.returncode}, {j} {r.stderr}")
    loads_as_inspect_lists(m)
    loads_as_inspect_lists(g + "/")

    # nothing to read, or more than one thing: usage errors naming the folder
    empty = os.path.join(base, "empty")
    os.makedirs(empty)
    usage_error(empty, "model_index.json")
    two = os.path.join(base, "two")
    st(f"{two}/a.safetensors", [("w", "F32", [1])])
    st(f"{two}/b.safetensors", [("w", "F32", [1])])
    usage_error(two, "a.safetensors", "b.safetensors")
    bare = os.path.join(base, "bare")
    os.makedirs(f"{bare}/scheduler")
    with open(f"{bare}/model_index.json", "w") as f:  # a name outside the folder is no component
        json.dump({"scheduler": ["diffusers", "DDIMScheduler"], "../bert": ["transformers", "BertModel"]}, f)
    usage_error(bare, "model_index.json")
    # a broken model_index.json, or a broken component: failures (1), naming the file
    bad = os.path.join(base, "badindex")
    os.makedirs(bad)
    with open(f"{bad}/model_index.json", "w") as f:
        f.write("{not json")
    r = ferry(bad)
    check(r.returncode == 1 and f"{bad}/model_index.json" in r.stderr,
          f"bad model_index.json: {r.returncode} {r.stderr!r}")
    same_refusal(bad, r)
    with open(f"{d}/vae/diffusion_pytorch_model.fp16.safetensors", "wb") as f:
        f.write(b"\x08" + bytes(7) + b"{}")
    r = ferry("--json", d)
    check(r.returncode == 1 and r.stdout == "" and "vae/diffusion_pytorch_model.fp16.safetensors" in r.stderr,
          f"corrupt component: exit {r.returncode}, stdout {r.stdout[:100]!r}, stderr {r.stderr!r}")
    same_refusal(d, r)  # (every checkpoint opens before the first load)

    shutil.rmtree(base, ignore_errors=True)
    for p in problems:
        print("FAIL", p)
    print("PASS" if not problems else "FAIL")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
