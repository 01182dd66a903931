# SPDX-License-Identifier: Apache-2.0
"""Run the real ComfyUI headless and in-process on API-format prompts, one
ComfyUI per process (it keeps global state: the node registry, loaded models,
caches), and report what each node did and digests of what came out.

Test side (any Python; imports nothing of ComfyUI):

    find_comfyui() -> (dir or None, reason)
    run(prompts, models_dir, custom_nodes=(), extra_args=(), overrides=None,
        python=None, comfyui=None, workdir=None, timeout=600, cpu=True,
        env=None) -> result dict
    describe_failure(result) -> str    # for assertion messages

Process side, the interpreter that has ComfyUI's packages (run() starts it):

    python harness.py run --prompt P.json [--prompt P2.json ...] --models DIR
        --out OUT.json [--custom-node PATH ...] [--overrides O.json]
        [--comfyui DIR] [--base DIR] [--no-cpu] [-- COMFYUI FLAGS ...]
    python harness.py find     # ComfyUI's directory, or exit 77 with the reason

It does what ComfyUI's main.py does at start-up, without the HTTP server:
parse ComfyUI's flags (--base-directory: a temporary folder with
custom_nodes/, output/, temp/, input/, user/; --models-directory; --cpu
unless --no-cpu), run the custom nodes' prestartup scripts, start dynamic
VRAM where ComfyUI would, load the built-in and custom nodes; then for each
prompt what its prompt worker does: execution.validate_prompt and
execution.PromptExecutor.execute, with one executor for all the prompts of a
process (later prompts see the earlier ones' caches and loaded models, as on
a server). The custom node packs given are linked into custom_nodes/, and so
is harness_nodes/ (FerryHarnessSaveTensor: exact tensor digests).

overrides (run()'s dict; the CLI's JSON file) adapts ComfyUI to test models whose
configuration it cannot read from the weights (tests/data/comfy_models.py):
  "text_encoder_configs": {name: {config key: value}}: merged into every
      text encoder's model options as "<name>_model_config", which ComfyUI's
      text encoders apply over their fixed JSON configs (names: clip_l,
      clip_g, t5xxl, umt5xxl, ...); options a loader sets itself win;
  "supported_models": [{"name", "base", "unet_config"}]: a subclass of
      comfy.supported_models.<base> matching unet_config, tried first.

The result (JSON, and run()'s return value):
  ok              every prompt validated and ran without error
  stage           where it stopped: "startup", "validate", "execute" or "done"
  error           None, or {"stage", "message", "traceback", ...}
  custom_nodes    {pack name: {"loaded": bool, "nodes": [class names]}}
  import_failed   comfy_extras modules that did not import (missing packages)
  runs            one per prompt, until one fails:
    ok, error       as above; node_errors: validate_prompt's, per node
    nodes           {id: {"class_type", "status": executed|cached|failed|
                    not_run, "s": seconds it ran}}
    outputs         {id: the node's ui output}
    files           files the output nodes saved: {"node_id", "key", "path",
                    "sha256", "pixels_sha256" (images: pixels, not metadata)}
    tensors         FerryHarnessSaveTensor records: {"node_id", "name",
                    "kind" (image|latent), "file", "sha256", "shape", "dtype",
                    "finite"}
    digest          one sha256 over the tensors' and the images' pixel digests
    loaded_models   comfy.model_management.current_loaded_models afterwards:
                    [{"patcher", "model", "config", "device"}] (class names;
                    config: the supported-model class ComfyUI picked)
    validate_s, execute_s
  log             WARNING and above, and every message about missing,
                  unexpected or left-over weights (at any level)
  startup_s, total_s, node_count, comfyui {"dir", "version"}, torch,
  python, base_dir
run() adds "returncode", "log_file" (the process's stdout and stderr) and,
when the process wrote no result, "error" with the tail of that log.
"""
import argparse
import hashlib
import json
import os
import re
import subprocess
import sys
import tempfile
import time
import traceback

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
HARNESS_NODES = os.path.join(HERE, "harness_nodes")
HARNESS_NODES_NAME = "ferry_harness_nodes"


# ---------------------------------------------------------------- test side

