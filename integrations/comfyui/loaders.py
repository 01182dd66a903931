# SPDX-License-Identifier: MIT
"""loaders - ComfyUI's loader nodes, with their files read by ferry.

Each node has the inputs and outputs of the ComfyUI node it stands for (it
subclasses it), so a workflow swaps one for the other. The file is read by
ferry into a state dict of zero-copy views of the file, and handed to
ComfyUI's own builder for state dicts (comfy.sd.load_diffusion_model_state_dict,
load_text_encoder_state_dicts, VAE(sd=...), load_state_dict_guess_config),
with keep_views keeping the views as the model's weights where ComfyUI would
have copied them unchanged; GGUF block-quantized diffusion models are built
with gguf_ops (dequantized as each layer runs). Whatever ferry cannot serve
(ferry missing, a file it cannot read, block-quantized text encoders, any
exception on its path) is loaded by ComfyUI's own loader, with one log line
naming the file and why."""
import gc
import json
import logging
import os
import time
import traceback

import torch

import comfy.model_management
import comfy.sd
import comfy.utils
import folder_paths
import nodes
from comfy.cli_args import args

from . import gguf_ops, keep_views, memstats, residency, settings

CATEGORY = "loaders/ferry"

_reading = None
_import_error = None


def _ferry_reading():
    """The reading module (which imports ferry), or None when ferry is not
    importable; the error is kept for the log."""
    global _reading, _import_error
    if _reading is None and _import_error is None:
        try:
            from . import reading
            _reading = reading
        except Exception as e:  # ImportError, or OSError from a library that will not load
            _import_error = f"{type(e).__name__}: {e}"
    return _reading


def ferry_status():
    """(ferry module or None, a word on it for the start-up log)."""
    r = _ferry_reading()
    if r is None:
        return None, f"ferry is not importable ({_import_error}): every ferry node loads with ComfyUI's loader"
    return r.ferry, f"ferry {r.ferry.__version__} ({r.ferry.library_path})"


def _why_not():
    """Why ferry's path is off for every file, or None."""
    if settings.disabled:
        return f"{settings.DISABLE_ENV} is set"
    if getattr(args, "disable_mmap", False):
        return "--disable-mmap asks for copies rather than mappings"
    if _ferry_reading() is None:
        return f"ferry is not importable ({_import_error})"
    return None


class _Fallback(Exception):
    pass


def _run(node, paths, via_ferry, via_comfyui):
    """via_ferry() -> (result, info, keep stats); on any failure (not an
    interruption: ComfyUI's is a BaseException) via_comfyui() runs instead."""
    t0 = time.perf_counter()
    reason = _why_not()
    if reason is None:
        try:
            out, info, kept = via_ferry()
        except Exception as e:
            r = _reading
            if r is not None and isinstance(e, (r.Fallback, _Fallback)):
                reason = str(e)
            else:
                reason = f"{type(e).__name__}: {e}"
                logging.debug("ferry: %s", traceback.format_exc())
        else:
            seconds = time.perf_counter() - t0
            _log_ferry(node, paths, info, kept, seconds)
            memstats.tracker.note_load({"node": node, "files": info["files"], "via": "ferry",
                                        "seconds": round(seconds, 4), "format": info["format"],
                                        "tensors": info["tensors"], "bytes": info["bytes"], **kept})
            return out
        gc.collect()  # what the failed path built, before the second load
    logging.warning("ferry: %s: %s; loading with ComfyUI's loader", ", ".join(paths), reason)
    event = {"node": node, "files": list(paths), "via": "comfyui", "reason": reason}
    try:
        return via_comfyui()
    except Exception as e:
        event["error"] = f"{type(e).__name__}: {e}"
        raise
    finally:
        event["seconds"] = round(time.perf_counter() - t0, 4)
        memstats.tracker.note_load(event)


