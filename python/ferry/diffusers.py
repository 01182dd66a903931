# SPDX-License-Identifier: Apache-2.0
"""ferry.diffusers - diffusers models filled through ferry.

    from diffusers import UNet2DConditionModel
    import ferry.diffusers
    unet = ferry.diffusers.from_pretrained(UNet2DConditionModel, "sd-folder", subfolder="unet",
                                           device="cuda:0", torch_dtype=torch.float16)

from_pretrained builds the model from its config.json with its parameters on
the meta device (nothing allocated, nothing initialised), then fills them with
ferry.torch.load_model: on "cpu" zero-copy copy-on-write views of the file, on
"cuda" tensors PyTorch allocates and ferry's ring fills. The result is the
module diffusers' own ModelClass.from_pretrained(folder) gives for a local
folder: same class, config, dtypes, parameters and buffers, in eval mode.

Dtypes follow diffusers: without torch_dtype the floating-point parameters
are the model's own (float32 for every diffusers model), with torch_dtype they
are that dtype, except in the class's _keep_in_fp32_modules. A parameter
whose checkpoint dtype is the one wanted is used as loaded (zero-copy on cpu);
any other is cast after loading, one copy of that tensor (an fp16 checkpoint
loaded without torch_dtype, say: pass torch_dtype=torch.float16 to keep it
zero-copy).

Only local folders: ferry reads files, it does not download. diffusers is
not imported here; the class passed in brings it.
"""
import contextlib
import glob
import os

import torch

from . import _core
from .torch._load_into import load_model
from .torch._tensors import dtype_for

__all__ = ["from_pretrained", "weights_file"]

_STEMS = ("diffusion_pytorch_model", "model")


def weights_file(folder, variant=None):
    """The checkpoint of a diffusers (or transformers) model folder, as
    from_pretrained reads it: a safetensors index, else one safetensors file,
    else the PyTorch .bin (zip) equivalents (and transformers' pytorch_model.bin,
    as `ferry inspect DIR` looks for it too); `variant` ("fp16", ...) picks
    NAME.VARIANT.safetensors and NAME.safetensors.index.VARIANT.json.
    Raises FileNotFoundError listing what it looked for."""
    names = []
    for ext in ("safetensors", "bin"):
        for stem in _STEMS + (("pytorch_model",) if ext == "bin" else ()):  # transformers' .bin name
            if variant:
                names += [f"{stem}.{ext}.index.{variant}.json", f"{stem}.{variant}.{ext}"]
            else:
                names += [f"{stem}.{ext}.index.json", f"{stem}.{ext}"]
    for n in names:
        p = os.path.join(folder, n)
        if os.path.isfile(p):
            return p
    found = sorted(os.path.basename(p) for p in glob.glob(os.path.join(folder, "*"))
                   if p.endswith((".safetensors", ".bin", ".json")))
    raise FileNotFoundError(
        f"ferry.diffusers: no checkpoint in {folder}{f' for variant {variant!r}' if variant else ''}: "
        f"looked for {', '.join(names)}; the folder holds {', '.join(found) or 'none of them'}")


@contextlib.contextmanager
def _parameters_on_meta():
    """Every nn.Parameter registered meanwhile goes to the meta device
    (buffers stay real: a model computes some of them at construction, and
    those not in the checkpoint must keep their values)."""
    register = torch.nn.Module.register_parameter

    def on_meta(self, name, param):
        register(self, name, param)
        p = self._parameters.get(name)
        if p is not None and p.device.type != "meta":
            self._parameters[name] = torch.nn.Parameter(p.to("meta"), requires_grad=p.requires_grad)

    torch.nn.Module.register_parameter = on_meta
    try:
        yield
    finally:
        torch.nn.Module.register_parameter = register


def _tensors(model):
    """(key, owning module, attribute, is parameter, tensor) for every
    parameter and buffer (non-persistent ones too), each name of a shared one."""
    out = []
    for prefix, m in model.named_modules(remove_duplicate=False):
        p = prefix + "." if prefix else ""
        out += [(p + n, m, n, True, t) for n, t in m._parameters.items() if t is not None]
        out += [(p + n, m, n, False, t) for n, t in m._buffers.items() if t is not None]
    return out


def _keep_fp32(model):
    """Names of the modules (their parameters and buffers) that stay float32."""
    keep = getattr(model, "_keep_in_fp32_modules", None) or []
    return [k for k in keep if k]


def _in_modules(key, mods):
    parts = key.split(".")
    return any(m in parts for m in mods)


