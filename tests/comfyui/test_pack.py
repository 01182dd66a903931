# SPDX-License-Identifier: Apache-2.0
"""The node pack (integrations/comfyui) against stock ComfyUI, headless on the
CPU, on the tiny models of tests/data/comfy_models.py.

Three ComfyUI processes, side by side:
  stock  no pack: the stock prompts of Wan 2.1 T2V, Flux.1-dev and SDXL, SDXL
         with another text, with a LoRA (LoraLoader: UNet and both text
         encoders), and SDXL from a legacy (non-zip) .pt checkpoint;
  pack   the pack linked into custom_nodes/, ferry imported from this
         checkout (python/ and $FERRY_LIBRARY): the same prompts with each
         stock loader swapped for the pack's node standing for it (by node
         id; the classes from the pack's NODE_CLASS_MAPPINGS), the LoRA
         prompt before the other-text one, so that the latter runs on the
         pack's weights after the LoRA was applied and taken off again;
  host   the pack with FERRY_HOST_LIMIT_GB at 1 MiB: SDXL, and a Wan model that
         ferry's store streams on a sim device under that host budget;
  sim    the pack with ferry's store on a sim device smaller than each model
         (FERRY_COMFYUI_DEVICE): two Wan models swapped, SDXL with a LoRA;
         a keeper (`ferry keep`, the CLI beside the library) runs on the
         default socket of its XDG_RUNTIME_DIR, which the store uses (the
         host process's has none: its store reads the checkpoints).
Every prompt's outputs (latent and image, the harness's digest) must be
bit-identical to stock's; the pack's loads must have gone through ferry (its
stats JSON and its log line: weights as views of the file), except the
legacy file, which ferry refuses: ComfyUI's loader then reads it, and the log
names the file and the reason. The checkpoint the LoRA patched is unchanged on
disk. Each prompt gets one memory line in the log and one JSON line in
$FERRY_COMFYUI_STATS. A host limit far below what a prompt takes is only
reported today: the prompt runs, the start-up log names the budget.

Run with the interpreter of scripts/deps.sh's torch-2 environment
(tests/comfyui/run_comfyui.sh pack, ctest comfyui_pack); skips without
ComfyUI, its packages or ferry's library."""
import concurrent.futures
import copy
import hashlib
import json
import os
import re
import signal
import sys
import time

import pytest

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.join(ROOT, "tests", "data"))

import harness  # noqa: E402
import prompts  # noqa: E402
from keeper import start_keeper  # noqa: E402

COMFYUI = harness.require_comfyui(pytest)
LIBRARY = os.path.abspath(os.environ.get("FERRY_LIBRARY") or os.path.join(ROOT, "build", "libferry.so"))
if not os.path.isfile(LIBRARY):
    pytest.skip(f"no ferry library at {LIBRARY} (build ferry_shared, or set FERRY_LIBRARY)",
                allow_module_level=True)

import comfy_models  # noqa: E402

PACK = os.path.join(ROOT, "integrations", "comfyui")
PACK_NAME = os.path.basename(PACK)      # the harness links a pack under its folder's name
HOST_LIMIT = 1 << 20                    # bytes: far below what any prompt takes
SIM_DEVICE = "sim:2MiB"                 # smaller than each FP32 Wan (2.2 MiB) and every text encoder
# the pack's view of ferry: this checkout's package and library
PACK_ENV = {"FERRY_LIBRARY": LIBRARY, "PYTHONPATH": os.path.join(ROOT, "python"),
            "FERRY_COMFYUI_DISABLE": None, "FERRY_HOST_LIMIT_GB": None, "FERRY_COMFYUI_USS": None,
            "FERRY_COMFYUI_KEEPER": None}
KEEP_CLI = os.path.join(os.path.dirname(LIBRARY), "ferry")  # `ferry keep`, built beside the library
# ComfyUI's messages on weights a loader did not place (test_stock.check_weight_messages)
WEIGHT_MESSAGES = ("unet missing", "unet unexpected", "clip missing", "clip unexpected",
                   "Missing VAE keys", "Leftover VAE keys", "left over keys")