def _log_ferry(node, paths, info, kept, seconds):
    b = memstats.fmt_bytes
    msg = (f"ferry: {', '.join(paths)}: {info['tensors']} tensors, {b(info['bytes'])} as views of the file"
           f" ({info['format']}); {node} built in {seconds:.2f} s, its weights: {kept['kept_tensors']}"
           f" views of the file ({b(kept['kept_bytes'])}), {kept['copied_tensors']} copies"
           f" ({b(kept['copied_bytes'])}: ComfyUI's dtype, device or layout)")
    if kept.get("own_loading_tensors"):
        msg += f", {kept['own_loading_tensors']} loaded by layers with their own loading code"
    if kept.get("dequantized_at_use"):
        msg += (f", {kept['dequantized_at_use']} block-quantized ({', '.join(kept['qtypes'])}) dequantized as"
                " their layers run")
    logging.info(msg)


def _read_all(paths, quantized_ok=False):
    """[(sd, metadata, info)] for paths, through ferry; block-quantized GGUF
    only where quantized_ok (diffusion models: gguf_ops)."""
    out = [_reading.read(p) for p in paths]
    for p, (_, _, info) in zip(paths, out):
        if info["quantized"] and not quantized_ok:
            raise _Fallback(f"its GGUF tensors are block-quantized ({', '.join(info['qtypes'])}): the pack "
                            "dequantizes those in diffusion models only")
    return out


def _merge_info(infos):
    by_ptr = {}
    for i in infos:
        by_ptr.update(i["by_ptr"])
    return {"format": "+".join(sorted({i["format"] for i in infos})),
            "tensors": sum(i["tensors"] for i in infos), "bytes": sum(i["bytes"] for i in infos),
            "files": [f for i in infos for f in i["files"]], "paths": [i["path"] for i in infos],
            "by_ptr": by_ptr, "names_overlap": _names_overlap(infos)}


def _names_overlap(infos):
    seen = set()
    for i in infos:
        names = {v[0] for v in i["by_ptr"].values()}
        if names & seen:
            return True
        seen |= names
    return False


def _hold(patcher, module_attr, info, stream, label, kept):
    """Hand patcher's model to ferry's store (residency.prepare), or leave it
    to ComfyUI's residency with the reason in the log and the stats."""
    if patcher is None or not residency.wanted(patcher.load_device):
        return
    reason = None
    if info.get("names_overlap"):
        reason = "its files share tensor names, which one store model cannot tell apart"
    else:
        try:
            held = residency.prepare(patcher, module_attr, info["by_ptr"], info.get("paths") or [info["path"]],
                                     stream, label)
        except residency.Unsupported as e:
            reason = str(e)
        except Exception as e:
            reason = f"{type(e).__name__}: {e}"
            logging.debug("ferry: %s", traceback.format_exc())
        else:
            kept["held_bytes"] = kept.get("held_bytes", 0) + held.bytes
            return
    logging.info("ferry: %s: ComfyUI moves its weights (%s)", label, reason)
    kept.setdefault("residency", []).append({"model": label, "via": "comfyui", "reason": reason})


def _label(paths, kind):
    return f"{kind}:{os.path.basename(paths[0])}"


def _cast_at_use():
    """Whether the models built now keep the file's tensors in the file's
    dtype where ComfyUI wants another, casting them as each layer runs: where
    ferry's store holds them on a GPU, in place of ComfyUI's dynamic VRAM,
    which does the same (its builders assign the file's tensors). On the CPU
    ComfyUI converts them at load, and so does the pack."""
    if not residency.wanted():
        return False
    try:
        return comfy.model_management.get_torch_device().type == "cuda"
    except Exception:
        return False


def _dynamic_off(disable_dynamic):
    """disable_dynamic for ComfyUI's builders: on where ferry's store will
    hold the model (ComfyUI's dynamic VRAM would move it instead)."""
    return disable_dynamic or residency.wanted()


def _sources(sds):
    return [t for sd in sds for t in sd.values() if isinstance(t, torch.Tensor)]


# --- ComfyUI's own reading, for the fallback -------------------------------------

# files ferry reads that ComfyUI's readers and folder lists do not know
_EXTRA_SUFFIXES = (".safetensors.index.json", ".gguf")