def find_comfyui():
    """ComfyUI's directory: $COMFYUI_DIR, else ../shared/comfyui beside the
    repository root. Returns (dir, None), or (None, why not)."""
    env = os.environ.get("COMFYUI_DIR")
    if env:
        if os.path.isfile(os.path.join(env, "execution.py")):
            return os.path.abspath(env), None
        return None, f"COMFYUI_DIR={env} holds no ComfyUI (no execution.py)"
    d = os.path.join(os.path.dirname(ROOT), "shared", "comfyui")
    if os.path.isfile(os.path.join(d, "execution.py")):
        return os.path.abspath(d), None
    return None, f"no ComfyUI: set COMFYUI_DIR, or put a checkout at {d}"


# what ComfyUI imports to run the tests' prompts (scripts/deps.sh installs them)
NEEDS = ("torch", "numpy", "safetensors", "comfy_aimdo", "comfy_kitchen", "torchsde", "einops", "av",
         "transformers", "sentencepiece", "torchvision", "torchaudio", "scipy", "PIL", "yaml")


def require_comfyui(pytest):
    """For a test module: ComfyUI's directory, after skipping the module (with
    the reason) where there is no ComfyUI or this Python lacks what it needs."""
    comfyui, why = find_comfyui()
    if comfyui is None:
        pytest.skip(why, allow_module_level=True)
    for mod in NEEDS:
        pytest.importorskip(mod, reason=f"ComfyUI needs {mod} (scripts/deps.sh installs it)")
    return comfyui


def run(prompts, models_dir, custom_nodes=(), extra_args=(), overrides=None, python=None,
        comfyui=None, workdir=None, timeout=600, cpu=True, env=None):
    """Run `prompts` (one API-format prompt dict, or a list of them) through a
    fresh ComfyUI process and return its result (see the module's comment).
    workdir: where the prompt files, the base directory, the log and the
    result go (a new temporary folder if None; it is kept). env: variables
    set for that process on top of this one's (a node pack's settings, the
    library it loads); a value of None removes the variable."""
    if isinstance(prompts, dict):
        prompts = [prompts]
    if comfyui is None:
        comfyui, why = find_comfyui()
        if comfyui is None:
            raise RuntimeError(why)
    workdir = workdir or tempfile.mkdtemp(prefix="comfy-harness-")
    os.makedirs(workdir, exist_ok=True)
    cmd = [python or sys.executable, os.path.abspath(__file__), "run", "--models", os.path.abspath(models_dir),
           "--comfyui", comfyui, "--base", os.path.join(workdir, "base"),
           "--out", os.path.join(workdir, "result.json")]
    for i, p in enumerate(prompts):
        path = os.path.join(workdir, f"prompt{i}.json")
        with open(path, "w") as f:
            json.dump(p, f, indent=1)
        cmd += ["--prompt", path]
    for c in custom_nodes:
        cmd += ["--custom-node", os.path.abspath(c)]
    if overrides is not None:
        path = os.path.join(workdir, "overrides.json")
        with open(path, "w") as f:
            json.dump(overrides, f, indent=1)
        cmd += ["--overrides", path]
    if not cpu:
        cmd.append("--no-cpu")
    if extra_args:
        cmd += ["--"] + list(extra_args)
    log_file = os.path.join(workdir, "comfyui.log")
    child_env = dict(os.environ, PYTHONDONTWRITEBYTECODE="1")
    for k, v in (env or {}).items():
        if v is None:
            child_env.pop(k, None)
        else:
            child_env[k] = str(v)
    with open(log_file, "wb") as log:
        try:
            rc = subprocess.run(cmd, stdout=log, stderr=subprocess.STDOUT, timeout=timeout, env=child_env).returncode
        except subprocess.TimeoutExpired:
            rc = None
    try:
        with open(os.path.join(workdir, "result.json")) as f:
            result = json.load(f)
    except (OSError, ValueError):
        result = {"ok": False, "stage": "startup", "runs": [], "log": [],
                  "error": {"stage": "startup", "message": "timed out after %ss" % timeout if rc is None else
                            f"the harness process exited with {rc} and wrote no result",
                            "traceback": _tail(log_file)}}
    result["returncode"] = rc
    result["log_file"] = log_file
    return result


def _tail(path, n=4000):
    try:
        with open(path, "rb") as f:
            f.seek(0, 2)
            f.seek(max(0, f.tell() - n))
            return f.read().decode("utf-8", "replace")
    except OSError:
        return ""