FERRY_NODES = prompts.pack_nodes(PACK)


def with_pack(prompt):
    """The prompt with every stock loader replaced by the pack's node."""
    return prompts.with_pack(prompt, FERRY_NODES)


def sha256(path):
    with open(path, "rb") as f:
        return hashlib.sha256(f.read()).hexdigest()


class Proc:
    """One ComfyUI process's result: prompt tags in order, its log (the
    console at INFO), its stats JSON lines."""

    def __init__(self, result, tags, stats_path=None):
        self.result = result
        self.tags = tags
        with open(result["log_file"], errors="replace") as f:
            self.log = f.read()
        self.stats = []
        if stats_path and os.path.exists(stats_path):
            with open(stats_path) as f:
                self.stats = [json.loads(line) for line in f]

    def run(self, tag):
        runs = self.result["runs"]
        i = self.tags.index(tag)
        assert i < len(runs), f"prompt {tag} did not run: " + harness.describe_failure(self.result)
        assert runs[i]["ok"], f"prompt {tag}: " + harness.describe_failure(self.result)
        return runs[i]

    def rec(self, tag):
        """The stats JSON line of prompt `tag`."""
        pid = f"harness-{self.tags.index(tag)}"
        found = [r for r in self.stats if r["prompt_id"] == pid]
        assert len(found) == 1, f"{len(found)} stats lines for {pid}"
        return found[0]

    def ferry_lines(self):
        """The pack's log messages (the text after the level and logger)."""
        return [m.group(1) for m in re.finditer(r"^\w+ [\w.]+: (ferry: .*)$", self.log, re.M)]

    def weight_messages(self):
        return sorted(r["message"] for r in self.result["log"] if r["message"].startswith(WEIGHT_MESSAGES))


