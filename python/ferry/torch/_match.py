# SPDX-License-Identifier: Apache-2.0
"""ferry.torch._match - an nn.Module's parameters and buffers paired with a
checkpoint's tensors the way load_state_dict pairs them (tied names together,
keys, shapes and dtypes checked), and new tensors put in their place: used by
load_model and by Store.add(module=...).
"""
import collections

import torch

from .. import errors
from ._tensors import dtype_for


def module_tensors(module):
    """A list of (key, owning module, attribute, is parameter, tensor) for
    everything state_dict() would hold: parameters and persistent buffers, a
    shared submodule or tied tensor under each of its names (the entries
    load_model and Store.add(module=...) pair with a checkpoint's tensors)."""
    out = []
    for prefix, m in module.named_modules(remove_duplicate=False):
        p = prefix + "." if prefix else ""
        for name, t in m._parameters.items():
            if t is not None:
                out.append((p + name, m, name, True, t))
        skip = getattr(m, "_non_persistent_buffers_set", ())
        for name, t in m._buffers.items():
            if t is not None and name not in skip:
                out.append((p + name, m, name, False, t))
    return out


def _match_module(groups, lookup, path, verb, strict, what):
    """Pair a module's tensors with a checkpoint's the way load_state_dict does.
    groups: id(tensor) -> its entries (tied names together); lookup: name ->
    (anything, TensorInfo). Returns ([(entries, looked-up value, TensorInfo,
    dtype)], missing keys, unexpected keys); raises RuntimeError("Error(s) in
    <what>: ...") for shape or dtype mismatches, dtypes this torch lacks, and
    with strict for missing or unexpected keys. ferry moves bytes, it does not
    convert: a block-quantized tensor (dtype None) pairs with a uint8 tensor
    of its bytes (shape [nbytes]) only."""
    matched, missing, used, error_msgs = [], [], set(), []
    for es in groups.values():
        keys = [e[0] for e in es]
        present = [k for k in keys if k in lookup]
        used.update(present)
        if not present:
            missing.extend(keys)
            continue
        val, info = lookup[present[0]]
        cur = es[0][4]
        try:
            dt = dtype_for(info, path)
        except errors.UnsupportedError as e:
            error_msgs.append(f"cannot {verb} {present[0]}: {e.message}")
            continue
        if dt is None:  # block-quantized: the module holds its raw bytes, as load_file gives them
            if cur.dtype != torch.uint8 or tuple(cur.shape) != (info.nbytes,):
                error_msgs.append(f"dtype mismatch for {present[0]}: a {info.dtype} (block-quantized) tensor "
                                  f"goes to a uint8 tensor of its {info.nbytes} bytes, the current model has "
                                  f"{cur.dtype} {tuple(cur.shape)}.")
                continue
            matched.append((es, val, info, dt))
            continue
        if tuple(cur.shape) != tuple(info.shape):
            error_msgs.append(f"size mismatch for {present[0]}: copying a param with shape "
                              f"{torch.Size(info.shape)} from checkpoint, the shape in current model is "
                              f"{cur.shape}.")
            continue
        if dt != cur.dtype:
            error_msgs.append(f"dtype mismatch for {present[0]}: copying a param with dtype "
                              f"{dt if dt is not None else info.dtype} from checkpoint, the dtype in "
                              f"current model is {cur.dtype}.")
            continue
        matched.append((es, val, info, dt))
    unexpected = [k for k in lookup if k not in used]
    if strict:
        if unexpected:
            error_msgs.insert(0, "Unexpected key(s) in state_dict: {}. ".format(
                ", ".join(f'"{k}"' for k in unexpected)))
        if missing:
            error_msgs.insert(0, "Missing key(s) in state_dict: {}. ".format(
                ", ".join(f'"{k}"' for k in missing)))
    if error_msgs:
        raise RuntimeError("Error(s) in {}:\n\t{}".format(what, "\n\t".join(error_msgs)))
    return matched, missing, unexpected