def _only_ferry_reads(path):
    return path.lower().endswith(_EXTRA_SUFFIXES)


def _comfy_read(path):
    """(state dict, metadata) as ComfyUI reads the file, for the formats its
    builders are fed from a state dict below. A sharded safetensors index is
    read shard by shard with ComfyUI's reader; GGUF is not ComfyUI's."""
    if path.lower().endswith(".safetensors.index.json"):
        with open(path) as f:
            index = json.load(f)
        sd, metadata = {}, {}
        base = os.path.dirname(path)
        for shard in sorted(set(index.get("weight_map", {}).values())):
            part, md = comfy.utils.load_torch_file(os.path.join(base, shard), return_metadata=True)
            sd.update(part)
            metadata.update(md or {})
        return sd, metadata or None
    if path.lower().endswith(".gguf"):
        raise RuntimeError(f"{path}: ComfyUI's core does not read GGUF files (the ComfyUI-GGUF pack does)")
    return comfy.utils.load_torch_file(path, return_metadata=True)


_extra_cache = {}


def _extra_files(folder):
    """The files of folder that only ferry reads (GGUF, sharded safetensors
    indexes), relative to its directories, as ComfyUI names files; listed
    again only when a directory's mtime changed, as ComfyUI's lists are."""
    dirs_now = tuple(folder_paths.get_folder_paths(folder))
    hit = _extra_cache.get(folder)
    if hit is not None and hit[0] == dirs_now and all(_mtime(d) == m for d, m in hit[2].items()):
        return hit[1]
    files, mtimes = [], {}
    for d in dirs_now:
        found, dirs = folder_paths.recursive_search(d, excluded_dir_names=[".git"])
        files.extend(f for f in found if f.lower().endswith(_EXTRA_SUFFIXES))
        mtimes.update(dirs)
    files = sorted(set(files))
    _extra_cache[folder] = (dirs_now, files, mtimes)
    return files


def _mtime(d):
    try:
        return os.path.getmtime(d)
    except OSError:
        return None


def _add_files(spec, key, folder):
    """spec (an INPUT_TYPES dict) with the ferry-only files of folder added to
    the choices of input key."""
    req = spec["required"]
    choices, *rest = req[key]
    req[key] = (list(choices) + [n for n in _extra_files(folder) if n not in choices], *rest)
    return spec


# --- diffusion models --------------------------------------------------------------

def _unet_options(weight_dtype):
    """UNETLoader's weight_dtype choice as ComfyUI's model options."""
    opts = {}
    if weight_dtype in ("fp8_e4m3fn", "fp8_e4m3fn_fast"):
        opts["dtype"] = torch.float8_e4m3fn
        if weight_dtype == "fp8_e4m3fn_fast":
            opts["fp8_optimizations"] = True
    elif weight_dtype == "fp8_e5m2":
        opts["dtype"] = torch.float8_e5m2
    return opts


def load_diffusion_model(path, model_options={}, disable_dynamic=False):
    """comfy.sd.load_diffusion_model through ferry (also the reload factory
    ComfyUI calls for multi-GPU and non-dynamic clones)."""
    def via_ferry():
        ((sd, metadata, info),) = _read_all([path], quantized_ok=True)
        quantized = dict(info["quantized"])
        opts = model_options
        if quantized:
            if model_options.get("custom_operations") is not None:
                raise _Fallback("block-quantized GGUF with another pack's operations")
            opts = dict(model_options, custom_operations=gguf_ops.Ops)
        with keep_views.KeepViews(_sources([sd]), cast_at_use=_cast_at_use() and not quantized) as kv, \
                gguf_ops.pending(quantized):
            model = comfy.sd.load_diffusion_model_state_dict(sd, model_options=opts, metadata=metadata,
                                                             disable_dynamic=_dynamic_off(disable_dynamic) or
                                                             bool(quantized))
        if model is None:
            raise _Fallback("ComfyUI did not recognise the model")
        if quantized:
            raise _Fallback(f"{len(quantized)} block-quantized tensors are in layers the pack's GGUF operations "
                            "do not dequantize (only Linear weights)")
        model.cached_patcher_init = (load_diffusion_model, (path, model_options))
        kept = kv.stats()
        if info["quantized"]:
            kept["dequantized_at_use"] = len(info["quantized"])
            kept["qtypes"] = info["qtypes"]
        _hold(model, "diffusion_model", dict(info, paths=[path]), True, _label([path], "model"), kept)
        return model, info, kept

    def via_comfyui():
        if not _only_ferry_reads(path):
            return comfy.sd.load_diffusion_model(path, model_options=model_options, disable_dynamic=disable_dynamic)
        sd, metadata = _comfy_read(path)
        model = comfy.sd.load_diffusion_model_state_dict(sd, model_options=model_options, metadata=metadata,
                                                         disable_dynamic=disable_dynamic)
        if model is None:
            raise RuntimeError(f"ERROR: Could not detect model type of: {path}")
        return model

    return _run("UNETLoader", [path], via_ferry, via_comfyui)