@pytest.fixture(scope="module")
def procs(tmp_path_factory):
    top = tmp_path_factory.mktemp("pack")
    xdg = {name: str(top / f"xdg-{name}") for name in ("sim", "host")}  # runtime dirs: a keeper in the sim's
    for d in xdg.values():
        os.mkdir(d, 0o700)
    keeper_log = open(top / "keeper.log", "ab")
    keeper = start_keeper(KEEP_CLI, xdg["sim"], keeper_log)
    models_dir = str(top / "models")
    files = comfy_models.write_models(models_dir)
    # the SDXL checkpoint as a legacy (pre-1.6, non-zip) torch.save file: ferry
    # refuses it, ComfyUI's loader reads it
    import safetensors.torch
    import torch
    ckpt = os.path.join(models_dir, comfy_models.FILES["sdxl"]["ckpt"])
    legacy = os.path.join(os.path.dirname(ckpt), "tiny_sdxl_legacy.pt")
    torch.save(safetensors.torch.load_file(ckpt), legacy, _use_new_zipfile_serialization=False)
    before = sha256(ckpt)

    sdxl = prompts.sdxl(files["sdxl"])
    sdxl_b = copy.deepcopy(sdxl)
    sdxl_b["pos"]["inputs"]["text"] = "a tiny owl on a branch"
    lora = prompts.with_lora(sdxl, files["sdxl"]["lora"], strength_model=0.8, strength_clip=0.8)
    legacy_p = copy.deepcopy(sdxl)
    legacy_p["ckpt"]["inputs"]["ckpt_name"] = os.path.basename(legacy)
    stock = {"wan": prompts.wan21_t2v(files["wan"]), "flux": prompts.flux_dev(files["flux"]), "sdxl": sdxl,
             "sdxl_b": sdxl_b, "sdxl_lora": lora, "sdxl_legacy": legacy_p}
    # two Wan models in FP32 (what ComfyUI computes with on the CPU, so it
    # keeps the file's tensors and ferry's store can hold them), each larger
    # than the sim device the "sim" process gives the store
    for name, seed in (("tiny_wan_f32_a.safetensors", 21), ("tiny_wan_f32_b.safetensors", 22)):
        comfy_models.write_wan21_t2v(os.path.join(models_dir, "diffusion_models", name), seed=seed, dtype="F32")
        p = copy.deepcopy(stock["wan"])
        p["unet"]["inputs"]["unet_name"] = name
        stock["wan_" + name[-13]] = p
    # a Wan whose Linear weights are GGUF block-quantized (every type the pack
    # dequantizes), and the same values as an F32 safetensors file for stock
    qtypes = comfy_models.write_wan21_t2v_gguf(
        os.path.join(models_dir, "diffusion_models", "tiny_wan_q.gguf"),
        os.path.join(models_dir, "diffusion_models", "tiny_wan_q_ref.safetensors"), _dequantize)
    stock["wan_q"] = copy.deepcopy(stock["wan"])
    stock["wan_q"]["unet"]["inputs"]["unet_name"] = "tiny_wan_q_ref.safetensors"
    _write_wan_lora(os.path.join(models_dir, "loras", "tiny_wan_lora.safetensors"))
    stock["wan_q_lora"] = prompts.with_lora(stock["wan_q"], "tiny_wan_lora.safetensors", strength_model=0.8,
                                            strength_clip=0.0)
    # a Wan in ComfyUI's scaled-FP8 form (F8_E4M3 matrices, .scale_weight, the marker)
    comfy_models.write_wan21_t2v_fp8_scaled(os.path.join(models_dir, "diffusion_models", "tiny_wan_fp8s.safetensors"))
    stock["wan_fp8"] = copy.deepcopy(stock["wan"])
    stock["wan_fp8"]["unet"]["inputs"]["unet_name"] = "tiny_wan_fp8s.safetensors"
    stock_order = ["wan", "flux", "sdxl", "sdxl_b", "sdxl_lora", "sdxl_legacy", "wan_a", "wan_b", "wan_q",
                   "wan_q_lora", "wan_fp8"]
    sim_order = ["wan_a", "wan_b", "wan_a", "sdxl_lora", "sdxl", "wan_q_lora", "wan_q"]
    pack_order = ["wan", "flux", "sdxl", "sdxl_lora", "sdxl_b", "sdxl_legacy", "wan_q_lora", "wan_q", "wan_fp8"]
    stats = {name: str(top / f"{name}_stats.jsonl") for name in ("pack", "host", "sim")}
    jobs = {
        "stock": ([stock[t] for t in stock_order], stock_order, (), {"FERRY_COMFYUI_STATS": None}),
        "pack": ([with_pack(_gguf_prompt(stock[t]) if t.startswith("wan_q") else stock[t])
                  for t in pack_order], pack_order, (PACK,),
                 dict(PACK_ENV, FERRY_COMFYUI_STATS=stats["pack"])),
        "sim": ([with_pack(_gguf_prompt(stock[t]) if t.startswith("wan_q") else stock[t]) for t in sim_order],
                sim_order, (PACK,),
                dict(PACK_ENV, FERRY_COMFYUI_STATS=stats["sim"], FERRY_COMFYUI_DEVICE=SIM_DEVICE,
                     XDG_RUNTIME_DIR=xdg["sim"])),
        "host": ([with_pack(sdxl), with_pack(stock["wan_a"])], ["sdxl", "wan_a"], (PACK,),
                 dict(PACK_ENV, FERRY_COMFYUI_STATS=stats["host"], FERRY_HOST_LIMIT_GB=repr(HOST_LIMIT / 2 ** 30),
                      FERRY_COMFYUI_DEVICE=SIM_DEVICE, XDG_RUNTIME_DIR=xdg["host"])),
    }
    t0 = time.perf_counter()
    with concurrent.futures.ThreadPoolExecutor(len(jobs)) as pool:
        futs = {name: pool.submit(harness.run, ps, models_dir, custom_nodes=packs,
                                  overrides=comfy_models.comfy_overrides(), comfyui=COMFYUI,
                                  workdir=str(top / name), timeout=300, env=env)
                for name, (ps, _, packs, env) in jobs.items()}
        out = {name: Proc(f.result(), jobs[name][1], stats.get(name)) for name, f in futs.items()}
    print(f"three ComfyUI processes side by side: {time.perf_counter() - t0:.1f} s")
    for name, p in out.items():
        r = p.result
        print(f"  {name}: start-up {r.get('startup_s')} s, "
              + ", ".join(f"{t} {run.get('execute_s')} s" for t, run in zip(p.tags, r["runs"])))
    if keeper is not None:
        keeper.send_signal(signal.SIGTERM)
        out["keeper_exit"] = keeper.wait(10)
    keeper_log.close()
    out["keeper"] = keeper is not None
    out["files"] = files
    out["qtypes"] = qtypes
    out["ckpt"] = (ckpt, before)
    out["legacy"] = legacy
    return out