def _attach_plan(module, infos, handles, strict, keys=None):
    """[(model index, TensorInfo, dtype, entries)] for the module's tensors
    that the checkpoint has; raises RuntimeError as load_state_dict does.
    keys: {module tensor name: checkpoint tensor name} pairs them instead of
    equal names (a module tensor it leaves out is missing)."""
    fname = handles[0].path if len(handles) == 1 else ", ".join(h.path for h in handles)
    lookup = {}
    for k, t in enumerate(infos):
        lookup.setdefault(t.name, (k, t))
    if keys is not None:
        unknown = [f for f in keys.values() if f not in lookup]
        if unknown:
            raise RuntimeError(f"Error(s) in attaching {type(module).__name__} to {fname}:\n\tkeys names "
                               f"{len(unknown)} tensor(s) the checkpoint lacks: "
                               + ", ".join(f'"{f}"' for f in unknown[:5]))
        lookup = {mk: lookup[f] for mk, f in keys.items()}
    groups = collections.OrderedDict()
    for e in _module_entries(module):
        groups.setdefault(id(e[4]), []).append(e)
    matched, _, _ = _match_module(groups, lookup, fname, "attach", strict,
                                  f"attaching {type(module).__name__} to {fname}")
    # keep no reference to the module's old tensors: their memory goes once replaced
    return [(idx, info, dt, [(k, mod, attr, is_param, t.requires_grad) for k, mod, attr, is_param, t in es])
            for es, idx, info, dt in matched]


def _module_extras(module, plan):
    """The module's tensors that an attach plan leaves out (non-persistent
    buffers, and parameters and buffers strict=False let stay): one list of
    (owning module, attribute, is parameter) per tensor, a tied or shared
    tensor's names together; no reference to the tensors themselves."""
    planned = {e[0] for _, _, _, entries in plan for e in entries}
    groups = collections.OrderedDict()  # id(tensor) -> (its keys, its owners)
    for prefix, m in module.named_modules(remove_duplicate=False):
        p = prefix + "." if prefix else ""
        for is_param, table in ((True, m._parameters), (False, m._buffers)):
            for name, t in table.items():
                if t is None:
                    continue
                keys, owners = groups.setdefault(id(t), ([], []))
                keys.append(p + name)
                if (m, name, is_param) not in owners:  # (a shared submodule comes once per path)
                    owners.append((m, name, is_param))
    return [owners for keys, owners in groups.values() if not any(k in planned for k in keys)]


def _assign(entries, new):
    """Put new in place of the tensor every entry names (a tied tensor's names
    all get the same new Parameter), keeping requires_grad."""
    param = None
    for key, m, name, is_param, old in entries:
        if is_param:
            if param is None:
                param = torch.nn.Parameter(new, requires_grad=old.requires_grad)
            m._parameters[name] = param
        else:
            m._buffers[name] = new


def _repoint(entries, new, keep=True):
    """Put new in place of the tensor every entry (key, module, attribute, is
    parameter, requires_grad) names: one Parameter for all the names of a tied
    tensor; with keep, the one the module holds now where torch can swap its
    contents, else a new one (new itself when it is a Parameter: a streaming
    model's views are Parameters cached per device address, which a swap
    would change under the cache)."""
    param = None
    for key, m, name, is_param, requires_grad in entries:
        if is_param:
            if param is None:
                if isinstance(new, torch.nn.Parameter):
                    param = new
                elif keep:
                    param = _same_param(m._parameters.get(name), new, requires_grad)
                else:
                    param = torch.nn.Parameter(new, requires_grad=requires_grad)
            m._parameters[name] = param
        else:
            m._buffers[name] = new


def swap_parameter_data(old, new, requires_grad=False):
    """A Parameter holding new: old itself, its contents swapped for new's
    (torch.utils.swap_tensors, torch 2.3 and later), so references the caller
    keeps to the module's parameters (an optimizer's, a patcher's) stay valid
    across moves; a new Parameter where torch cannot swap (older torch, or a
    tensor with weak references or still held by an autograd graph)."""
    fresh = torch.nn.Parameter(new, requires_grad=requires_grad)
    swap = getattr(torch.utils, "swap_tensors", None)
    if swap is not None and type(old) is type(fresh):
        try:
            swap(old, fresh)
            return old
        except RuntimeError:
            pass
    return fresh


_module_entries = module_tensors
_same_param = swap_parameter_data