def describe_failure(result):
    """One readable paragraph on why a result is not ok (for assertions)."""
    lines = []
    err = result.get("error")
    if err:
        lines.append(f"[{err.get('stage')}] {err.get('message')}")
    for i, r in enumerate(result.get("runs", [])):
        if r.get("ok"):
            continue
        e = r.get("error") or {}
        lines.append(f"prompt {i}: {e.get('message')} (node {e.get('node_id')} {e.get('node_type')})")
        if r.get("node_errors"):
            lines.append(json.dumps(r["node_errors"], indent=1)[:3000])
        if e.get("traceback"):
            lines.append("".join(e["traceback"]) if isinstance(e["traceback"], list) else str(e["traceback"]))
    if err and err.get("traceback"):
        lines.append(str(err["traceback"]))
    lines.append("log: " + str(result.get("log_file")))
    return "\n".join(lines)


# ------------------------------------------------------------- process side

# messages of ComfyUI's loaders about weights that did not fit the model built
WEIGHT_MESSAGE = re.compile(r"missing|unexpected|left ?over", re.I)


class _Capture:
    """A logging handler keeping warnings and the loaders' weight messages."""

    def __init__(self):
        import logging

        class H(logging.Handler):
            def emit(h, record):
                try:
                    msg = record.getMessage()
                except Exception:  # a malformed record must not stop the run
                    msg = str(record.msg)
                if record.levelno >= logging.WARNING or WEIGHT_MESSAGE.search(msg):
                    self.records.append({"level": record.levelname, "logger": record.name,
                                         "message": msg[:4000]})
        self.records = []
        self.handler = H(level=logging.DEBUG)


class _Server:
    """What PromptExecutor and the progress handlers use of ComfyUI's
    PromptServer: client_id, last ids, send_sync. Keeps the events."""

    def __init__(self):
        self.client_id = None
        self.last_node_id = None
        self.last_prompt_id = None
        self.sockets_metadata = {}
        self.events = []

    def send_sync(self, event, data, sid=None):
        if event in ("executing", "executed", "execution_cached", "execution_error",
                     "execution_success", "execution_interrupted"):
            self.events.append((event, data, time.perf_counter()))

    def send_progress_text(self, text, node_id, sid=None):
        pass

    def queue_updated(self):
        pass


def _sha256_file(path):
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def _pixels_sha256(path):
    """sha256 over an image's mode, size and pixels (not its metadata)."""
    try:
        from PIL import Image
        with Image.open(path) as im:
            im.load()
            return hashlib.sha256(f"{im.mode}{im.size}".encode() + im.tobytes()).hexdigest()
    except Exception:
        return None


def _collect_files(outputs, folder_paths):
    files = []
    for node_id, ui in outputs.items():
        for key, items in (ui or {}).items():
            if key == "ferry_tensors" or not isinstance(items, list):
                continue
            for it in items:
                if not isinstance(it, dict) or not it.get("filename"):
                    continue
                base = folder_paths.get_directory_by_type(it.get("type", "output"))
                if base is None:
                    continue
                path = os.path.join(base, it.get("subfolder", ""), it["filename"])
                if not os.path.isfile(path):
                    continue
                rec = {"node_id": node_id, "key": key, "path": os.path.abspath(path),
                       "type": it.get("type"), "sha256": _sha256_file(path)}
                if key == "images":
                    rec["pixels_sha256"] = _pixels_sha256(path)
                files.append(rec)
    return files


def _digest(files, tensors):
    """One digest of a prompt's outputs: tensor digests and image pixel
    digests (not file bytes: PNG metadata holds the prompt), in node order."""
    parts = sorted((t["node_id"], t["kind"], t["sha256"]) for t in tensors)
    parts += sorted((f["node_id"], f["key"], f.get("pixels_sha256") or f["sha256"]) for f in files)
    return hashlib.sha256(json.dumps(parts).encode()).hexdigest()


def _apply_overrides(ov):
    """Install the test-model adaptations (see the module's comment)."""
    import inspect
    import comfy.sd
    import comfy.supported_models

    configs = ov.get("text_encoder_configs") or {}
    if configs:
        orig = comfy.sd.CLIP.__init__
        sig = inspect.signature(orig)

        def clip_init(self, *a, **kw):
            bound = sig.bind(self, *a, **kw)
            mo = dict(bound.arguments.get("model_options") or {})
            for name, cfg in configs.items():
                key = f"{name}_model_config"
                mo[key] = {**cfg, **(mo.get(key) or {})}
            bound.arguments["model_options"] = mo
            return orig(*bound.args, **bound.kwargs)
        comfy.sd.CLIP.__init__ = clip_init

    for spec in ov.get("supported_models") or []:
        base = getattr(comfy.supported_models, spec["base"])
        cls = type(spec["name"], (base,), {"unet_config": dict(spec["unet_config"])})
        comfy.supported_models.models.insert(0, cls)