def _dequantize(data, qtype, shape):
    """gguf_quants.dequantize (the pack's, read as a file: it needs only torch)
    for comfy_models' GGUF writer."""
    import importlib.util
    import torch
    spec = importlib.util.spec_from_file_location("gguf_quants", os.path.join(PACK, "gguf_quants.py"))
    gq = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(gq)
    return gq.dequantize(torch.frombuffer(bytearray(data), dtype=torch.uint8), qtype, shape).numpy()


def _write_wan_lora(path):
    """A LoRA for the tiny Wan (rank 4) on blocks' q, ffn.2 and cross-attention
    o: quantized layers of the GGUF model in 32- and 256-value types."""
    import safetensors.torch
    import torch
    g = torch.Generator().manual_seed(3)
    sd = {}
    for b in range(2):
        for p, n_in in (("self_attn.q", 128), ("ffn.2", 256), ("cross_attn.o", 128)):
            sd[f"diffusion_model.blocks.{b}.{p}.lora_up.weight"] = torch.randn(128, 4, generator=g) * 0.05
            sd[f"diffusion_model.blocks.{b}.{p}.lora_down.weight"] = torch.randn(4, n_in, generator=g) * 0.05
    os.makedirs(os.path.dirname(path), exist_ok=True)
    safetensors.torch.save_file(sd, path)


def _gguf_prompt(p):
    p = copy.deepcopy(p)
    p["unet"]["inputs"]["unet_name"] = "tiny_wan_q.gguf"
    return p


def test_gguf_block_quantized(procs):
    """A Wan 2.1 DiT from a GGUF file whose Linear weights are block-quantized
    in every type the pack reads (Q8_0 ... Q6_K): the pack's loader builds it
    with its GGUF operations (the bytes are the weights, dequantized as each
    layer runs) and the outputs are stock ComfyUI's on the same values stored
    as F32 safetensors, bit for bit; with a LoRA too."""
    stock, pack = procs["stock"], procs["pack"]
    a, b = stock.run("wan_q"), pack.run("wan_q")
    assert a["digest"] == b["digest"], "the GGUF model gave other outputs than its F32 values on stock"
    (ev,) = [e for e in pack.rec("wan_q_lora")["loads"] if e["node"] == "UNETLoader"]  # (wan_q: cached)
    assert ev["via"] == "ferry" and ev["format"] == "gguf", ev
    assert ev["qtypes"] == procs["qtypes"] and len(ev["qtypes"]) == 10, ev
    assert ev["dequantized_at_use"] > 0, ev
    line = [l for l in pack.ferry_lines() if "tiny_wan_q.gguf" in l and "dequantized as their layers run" in l]
    assert line, [l for l in pack.ferry_lines() if "gguf" in l]
    # a LoRA on the quantized layers (ComfyUI's convert/set hooks), as stock's
    # on the F32 values; the pack's prompt after it, without the LoRA, is
    # the plain model's again
    assert pack.run("wan_q_lora")["nodes"]["lora"]["status"] == "executed"
    assert stock.run("wan_q_lora")["digest"] != a["digest"], "the LoRA changed nothing"
    assert pack.run("wan_q_lora")["digest"] == stock.run("wan_q_lora")["digest"]
    missed = [r["message"] for r in pack.result["log"] if "lora key not loaded" in r["message"]]
    assert not missed, missed


