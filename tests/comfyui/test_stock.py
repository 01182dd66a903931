# SPDX-License-Identifier: Apache-2.0
"""Stock ComfyUI, headless on the CPU, on the tiny models of
tests/data/comfy_models.py: for Wan 2.1 T2V, Flux.1-dev and SDXL, the
smallest text-to-image prompt (tests/comfyui/prompts.py) runs through every
node, ComfyUI picks the architecture the files are laid out as, every weight
in the files lands in the model built (the only weights ComfyUI reports
missing or left over are those a released file of that kind also lacks or
carries), and two runs in two fresh processes give bit-identical latents and
images. The reference the node pack's loaders are compared against.

Run with the interpreter of scripts/deps.sh's torch-2 environment
(tests/comfyui/run_comfyui.sh stock, ctest comfyui_stock); skips without
ComfyUI or its packages."""
import ast
import concurrent.futures
import os
import sys

import pytest

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.join(os.path.dirname(HERE), "data"))

import harness  # noqa: E402
import prompts  # noqa: E402

COMFYUI = harness.require_comfyui(pytest)

import comfy_models  # noqa: E402

# what ComfyUI must make of each file set: the supported-model config of the
# diffusion model and the classes of the models it loads
EXPECT = {
    "wan": {"config": "WAN21_T2V", "models": {"WAN21", "WanTEModel", "WanVAE"},
            "latent": [1, 16, 1, 8, 8]},
    "flux": {"config": "Flux", "models": {"Flux", "FluxClipModel_", "AutoencodingEngine"},
             "latent": [1, 16, 8, 8]},
    "sdxl": {"config": "TinySDXL", "models": {"SDXL", "SDXLClipModel", "AutoencoderKL"},
             "latent": [1, 4, 8, 8]},
}
IMAGE = [1, prompts.SIZE, prompts.SIZE, 3]


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    d = tmp_path_factory.mktemp("models")
    return str(d), comfy_models.write_models(str(d))


def _listed(message):
    """The Python list at the end of a loader's message, as a list."""
    try:
        return ast.literal_eval(message[message.index("["):])
    except (ValueError, SyntaxError):
        return None


def check_weight_messages(result):
    """Every weight ComfyUI reports missing or left over is one a released
    file of the kind lacks or carries too: the VAE encoder (not in the tiny
    SD/Flux VAEs: ComfyUI builds it at its real width whatever the file
    holds), CLIP-L's projection and logit scale in SDXL's file, UMT5's
    tokenizer blob."""
    for rec in result["log"]:
        msg = rec["message"]
        assert "size mismatch" not in msg, msg
        if msg.startswith(("unet missing", "unet unexpected", "clip missing", "clip unexpected",
                           "Missing VAE keys", "Leftover VAE keys", "left over keys")):
            keys = _listed(msg)
            assert keys is not None, msg
            if msg.startswith("Missing VAE keys"):
                bad = [k for k in keys if not k.startswith("encoder.")]
            elif msg.startswith("clip missing"):
                bad = [k for k in keys if k not in ("clip_l.logit_scale", "clip_l.transformer.text_projection.weight")]
            elif msg.startswith("clip unexpected"):
                bad = [k for k in keys if k != "spiece_model"]
            else:
                bad = keys
            assert not bad, f"{msg[:200]}...: unexpected for these files: {bad[:20]}"


@pytest.mark.parametrize("arch", ["wan", "flux", "sdxl"])
def test_stock_runs_and_repeats(arch, models, tmp_path):
    models_dir, files = models
    prompt = prompts.BUILDERS[arch](files[arch])
    # the two runs side by side (ComfyUI's start-up is single-threaded)
    with concurrent.futures.ThreadPoolExecutor(2) as pool:
        futs = [pool.submit(harness.run, prompt, models_dir, overrides=comfy_models.comfy_overrides(),
                            comfyui=COMFYUI, workdir=str(tmp_path / f"run{i}"), timeout=300)
                for i in range(2)]
        results = [f.result() for f in futs]

    for res in results:
        assert res["ok"], harness.describe_failure(res)
        run = res["runs"][0]
        print(f"{arch}: startup {res['startup_s']} s, prompt {run['execute_s']} s: "
              + ", ".join(f"{n['class_type']} {n.get('s')}" for n in run["nodes"].values()))
        assert {n["status"] for n in run["nodes"].values()} == {"executed"}, run["nodes"]
        loaded = {m["model"] for m in run["loaded_models"]}
        assert EXPECT[arch]["models"] <= loaded, run["loaded_models"]
        assert EXPECT[arch]["config"] in {m["config"] for m in run["loaded_models"]}, run["loaded_models"]
        shapes = {t["kind"]: t["shape"] for t in run["tensors"]}
        assert shapes == {"image": IMAGE, "latent": EXPECT[arch]["latent"]}, run["tensors"]
        assert all(t["finite"] for t in run["tensors"]), run["tensors"]
        assert [f["key"] for f in run["files"]] == ["images"], run["files"]
        check_weight_messages(res)

    a, b = (r["runs"][0] for r in results)
    assert [t["sha256"] for t in a["tensors"]] == [t["sha256"] for t in b["tensors"]], \
        "two runs of the same prompt gave different tensors"
    assert a["files"][0]["pixels_sha256"] == b["files"][0]["pixels_sha256"]
    assert a["digest"] == b["digest"]