def _link(src, dst):
    if os.path.lexists(dst):
        os.remove(dst)
    os.symlink(os.path.abspath(src), dst)


def _startup(opts, result, capture):
    """Start ComfyUI in this process the way its main.py does, without the
    HTTP server. Returns (executor, server, modules)."""
    import logging

    base = os.path.abspath(opts.base)
    for d in ("custom_nodes", "output", "temp", "input", "user"):
        os.makedirs(os.path.join(base, d), exist_ok=True)
    packs = [(HARNESS_NODES_NAME, HARNESS_NODES)]
    packs += [(os.path.basename(os.path.normpath(p)), p) for p in opts.custom_node]
    for name, path in packs:
        _link(path, os.path.join(base, "custom_nodes", name))
    result["base_dir"] = base

    argv = ["main.py", "--base-directory", base, "--models-directory", os.path.abspath(opts.models)]
    if not opts.no_cpu:
        argv.append("--cpu")
    sys.argv = argv + list(opts.comfy_args)
    sys.path.insert(0, opts.comfyui)

    root = logging.getLogger()
    root.setLevel(logging.DEBUG)
    for h in list(root.handlers):
        root.removeHandler(h)
    console = logging.StreamHandler(sys.stderr)
    console.setLevel(logging.INFO)
    console.setFormatter(logging.Formatter("%(levelname)s %(name)s: %(message)s"))
    root.addHandler(console)
    root.addHandler(capture.handler)

    import comfy.options
    comfy.options.enable_args_parsing()
    from comfy.cli_args import args, enables_dynamic_vram
    import folder_paths

    # main.py's default save folders for the model-saving nodes
    out = folder_paths.get_output_directory()
    for kind in ("checkpoints", "clip", "vae", "diffusion_models", "loras"):
        folder_paths.add_model_folder_path(kind, os.path.join(out, kind))

    # the custom nodes' prestartup scripts, before anything imports torch
    import importlib.util
    for name, path in packs:
        script = os.path.join(path, "prestartup_script.py")
        if os.path.isfile(script):
            try:
                spec = importlib.util.spec_from_file_location(os.path.splitext(script)[0], script)
                spec.loader.exec_module(importlib.util.module_from_spec(spec))
            except Exception as e:
                logging.error(f"prestartup script {script} failed: {e}")

    if enables_dynamic_vram():
        import comfy_aimdo.control
        headroom = None if args.reserve_vram is None else int(args.reserve_vram * 1024 ** 3)
        comfy_aimdo.control.init(simple_vram_headroom=headroom, nvml_pressure=not args.disable_nvml_pressure)

    import asyncio
    import comfy.memory_management
    import comfy.model_management
    import comfy.model_patcher
    import comfy.utils
    import execution
    import hook_breaker_ac10a0
    import nodes
    import comfyui_version

    mm = comfy.model_management
    supported = mm.is_nvidia() or (mm.is_amd() and getattr(mm, "rocm_version", (0, 0)) >= (7, 14))
    if args.enable_dynamic_vram or (enables_dynamic_vram() and supported):
        if mm.torch_version_numeric >= (2, 8) or args.enable_dynamic_vram:
            import comfy_aimdo.control
            devices = ((d.index, int(args.vram_headroom * 1024 ** 3)) for d in mm.get_all_torch_devices())
            if comfy_aimdo.control.init_devices(devices):
                comfy.model_patcher.CoreModelPatcher = comfy.model_patcher.ModelPatcherDynamic
                comfy.memory_management.aimdo_enabled = True
                logging.info("harness: dynamic VRAM on")

    _apply_overrides(opts.overrides_dict)

    loop = asyncio.new_event_loop()
    asyncio.set_event_loop(loop)
    hook_breaker_ac10a0.save_functions()
    failed = loop.run_until_complete(nodes.init_extra_nodes(init_custom_nodes=True, init_api_nodes=False))
    if hasattr(mm, "set_cudnn_benchmark"):
        mm.set_cudnn_benchmark()
    hook_breaker_ac10a0.restore_functions()
    result["import_failed"] = list(failed or [])
    packs_out = {}
    for name, path in packs:
        mod = f"custom_nodes.{name}"
        new = sorted(k for k, c in nodes.NODE_CLASS_MAPPINGS.items()
                     if getattr(c, "RELATIVE_PYTHON_MODULE", None) == mod)
        packs_out[name] = {"loaded": name in nodes.LOADED_MODULE_DIRS, "nodes": new,
                           "path": os.path.abspath(path)}
    result["custom_nodes"] = packs_out
    result["node_count"] = len(nodes.NODE_CLASS_MAPPINGS)
    result["comfyui"] = {"dir": opts.comfyui, "version": getattr(comfyui_version, "__version__", None)}
    import torch
    result["torch"] = torch.__version__

    def progress(value, total, preview_image, prompt_id=None, node_id=None):
        mm.throw_exception_if_processing_interrupted()
    comfy.utils.set_progress_bar_global_hook(progress)

    # the prompt worker's cache settings
    cache_type = execution.CacheType.RAM_PRESSURE
    ram = min(10.0, max(2.0, mm.total_ram * 0.10 / 1024.0))
    ram_inactive = min(128.0, mm.total_ram / 1024.0)
    if len(args.cache_ram) > 0:
        ram = args.cache_ram[0]
    if len(args.cache_ram) > 1:
        ram_inactive = args.cache_ram[1]
    if args.cache_classic:
        cache_type = execution.CacheType.CLASSIC
    elif args.cache_lru > 0:
        cache_type = execution.CacheType.LRU
    elif args.cache_none:
        cache_type = execution.CacheType.NONE
    server = _Server()
    executor = execution.PromptExecutor(server, cache_type=cache_type,
                                        cache_args={"lru": args.cache_lru, "ram": ram, "ram_inactive": ram_inactive})
    return executor, server, (execution, folder_paths, loop)