def test_scaled_fp8(procs):
    """A Wan in ComfyUI's scaled-FP8 form through the pack's loader: read by
    ferry, its FP8 layers loaded by ComfyUI's own quantized operations,
    outputs stock's."""
    stock, pack = procs["stock"], procs["pack"]
    assert pack.run("wan_fp8")["digest"] == stock.run("wan_fp8")["digest"]
    (ev,) = [e for e in pack.rec("wan_fp8")["loads"] if e["node"] == "UNETLoader"]
    assert ev["via"] == "ferry" and ev["own_loading_tensors"] > 0, ev


def test_pack_loads_with_ferry(procs):
    """The pack's nodes are registered, ferry comes from this checkout, the
    prompt hook is in."""
    for name in ("pack", "host"):
        p = procs[name]
        assert p.result["ok"], f"{name}: " + harness.describe_failure(p.result)
        pack = p.result["custom_nodes"][PACK_NAME]
        assert pack["loaded"], pack
        assert pack["nodes"] == sorted(FERRY_NODES.values()), pack
        lines = p.ferry_lines()
        lib = os.path.realpath(LIBRARY)
        assert any(re.fullmatch(r"ferry: ferry \S+ \((.*)\)", l) and os.path.realpath(l[l.index("(") + 1:-1]) == lib
                   for l in lines), f"no start-up line naming {lib}: {lines[:5]}"
        assert "ferry: per-prompt memory line through ComfyUI's cache-provider prompt hooks" in lines, lines[:5]
        assert not [l for l in lines if "not importable" in l or "no module registration hooks" in l], lines


def _ferry_loads(p, tag, stock_classes):
    """The pack's load events in prompt `tag`: one for each stock loader the
    pack's nodes stand for, each through ferry, each with its log line."""
    loads = p.rec(tag)["loads"]
    want = sorted(c for c in stock_classes if c in FERRY_NODES)
    assert sorted(e["node"] for e in loads) == want, loads
    lines = p.ferry_lines()
    for e in loads:
        assert e["via"] == "ferry", f"{e['node']} fell back: {e.get('reason')}"
        assert e["kept_tensors"] + e["copied_tensors"] + e["own_loading_tensors"] > 0, e
        head = f"ferry: {', '.join(e['files'])}: {e['tensors']} tensors, "
        line = [l for l in lines if l.startswith(head) and f"); {e['node']} built in " in l]
        assert line, f"no log line for {e['node']} starting {head!r}"
        assert "as views of the file" in line[0] and f"{e['kept_tensors']} views of the file" in line[0], line[0]
    return loads


@pytest.mark.parametrize("arch", ["wan", "flux", "sdxl"])
def test_same_outputs(arch, procs):
    """Each architecture's prompt through the pack's loaders: ferry's path,
    weights kept as views of the file, outputs bit-identical to stock's."""
    stock, pack = procs["stock"], procs["pack"]
    a, b = stock.run(arch), pack.run(arch)
    swapped = [k for k, n in b["nodes"].items() if n["class_type"] in FERRY_NODES.values()]
    assert swapped and all(b["nodes"][k]["status"] == "executed" for k in swapped), b["nodes"]
    assert {n["status"] for n in b["nodes"].values()} <= {"executed", "cached"}, b["nodes"]
    loads = _ferry_loads(pack, arch, [n["class_type"] for n in a["nodes"].values()])
    # the text encoders' F16 weights are what ComfyUI computes with on the
    # CPU: kept as the file's views (BF16 diffusion models become FP32 copies)
    assert sum(e["kept_tensors"] for e in loads) > 0, loads
    assert sorted(map(json.dumps, a["loaded_models"])) == sorted(map(json.dumps, b["loaded_models"]))
    assert a["tensors"] and [t["sha256"] for t in a["tensors"]] == [t["sha256"] for t in b["tensors"]], \
        f"{arch}: the pack's loaders gave other outputs than stock's"
    assert a["digest"] == b["digest"]


