#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
"""`ferry inspect --json`, byte for byte. The command writes its document a
piece at a time (a file of millions of tensors is never one tree in memory);
the pieces must join into the text jansson dumps for the whole document at
once (indent 2, insertion order, one precision for every real in it), which
tests/golden/inspect_json/NAME.json keeps for each case: GGUF metadata of
every type (reals sharing the document's precision, long arrays summarised),
PyTorch views (strides, flags), a sharded index (its files, numbers in its
metadata), a file without tensors, a --filter that matches nothing, and a
diffusers folder (components with and without weights, a variant's note, an
index whose reals set the precision of the whole folder's document). Paths are
relative, run from the folder the checkpoints are written to.

    run_inspect_json.py FERRY [--update]

--update rewrites the expected files from FERRY's output (review the diff).
"""
import json
import os
import shutil
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
EXPECTED = os.path.join(HERE, "inspect_json")
sys.path.insert(0, os.path.join(HERE, "..", "data"))
import stwriter  # noqa: E402

CASES = [
    ("gguf_metadata", ["gguf/metadata.gguf"]),
    ("pt_views", ["pt/views.pt"]),
    ("sharded_index", ["sharded/model.safetensors.index.json"]),
    ("empty", ["empty.safetensors"]),
    ("filter_none", ["--filter", "no-such-tensor*", "scalars.safetensors"]),
    ("folder", ["pipe"]),
    ("folder_filter", ["--filter", "*.bias", "pipe"]),
]


def st(path, tensors, metadata=None):
    """tensors: [(name, dtype, shape)], zero bytes"""
    os.makedirs(os.path.dirname(path), exist_ok=True)
    stwriter.write(path, [(n, d, s, bytes(stwriter.nbytes(d, s))) for n, d, s in tensors], metadata=metadata)


def make_folder(d):
    with open(os.path.join(d, "model_index.json"), "w") as f:
        json.dump({"_class_name": "FluxPipeline", "transformer": ["diffusers", "FluxTransformer2DModel"],
                   "text_encoder": ["transformers", "CLIPTextModel"],
                   "scheduler": ["diffusers", "FlowMatchEulerDiscreteScheduler"]}, f)
    st(f"{d}/transformer/diffusion_pytorch_model.fp16.safetensors",
       [("blk.0.w", "F16", [4, 4]), ("blk.0.bias", "F16", [4])], metadata={"format": "pt"})
    st(f"{d}/text_encoder/model-00001-of-00002.safetensors", [("emb.w", "BF16", [8, 2])])
    st(f"{d}/text_encoder/model-00002-of-00002.safetensors", [("fc.w", "BF16", [2, 2]), ("fc.bias", "BF16", [2])])
    with open(f"{d}/text_encoder/model.safetensors.index.json", "w") as f:
        json.dump({"metadata": {"total_size": 44, "scale": 0.1, "eps": 1e-05, "third": 1 / 3},
                   "weight_map": {"emb.w": "model-00001-of-00002.safetensors",
                                  "fc.w": "model-00002-of-00002.safetensors",
                                  "fc.bias": "model-00002-of-00002.safetensors"}}, f)
    os.makedirs(f"{d}/scheduler")
    with open(f"{d}/scheduler/scheduler_config.json", "w") as f:
        f.write("{}")


def main():
    if len(sys.argv) < 2:
        sys.exit(__doc__)
    ferry, update = os.path.abspath(sys.argv[1]), "--update" in sys.argv[2:]
    work = tempfile.mkdtemp(prefix="ferry-inspect-json-")
    problems = []
    try:
        gen = subprocess.run([sys.executable, os.path.join(HERE, "..", "data", "gen_golden.py"), work],
                             capture_output=True, text=True)
        if gen.returncode != 0:
            print(f"FAIL gen_golden.py: {gen.stderr.strip()}")
            return 1
        os.makedirs(os.path.join(work, "pipe"))
        make_folder(os.path.join(work, "pipe"))
        for name, args in CASES:
            r = subprocess.run([ferry, "inspect", "--json"] + args, capture_output=True, cwd=work)
            what = "inspect --json " + " ".join(args)
            if r.returncode != 0 or r.stderr:
                problems.append(f"{what}: exit {r.returncode}, stderr {r.stderr[:300]!r}")
                continue
            path = os.path.join(EXPECTED, name + ".json")
            if update:
                with open(path, "wb") as f:
                    f.write(r.stdout)
                continue
            with open(path, "rb") as f:
                want = f.read()
            if r.stdout != want:
                got, exp = r.stdout.decode(errors="replace").splitlines(), want.decode().splitlines()
                at = next((i for i, (a, b) in enumerate(zip(got, exp)) if a != b), min(len(got), len(exp)))
                problems.append(f"{what}: differs from {os.path.relpath(path, HERE)} at line {at + 1}: "
                                f"got {got[at] if at < len(got) else '(end)'!r}, "
                                f"expected {exp[at] if at < len(exp) else '(end)'!r}")
            json.loads(r.stdout)  # (and it is JSON)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    for p in problems:
        print("FAIL", p)
    print(f"{len(CASES)} cases{' written' if update else ''}; " + ("PASS" if not problems else "FAIL"))
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