class FerryUNETLoader(nodes.UNETLoader):
    CATEGORY = CATEGORY
    DESCRIPTION = ("Load Diffusion Model, with the file read by ferry as zero-copy views "
                   "(safetensors, sharded .safetensors.index.json, GGUF, .pt/.ckpt).")

    @classmethod
    def INPUT_TYPES(cls):
        return _add_files(super().INPUT_TYPES(), "unet_name", "diffusion_models")

    def load_unet(self, unet_name, weight_dtype):
        path = folder_paths.get_full_path_or_raise("diffusion_models", unet_name)
        return (load_diffusion_model(path, model_options=_unet_options(weight_dtype)),)


# --- text encoders -----------------------------------------------------------------

def load_clip(paths, embedding_directory=None, clip_type=comfy.sd.CLIPType.STABLE_DIFFUSION, model_options={},
              disable_dynamic=False, node="CLIPLoader"):
    """comfy.sd.load_clip through ferry. node: the stock loader the
    calling node stands for, as the log and the stats name the load."""
    def via_ferry():
        read = _read_all(paths)
        sds = []
        for sd, metadata, _ in read:
            if model_options.get("custom_operations", None) is None:
                sd, metadata = comfy.utils.convert_old_quants(sd, model_prefix="", metadata=metadata)
            sds.append(sd)
        with keep_views.KeepViews(_sources(sds), cast_at_use=_cast_at_use()) as kv:
            clip = comfy.sd.load_text_encoder_state_dicts(sds, embedding_directory=embedding_directory,
                                                          clip_type=clip_type, model_options=model_options,
                                                          disable_dynamic=_dynamic_off(disable_dynamic))
        clip.patcher.cached_patcher_init = (clip_patcher, (paths, embedding_directory, clip_type, model_options,
                                                           node))
        info = _merge_info([i for _, _, i in read])
        kept = kv.stats()
        _hold(clip.patcher, "", info, True, _label(paths, "text encoder"), kept)
        return clip, info, kept

    def via_comfyui():
        if not any(_only_ferry_reads(p) for p in paths):
            return comfy.sd.load_clip(ckpt_paths=paths, embedding_directory=embedding_directory, clip_type=clip_type,
                                      model_options=model_options, disable_dynamic=disable_dynamic)
        sds = []
        for p in paths:
            sd, metadata = _comfy_read(p)
            if model_options.get("custom_operations", None) is None:
                sd, metadata = comfy.utils.convert_old_quants(sd, model_prefix="", metadata=metadata)
            sds.append(sd)
        return comfy.sd.load_text_encoder_state_dicts(sds, embedding_directory=embedding_directory, clip_type=clip_type,
                                                      model_options=model_options, disable_dynamic=disable_dynamic)

    return _run(node, list(paths), via_ferry, via_comfyui)