def from_pretrained(model_class, folder, *, subfolder=None, device=None, torch_dtype=None,
                    variant=None, strict=True, **load_kwargs):
    """ModelClass from a local diffusers model folder (or a pipeline folder's
    `subfolder`: "unet", "transformer", "vae", ...), its weights through ferry.

    device: "cpu" (default: zero-copy views), "cuda" / "cuda:N" / N.
    torch_dtype: as diffusers' (floating-point tensors in that dtype, but for
    the class's _keep_in_fp32_modules). variant: the file variant ("fp16").
    strict: missing or unexpected keys are an error (diffusers warns and
    initialises missing ones randomly; ferry does not guess). load_kwargs go to
    ferry.torch.load_model (route, threads, progress, ...)."""
    if not hasattr(model_class, "load_config") or not hasattr(model_class, "from_config"):
        raise TypeError(f"ferry.diffusers.from_pretrained: {model_class!r} is not a diffusers model class "
                        "(it has no load_config / from_config)")
    path = os.fspath(folder)
    if subfolder:
        path = os.path.join(path, subfolder)
    if not os.path.isdir(path):
        raise FileNotFoundError(f"ferry.diffusers: {path}: not a folder (only local folders: ferry does not "
                                "download)")
    if not os.path.isfile(os.path.join(path, "config.json")):
        raise FileNotFoundError(f"ferry.diffusers: {path}: no config.json (a pipeline folder? pass "
                                "subfolder=, e.g. 'unet' or 'transformer')")
    config = model_class.load_config(path)
    ckpt = weights_file(path, variant)
    with _parameters_on_meta():
        model = model_class.from_config(config)

    # what each tensor is in the file, and what it must be in the model
    file_dt = _file_dtypes(ckpt)
    # (diffusers keeps _keep_in_fp32_modules in float32 only under float16, and
    # otherwise casts the whole model, buffers included, to torch_dtype)
    keep = _keep_fp32(model) if torch_dtype == torch.float16 else []
    want = {}
    for key, m, name, is_param, t in _tensors(model):
        if torch_dtype is not None and torch.is_floating_point(t) and not _in_modules(key, keep):
            want[key] = torch_dtype
        elif torch_dtype is not None and torch.is_floating_point(t) and key in file_dt:
            want[key] = torch.float32
        else:
            want[key] = t.dtype
    # load_model moves bytes and checks dtypes: give each tensor the file's
    # dtype first (a meta parameter costs nothing; a real buffer is converted)
    made = {}  # id(old tensor) -> its replacement: a tied tensor stays one tensor
    for key, m, name, is_param, t in _tensors(model):
        fd = file_dt.get(key)
        if fd is None or fd == t.dtype:
            continue
        if id(t) not in made:
            made[id(t)] = (torch.nn.Parameter(torch.empty(t.shape, dtype=fd, device="meta"),
                                              requires_grad=t.requires_grad) if is_param else t.to(fd))
        (m._parameters if is_param else m._buffers)[name] = made[id(t)]
    load_model(model, ckpt, strict=strict, device=device, **load_kwargs)

    target = device if device is not None else "cpu"
    if isinstance(target, int) and not isinstance(target, bool):
        target = torch.device("cuda", target)
    target = torch.device(target)
    if target.type == "cuda" and target.index is None:
        target = torch.device("cuda", torch.cuda.current_device())
    made = {}
    with torch.no_grad():
        for key, m, name, is_param, t in _tensors(model):
            if t.is_meta:  # (strict=False and not in the file)
                raise RuntimeError(f"ferry.diffusers: {key} is not in {ckpt} (strict=False leaves nothing "
                                   "to put there)")
            dt = want.get(key, t.dtype)
            if t.dtype == dt and t.device == target:
                continue
            if id(t) not in made:
                new = t.to(device=target, dtype=dt)
                made[id(t)] = torch.nn.Parameter(new, requires_grad=t.requires_grad) if is_param else new
            (m._parameters if is_param else m._buffers)[name] = made[id(t)]
    if hasattr(model, "register_to_config"):
        model.register_to_config(_name_or_path=folder)  # (as given: diffusers keeps a Path a Path)
    model.eval()
    return model


def _file_dtypes(path):
    """The checkpoint's tensor names -> torch dtypes (its header only; load_model opens it again)."""
    h = _core._Handle(path)
    try:
        return {i.name: dtype_for(i, path) for i in h.infos()}
    finally:
        h._close()