def _loaded_models():
    """What sits in comfy.model_management.current_loaded_models: the
    patcher's class, the model's class and, for diffusion models, the
    supported-model config ComfyUI picked."""
    import comfy.model_management as mm
    out = []
    for lm in mm.current_loaded_models:
        patcher = lm.model
        if patcher is None:
            continue
        model = getattr(patcher, "model", None)
        cfg = getattr(model, "model_config", None)
        out.append({"patcher": type(patcher).__name__, "model": type(model).__name__,
                    "config": type(cfg).__name__ if cfg is not None else None,
                    "device": str(getattr(lm, "device", None))})
    return out


def _run_prompt(i, prompt, executor, server, mods):
    execution, folder_paths, loop = mods
    run = {"ok": False, "error": None, "node_errors": {}, "outputs": {}, "files": [], "tensors": [],
           "nodes": {k: {"class_type": v.get("class_type"), "status": "not_run"} for k, v in prompt.items()}}
    prompt_id = f"harness-{i}"
    t = time.perf_counter()
    valid = loop.run_until_complete(execution.validate_prompt(prompt_id, prompt, None))
    run["validate_s"] = round(time.perf_counter() - t, 3)
    if not valid[0]:
        run["error"] = dict(valid[1] or {}, stage="validate")
        run["node_errors"] = valid[3]
        return run
    server.events = []
    t = time.perf_counter()
    executor.execute(prompt, prompt_id, {"client_id": "ferry-harness"}, valid[2])
    end = time.perf_counter()
    run["execute_s"] = round(end - t, 3)
    current = None   # the node running, and since when: a node runs until the next starts
    for event, data, at in server.events + [("executing", {"node": None}, end)]:
        if event == "executing":
            if current is not None:
                run["nodes"][current[0]]["s"] = round(at - current[1], 3)
            current = None
            if data.get("node") is not None:
                node = run["nodes"].setdefault(data["node"], {"class_type": None})
                node["status"] = "executed"
                current = (data["node"], at)
        elif event == "execution_cached":
            for n in data.get("nodes", []):
                if n in run["nodes"]:
                    run["nodes"][n]["status"] = "cached"
    for event, data in executor.status_messages:
        if event in ("execution_error", "execution_interrupted"):
            run["error"] = {"stage": "execute", "event": event, "node_id": data.get("node_id"),
                            "node_type": data.get("node_type"), "message": data.get("exception_message"),
                            "exception_type": data.get("exception_type"), "traceback": data.get("traceback")}
            if data.get("node_id") in run["nodes"]:
                run["nodes"][data["node_id"]]["status"] = "failed"
    outputs = getattr(executor, "history_result", {}).get("outputs", {})
    run["outputs"] = outputs
    run["files"] = _collect_files(outputs, folder_paths)
    for node_id, ui in outputs.items():
        for rec in (ui or {}).get("ferry_tensors", []):
            run["tensors"].append(dict(rec, node_id=node_id))
    run["digest"] = _digest(run["files"], run["tensors"])
    run["loaded_models"] = _loaded_models()
    run["ok"] = bool(executor.success) and run["error"] is None
    return run