def clip_patcher(paths, embedding_directory=None, clip_type=comfy.sd.CLIPType.STABLE_DIFFUSION, model_options={},
                 node="CLIPLoader", disable_dynamic=False):
    return load_clip(paths, embedding_directory, clip_type, model_options, disable_dynamic, node=node).patcher


def _clip_options(device):
    if device == "cpu":
        return {"load_device": torch.device("cpu"), "offload_device": torch.device("cpu")}
    return {}


def _clip_type(name):
    return getattr(comfy.sd.CLIPType, name.upper(), comfy.sd.CLIPType.STABLE_DIFFUSION)


class FerryCLIPLoader(nodes.CLIPLoader):
    CATEGORY = CATEGORY

    @classmethod
    def INPUT_TYPES(cls):
        return _add_files(super().INPUT_TYPES(), "clip_name", "text_encoders")

    def load_clip(self, clip_name, type="stable_diffusion", device="default"):
        path = folder_paths.get_full_path_or_raise("text_encoders", clip_name)
        return (load_clip([path], folder_paths.get_folder_paths("embeddings"), _clip_type(type), _clip_options(device)),)


class FerryDualCLIPLoader(nodes.DualCLIPLoader):
    CATEGORY = CATEGORY

    @classmethod
    def INPUT_TYPES(cls):
        spec = _add_files(super().INPUT_TYPES(), "clip_name1", "text_encoders")
        return _add_files(spec, "clip_name2", "text_encoders")

    def load_clip(self, clip_name1, clip_name2, type, device="default"):
        paths = [folder_paths.get_full_path_or_raise("text_encoders", n) for n in (clip_name1, clip_name2)]
        return (load_clip(paths, folder_paths.get_folder_paths("embeddings"), _clip_type(type), _clip_options(device),
                          node="DualCLIPLoader"),)


# --- VAEs --------------------------------------------------------------------------

def load_vae(path, metadata=None, device=None, disable_dynamic=False):
    """A VAE from a file of the vae folder, as VAELoader builds it, through ferry."""
    def via_ferry():
        ((sd, md, info),) = _read_all([path])
        with keep_views.KeepViews(_sources([sd])) as kv:
            vae = comfy.sd.VAE(sd=sd, metadata=md, device=device)
        vae.throw_exception_if_invalid()
        vae.patcher.cached_patcher_init = (vae_patcher, (path, md, device))
        return vae, info, kv.stats()

    def via_comfyui():
        sd, md = _comfy_read(path)
        vae = comfy.sd.VAE(sd=sd, metadata=md, device=device)
        vae.throw_exception_if_invalid()
        if not _only_ferry_reads(path):
            vae.patcher.cached_patcher_init = (comfy.sd.load_vae_patcher, (path, md, device))
        return vae

    return _run("VAELoader", [path], via_ferry, via_comfyui)


def vae_patcher(path, metadata=None, device=None, disable_dynamic=False):
    return load_vae(path, metadata, device, disable_dynamic).patcher


class FerryVAELoader(nodes.VAELoader):
    CATEGORY = CATEGORY

    @classmethod
    def INPUT_TYPES(cls):
        return _add_files(super().INPUT_TYPES(), "vae_name", "vae")

    def load_vae(self, vae_name):
        # the approximate VAEs (TAESD, ...) and pixel_space are assembled from
        # several small files or none, by VAELoader itself
        special = (vae_name == "pixel_space" or vae_name in self.image_taes
                   or os.path.splitext(vae_name)[0] in self.video_taes)
        if special:
            return super().load_vae(vae_name)
        path = folder_paths.get_full_path_or_raise("vae", vae_name)
        return (load_vae(path),)


# --- whole checkpoints -------------------------------------------------------------