def test_same_weight_messages(procs):
    """Every weight a stock loader reports missing or left over, the pack's
    reports too, and nothing more."""
    # (as sets: the stock process also runs the sim process's Wan prompts)
    assert set(procs["stock"].weight_messages()) == set(procs["pack"].weight_messages())


def test_lora(procs):
    """LoraLoader (UNet and both text encoders) on the pack's SDXL: as on
    stock's; the checkpoint file unchanged; once the LoRA is off again the
    pack's weights give stock's outputs."""
    stock, pack = procs["stock"], procs["pack"]
    a, b = stock.run("sdxl_lora"), pack.run("sdxl_lora")
    assert b["nodes"]["lora"]["status"] == "executed", b["nodes"]
    for p in (stock, pack):
        missed = [r["message"] for r in p.result["log"] if "lora key not loaded" in r["message"]]
        assert not missed, missed
    assert a["digest"] != stock.run("sdxl")["digest"], "the LoRA changed nothing"
    assert a["digest"] == b["digest"], "the LoRA on the pack's model gave other outputs than on stock's"
    # the checkpoint loaded by the pack (ferry's views of the file, which the
    # LoRA patched while loaded) is unchanged on disk
    ckpt, before = procs["ckpt"]
    ck = [e for e in pack.rec("sdxl")["loads"] if e["node"] == "CheckpointLoaderSimple"]
    assert ck and ck[0]["via"] == "ferry" and ck[0]["kept_tensors"] > 0, ck
    assert sha256(ckpt) == before, f"{ckpt} changed"
    # after the LoRA prompt: the checkpoint node cached, new text, the base
    # model and CLIP again
    after = pack.run("sdxl_b")
    assert after["nodes"]["ckpt"]["status"] == "cached", after["nodes"]
    assert after["digest"] == stock.run("sdxl_b")["digest"], "after the LoRA the pack's weights are not the file's"


def test_unsupported_file_falls_back(procs):
    """A legacy (non-zip) .pt in the pack's checkpoint loader: ComfyUI's
    loader reads it, the outputs are stock's, the log says which file and
    why."""
    stock, pack = procs["stock"], procs["pack"]
    a, b = stock.run("sdxl_legacy"), pack.run("sdxl_legacy")
    assert b["nodes"]["ckpt"]["status"] == "executed", b["nodes"]
    assert a["digest"] == b["digest"], "the fallback gave other outputs than stock's"
    legacy = procs["legacy"]
    (ev,) = pack.rec("sdxl_legacy")["loads"]
    assert ev["node"] == "CheckpointLoaderSimple" and ev["via"] == "comfyui", ev
    assert ev["files"] == [legacy] and "legacy (pre-1.6, non-zip)" in ev["reason"], ev
    warned = [r["message"] for r in pack.result["log"]
              if r["message"].startswith(f"ferry: {legacy}: ") and r["level"] == "WARNING"]
    assert len(warned) == 1, warned
    assert ev["reason"] in warned[0] and warned[0].endswith("; loading with ComfyUI's loader"), warned