def _main_run(opts):
    t0 = time.perf_counter()
    capture = _Capture()
    result = {"ok": False, "stage": "startup", "error": None, "runs": [], "log": capture.records,
              "python": sys.executable}
    code = 2
    try:
        opts.overrides_dict = {}
        if opts.overrides:
            with open(opts.overrides) as f:
                opts.overrides_dict = json.load(f)
        prompts = []
        for p in opts.prompt:
            with open(p) as f:
                prompts.append(json.load(f))
        executor, server, mods = _startup(opts, result, capture)
        result["startup_s"] = round(time.perf_counter() - t0, 3)
        for i, prompt in enumerate(prompts):
            result["stage"] = "execute"
            r = _run_prompt(i, prompt, executor, server, mods)
            result["runs"].append(r)
            if not r["ok"]:
                result["stage"] = (r.get("error") or {}).get("stage", "execute")
                break
        else:
            result["stage"] = "done"
            result["ok"] = True
        code = 0 if result["ok"] else 1
    except BaseException as e:  # the result file must say what happened
        result["error"] = {"stage": result["stage"], "message": f"{type(e).__name__}: {e}",
                           "traceback": traceback.format_exc()}
        code = 2
    finally:
        result["total_s"] = round(time.perf_counter() - t0, 3)
        tmp = opts.out + ".tmp"
        with open(tmp, "w") as f:
            json.dump(result, f, indent=1, default=str)
        os.replace(tmp, opts.out)
    return code


def main(argv=None):
    ap = argparse.ArgumentParser(description="Run ComfyUI headless on API-format prompts.")
    sub = ap.add_subparsers(dest="cmd", required=True)
    r = sub.add_parser("run", help="run prompts in this process and write the result as JSON")
    r.add_argument("--prompt", action="append", required=True, help="API-format prompt JSON (repeatable)")
    r.add_argument("--models", required=True, help="models directory (ComfyUI's models/ layout)")
    r.add_argument("--out", required=True, help="where the result JSON goes")
    r.add_argument("--custom-node", action="append", default=[], help="a node pack to link into custom_nodes/")
    r.add_argument("--overrides", help="JSON: text_encoder_configs, supported_models")
    r.add_argument("--comfyui", help="ComfyUI's directory ($COMFYUI_DIR or ../shared/comfyui by default)")
    r.add_argument("--base", help="ComfyUI's --base-directory (a new temporary folder by default)")
    r.add_argument("--no-cpu", action="store_true", help="do not pass --cpu")
    r.add_argument("comfy_args", nargs="*", help="after --: more ComfyUI flags")
    f = sub.add_parser("find", help="print ComfyUI's directory (exit 77 with the reason when there is none)")
    f.add_argument("--comfyui")
    opts = ap.parse_args(argv)
    sys.dont_write_bytecode = True   # ComfyUI's tree may be read-only or shared
    if opts.cmd == "find":
        d, why = (opts.comfyui, None) if opts.comfyui else find_comfyui()
        if d is None:
            print(why)
            return 77
        print(os.path.abspath(d))
        return 0
    if opts.comfyui is None:
        opts.comfyui, why = find_comfyui()
        if opts.comfyui is None:
            print(f"harness: {why}", file=sys.stderr)
            return 77
    opts.comfyui = os.path.abspath(opts.comfyui)
    if opts.base is None:
        opts.base = tempfile.mkdtemp(prefix="comfy-base-")
    os.makedirs(os.path.dirname(os.path.abspath(opts.out)) or ".", exist_ok=True)
    code = _main_run(opts)
    # ComfyUI leaves threads behind; a prompt result is all this process owes
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


if __name__ == "__main__":
    sys.exit(main())