def load_checkpoint(path, output_vae=True, output_clip=True, output_clipvision=False, embedding_directory=None,
                    output_model=True, model_options={}, te_model_options={}, disable_dynamic=False):
    """comfy.sd.load_checkpoint_guess_config through ferry."""
    def via_ferry():
        ((sd, metadata, info),) = _read_all([path])
        with keep_views.KeepViews(_sources([sd]), cast_at_use=_cast_at_use()) as kv:
            out = comfy.sd.load_state_dict_guess_config(
                sd, output_vae, output_clip, output_clipvision, embedding_directory, output_model, model_options,
                te_model_options=te_model_options, metadata=metadata, disable_dynamic=_dynamic_off(disable_dynamic))
        if out is None:
            raise _Fallback("ComfyUI did not recognise the model")
        kept = kv.stats()
        one = dict(info, paths=[path])
        _hold(out[0], "diffusion_model", one, True, _label([path], "model"), kept)
        if out[1] is not None:
            _hold(getattr(out[1], "patcher", None), "", one, False, _label([path], "text encoder"), kept)
        rest = (embedding_directory, model_options, te_model_options)
        if out[0] is not None:
            out[0].cached_patcher_init = (load_checkpoint, (path, False, False, False, embedding_directory,
                                                            output_model, model_options, te_model_options), 0)
        if out[1] is not None and getattr(out[1], "patcher", None) is not None:
            out[1].patcher.cached_patcher_init = (checkpoint_clip_patcher, (path, *rest))
        if out[2] is not None and getattr(out[2], "patcher", None) is not None:
            out[2].patcher.cached_patcher_init = (checkpoint_vae_patcher, (path, *rest))
        return out, info, kept

    def via_comfyui():
        if not _only_ferry_reads(path):
            return comfy.sd.load_checkpoint_guess_config(
                path, output_vae, output_clip, output_clipvision, embedding_directory, output_model, model_options,
                te_model_options=te_model_options, disable_dynamic=disable_dynamic)
        sd, metadata = _comfy_read(path)
        out = comfy.sd.load_state_dict_guess_config(
            sd, output_vae, output_clip, output_clipvision, embedding_directory, output_model, model_options,
            te_model_options=te_model_options, metadata=metadata, disable_dynamic=disable_dynamic)
        if out is None:
            raise RuntimeError(f"ERROR: Could not detect model type of: {path}")
        return out

    return _run("CheckpointLoaderSimple", [path], via_ferry, via_comfyui)


def checkpoint_clip_patcher(path, embedding_directory=None, model_options={}, te_model_options={},
                            disable_dynamic=False):
    out = load_checkpoint(path, False, True, False, embedding_directory, False, model_options, te_model_options,
                          disable_dynamic)
    return out[1].patcher


def checkpoint_vae_patcher(path, embedding_directory=None, model_options={}, te_model_options={},
                           disable_dynamic=False):
    out = load_checkpoint(path, True, False, False, embedding_directory, False, model_options, te_model_options,
                          disable_dynamic)
    return out[2].patcher


class FerryCheckpointLoaderSimple(nodes.CheckpointLoaderSimple):
    CATEGORY = CATEGORY

    @classmethod
    def INPUT_TYPES(cls):
        return _add_files(super().INPUT_TYPES(), "ckpt_name", "checkpoints")

    def load_checkpoint(self, ckpt_name):
        path = folder_paths.get_full_path_or_raise("checkpoints", ckpt_name)
        out = load_checkpoint(path, output_vae=True, output_clip=True,
                              embedding_directory=folder_paths.get_folder_paths("embeddings"))
        return out[:3]


NODE_CLASS_MAPPINGS = {
    "FerryUNETLoader": FerryUNETLoader,
    "FerryCLIPLoader": FerryCLIPLoader,
    "FerryDualCLIPLoader": FerryDualCLIPLoader,
    "FerryVAELoader": FerryVAELoader,
    "FerryCheckpointLoaderSimple": FerryCheckpointLoaderSimple,
}

NODE_DISPLAY_NAME_MAPPINGS = {
    "FerryUNETLoader": "Load Diffusion Model (ferry)",
    "FerryCLIPLoader": "Load CLIP (ferry)",
    "FerryDualCLIPLoader": "Load CLIP (Dual) (ferry)",
    "FerryVAELoader": "Load VAE (ferry)",
    "FerryCheckpointLoaderSimple": "Load Checkpoint (ferry)",
}