def test_memory_line_and_stats_per_prompt(procs):
    """One memory line in the log and one JSON line in $FERRY_COMFYUI_STATS
    for every prompt, in order, with the RSS, USS and anon figures."""
    for name in ("pack", "host"):
        p = procs[name]
        n = len(p.tags)
        assert len(p.result["runs"]) == n
        lines = p.ferry_lines()
        for i in range(n):
            mine = [l for l in lines if re.match(rf"ferry: prompt harness-{i}: [0-9.]+ s \| ", l)]
            assert len(mine) == 1, f"{name}: memory lines of prompt {i}: {mine}"
            assert re.search(r" \| RSS start/end/peak .+ \| USS start/end .+ \| anon start/end/peak .+ \| ferry: ",
                             mine[0]), mine[0]
        assert [r["prompt_id"] for r in p.stats] == [f"harness-{i}" for i in range(n)], p.stats
        for r in p.stats:
            rss, uss, anon = r["rss"], r["uss"], r["anon"]
            assert all(isinstance(rss[k], int) and rss[k] > 0 for k in ("start", "end", "peak")), r
            assert rss["peak"] >= max(rss["start"], rss["end"]), r
            assert all(isinstance(uss[k], int) and 0 < uss[k] <= rss[k] for k in ("start", "end")), r
            assert all(isinstance(anon[k], int) for k in ("start", "end", "peak")), r
            assert r["seconds"] > 0 and isinstance(r["loads"], list), r


def test_host_limit_reported(procs):
    """FERRY_HOST_LIMIT_GB far below what the prompt takes: the prompt runs
    (and gives stock's outputs), the start-up log names the budget, the
    prompt's private memory is reported over it; ferry's store, whose host
    budget it is, streams a model through the ring with no pinned copies."""
    host, stock = procs["host"], procs["stock"]
    run = host.run("sdxl")
    assert run["digest"] == stock.run("sdxl")["digest"]
    lines = host.ferry_lines()
    assert "ferry: host budget 1.00 MiB (FERRY_HOST_LIMIT_GB)" in lines, [l for l in lines if "budget" in l]
    over = [r["message"] for r in host.result["log"] if r["level"] == "WARNING"
            and r["message"].startswith("ferry: prompt harness-0: private memory peaked at ")]
    assert len(over) == 1 and over[0].endswith("over FERRY_HOST_LIMIT_GB=1.00 MiB"), over
    rec = host.rec("sdxl")
    assert rec["host_limit"] == HOST_LIMIT, rec
    assert [e["via"] for e in rec["loads"]] == ["ferry"], rec["loads"]
    # ferry's store under that host budget (on the sim device): the Wan model
    # streams through the ring, keeps no pinned copies, gives stock's outputs
    wan = host.run("wan_a")
    assert wan["digest"] == stock.run("wan_a")["digest"]
    rec = host.rec("wan_a")
    held = [m for k, m in rec["models"].items() if k.startswith("model:tiny_wan_f32_a")]
    assert held and held[0]["streamed"] and held[0]["steps"] > 0, rec["models"]
    assert rec["ferry"]["pinned"] == 0 and rec["ferry"]["host"] == 0, rec["ferry"]


def test_residency_on_sim(procs):
    """ferry's store holds the pack's models on a sim device smaller than
    each of them (FERRY_COMFYUI_DEVICE): two Wan models, swapped twice,
    stream block by block and give stock's outputs; the text encoders and
    SDXL's UNet, which cannot fit, go back to ComfyUI's residency with the
    reason, and their prompts (the LoRA one too) give stock's outputs; the
    block-quantized GGUF Wan, with and without a LoRA, streams as well."""
    stock, sim = procs["stock"], procs["sim"]
    for i, tag in enumerate(sim.tags):
        run = sim.result["runs"][i] if i < len(sim.result["runs"]) else None
        assert run is not None and run["ok"], f"sim prompt {i} ({tag}): " + harness.describe_failure(sim.result)
        assert run["digest"] == stock.run(tag)["digest"], f"sim prompt {i} ({tag}): other outputs than stock's"
    for i in range(3):  # wan_a, wan_b, wan_a
        rec = sim.stats[i]
        held = {k: v for k, v in rec["models"].items() if k.startswith("model:tiny_wan_f32_")}
        assert held, rec["models"]
        for name, m in held.items():
            assert m["device"] == SIM_DEVICE and m["streamed"], (name, m)
            assert m["bytes"] > 2 << 20 and m["steps"] > 0 and m["streamed_blocks"] > 0, (name, m)
            assert m["streamed_bytes_per_step"] > 0, (name, m)
        assert rec["ferry"]["device"] <= 2 << 20, rec["ferry"]
        # a model whose node output ComfyUI dropped left the store: only this
        # prompt's Wan is there
        assert len(held) == 1, rec["models"]
    # the GGUF model (block-quantized bytes) is held and streamed too
    for i in (5, 6):
        rec = sim.stats[i]
        held = [m for k, m in rec["models"].items() if k.startswith("model:tiny_wan_q.gguf")]
        assert held and held[0]["streamed"] and held[0]["steps"] > 0, (sim.tags[i], rec["models"])
    back = [e for r in sim.stats for e in r["residency"]]
    assert any(e["model"].startswith("text encoder:") for e in back), back
    assert all(e["reason"] for e in back), back
    lines = sim.ferry_lines()
    assert any(l.startswith("ferry: a store on sim:2MiB holds the ferry nodes' models") for l in lines), lines[:8]


def test_keeper_on_sim(procs):
    """The sim process's store used the keeper running on its default socket
    (FERRY_COMFYUI_KEEPER unset): streamed blocks after the first step and the
    Wan prompt run again came from it, with stock's outputs
    (test_residency_on_sim); the host process's store, with no keeper on its
    socket, said so and read its checkpoints."""
    if not procs["keeper"]:
        pytest.skip(f"no ferry CLI at {KEEP_CLI} to run a keeper")
    sim, host = procs["sim"], procs["host"]
    assert procs["keeper_exit"] == 0
    assert any(l.startswith("ferry: the store on sim:2MiB asks the keeper at the default socket")
               for l in sim.ferry_lines()), sim.ferry_lines()[:10]
    assert any(l.startswith("ferry: no keeper for the store on sim:2MiB") for l in host.ferry_lines()), \
        host.ferry_lines()[:10]
    # wan_a (its first step's blocks read, the later steps' served), then wan_a again after wan_b
    # (all served, nothing read)
    first, again = sim.stats[0]["ferry"], sim.stats[2]["ferry"]
    assert first["from_keeper"] > 0 and first["read"] > 0, first
    assert again["from_keeper"] > 0 and again["read"] == 0, again
    assert all(r["ferry"]["from_keeper"] == 0 for r in host.stats), [r["ferry"] for r in host.stats]


def test_lazy_layers_keep_the_file_dtype(tmp_path):
    """ComfyUI's layers made without weights (comfy.ops while its dynamic
    VRAM is on) loaded from a BF16 file into an FP16 model with a patcher
    that is not dynamic: ComfyUI's own loading leaves them BF16 and the
    first forward fails; keep_views(cast_at_use=True), which the pack uses
    where ferry's store holds the model, keeps the file's views and casts as
    the layer runs, giving the converted model's output bit for bit."""
    import subprocess
    env = dict(os.environ, FERRY_LIBRARY=LIBRARY, PYTHONPATH=os.path.join(ROOT, "python"), PYTHONDONTWRITEBYTECODE="1")
    proc = subprocess.run([sys.executable, os.path.join(HERE, "lazy_layers_probe.py"), COMFYUI, PACK, str(tmp_path)],
                          capture_output=True, text=True, env=env, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    r = json.loads(proc.stdout.strip().splitlines()[-1])
    stock, kept = r["stock"], r["kept"]
    assert "Half and BFloat16" in stock.get("error", ""), stock
    assert kept["is_file_view"] and kept["casts_at_use"] and kept["dtype"] == "torch.bfloat16", kept
    assert kept["built_dtypes"] == {"weight": "torch.float16", "bias": "torch.float16"}, kept
    assert "error" not in kept and kept["out_dtype"] == "torch.float16", kept
    assert kept["out"] == r["converted_out"], r
    assert r["kept_stats"]["kept_tensors"] == 2 and r["kept_stats"]["copied_tensors"] == 0, r

