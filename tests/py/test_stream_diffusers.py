# SPDX-License-Identifier: Apache-2.0
"""Tiny diffusers models streamed through a ferry.torch.Store on ferry's
simulated GPU: FluxTransformer2DModel, WanTransformer3DModel (whose rotary
tables are non-persistent buffers, outside the checkpoint) and
UNet2DConditionModel, each with seeded random weights saved to a safetensors
file. Three Euler-like steps (each feeds the previous output back in) of the
model built on meta the way diffusers builds it and attached with
stream="auto" under a device budget of 40 % of its weights give outputs
bit-identical to the resident model's; so does the Wan model attached whole
(stream=None).

Needs torch >= 2.1 and a diffusers with these three classes: ctest runs it
with scripts/deps.sh's second environment (.deps/venv-torch2,
tests/py/run_stream_diffusers.sh), and it skips itself elsewhere."""
import contextlib

import pytest

torch = pytest.importorskip("torch")
if tuple(int(x) for x in torch.__version__.split("+")[0].split(".")[:2]) < (2, 1):
    pytest.skip(f"torch {torch.__version__}: these diffusers models need torch 2.1 or later",
                allow_module_level=True)
diffusers = pytest.importorskip("diffusers")
safetensors_torch = pytest.importorskip("safetensors.torch")
try:
    from diffusers import FluxTransformer2DModel, UNet2DConditionModel, WanTransformer3DModel
except ImportError as e:
    pytest.skip(f"diffusers {diffusers.__version__} lacks a model class: {e}", allow_module_level=True)

import ferry.torch as ft  # noqa: E402

SIM = "sim:256MiB"
BUDGET = 0.40  # of the model's weight bytes, for the streamed runs
STEPS = 3

# (class, config): small dims, the blocks holding most of the bytes
MODELS = {
    "flux": (FluxTransformer2DModel, dict(
        patch_size=1, in_channels=16, num_layers=3, num_single_layers=6, attention_head_dim=16,
        num_attention_heads=2, joint_attention_dim=32, pooled_projection_dim=16, axes_dims_rope=(4, 6, 6))),
    "wan": (WanTransformer3DModel, dict(
        patch_size=(1, 2, 2), num_attention_heads=2, attention_head_dim=12, in_channels=4, out_channels=4,
        text_dim=16, freq_dim=16, ffn_dim=48, num_layers=4, rope_max_seq_len=32)),
    "unet": (UNet2DConditionModel, dict(
        sample_size=8, in_channels=4, out_channels=4, layers_per_block=2, block_out_channels=(16, 32),
        down_block_types=("CrossAttnDownBlock2D", "DownBlock2D"), up_block_types=("UpBlock2D", "CrossAttnUpBlock2D"),
        cross_attention_dim=16, attention_head_dim=4, norm_num_groups=8)),
}


def _randn(gen, *shape):
    return torch.randn(*shape, generator=gen)


def inputs(name):
    """(latent, conditioning kwargs) for one model, the same every call."""
    g = torch.Generator().manual_seed(7)
    if name == "flux":
        seq, txt = 16, 4
        img_ids = torch.stack(torch.meshgrid(torch.zeros(1), torch.arange(4.0), torch.arange(4.0), indexing="ij"),
                              dim=-1).reshape(seq, 3)
        return _randn(g, 1, seq, 16), dict(encoder_hidden_states=_randn(g, 1, txt, 32),
                                           pooled_projections=_randn(g, 1, 16), img_ids=img_ids,
                                           txt_ids=torch.zeros(txt, 3))
    if name == "wan":
        return _randn(g, 1, 4, 2, 4, 4), dict(encoder_hidden_states=_randn(g, 1, 4, 16))
    return _randn(g, 1, 4, 8, 8), dict(encoder_hidden_states=_randn(g, 1, 4, 16))


def timestep(name, k):
    t = 1.0 - k / STEPS
    if name == "flux":
        return torch.tensor([t])  # (Flux scales its timestep by 1000 itself)
    return torch.tensor([int(999 * t)])


def run_steps(name, model):
    """STEPS Euler-like steps from the fixed latent: each output moves the
    latent, which is the next step's input. Returns every step's output."""
    x, cond = inputs(name)
    outs = []
    with torch.inference_mode():
        for k in range(STEPS):
            out = model(x, timestep=timestep(name, k), return_dict=False, **cond)[0]
            outs.append(out)
            x = x - out / STEPS
    return outs


@contextlib.contextmanager
def params_on_meta():
    """Parameters created inside go to the meta device, buffers stay real:
    how diffusers builds a model before loading it (accelerate's
    init_empty_weights, whose default leaves buffers alone)."""
    try:
        from accelerate import init_empty_weights
    except ImportError:
        init_empty_weights = None
    if init_empty_weights is not None:
        with init_empty_weights():
            yield
        return
    register = torch.nn.Module.register_parameter

    def on_meta(self, pname, param):
        if param is not None:
            param = torch.nn.Parameter(param.to("meta"), requires_grad=param.requires_grad)
        register(self, pname, param)

    torch.nn.Module.register_parameter = on_meta
    try:
        yield
    finally:
        torch.nn.Module.register_parameter = register


def resident_and_file(name, tmp_path):
    """The model with seeded random weights (every parameter redrawn: some
    layers start at zero), its checkpoint, its weight bytes, and its outputs."""
    cls, cfg = MODELS[name]
    torch.manual_seed(0)
    model = cls(**cfg).eval()
    g = torch.Generator().manual_seed(1)
    with torch.no_grad():
        for p in model.parameters():
            fan_in = p.shape[-1] if p.dim() > 1 else 16
            p.copy_(torch.randn(p.shape, generator=g) / fan_in ** 0.5)
    sd = {k: v.contiguous() for k, v in model.state_dict().items()}
    path = tmp_path / f"{name}.safetensors"
    safetensors_torch.save_file(sd, str(path))
    nbytes = sum(v.numel() * v.element_size() for v in sd.values())
    outs = run_steps(name, model)
    for o in outs:
        assert torch.isfinite(o).all() and o.abs().max() > 0, "a degenerate reference"
    return model, path, nbytes, outs


def built_on_meta(name):
    cls, cfg = MODELS[name]
    with params_on_meta():
        model = cls(**cfg).eval()
    assert all(p.is_meta for p in model.parameters())
    return model


@pytest.mark.parametrize("name", list(MODELS))
def test_streamed_outputs_are_bit_identical(tmp_path, sim_free, name):
    _, path, nbytes, want = resident_and_file(name, tmp_path)
    model = built_on_meta(name)
    with ft.Store(SIM, device_budget=int(BUDGET * nbytes)) as store:
        store.add("m", path, module=model, stream="auto")
        got = run_steps(name, model)
        st = store.stream_stats("m")
        assert st["steps"] == STEPS and st["streamed_blocks"] > 0, st
    for k, (a, b) in enumerate(zip(got, want)):
        assert a.device.type == "cpu" and torch.equal(a, b), f"step {k}"


def test_rotary_buffers_whole_module(tmp_path, sim_free):
    """The Wan model attached whole (stream=None) under a budget that holds
    it: its rotary tables, outside the checkpoint, move with it."""
    ref, path, nbytes, want = resident_and_file("wan", tmp_path)
    model = built_on_meta("wan")
    stored = set(ref.state_dict())
    extras = [n for n, _ in model.named_buffers() if n not in stored]
    assert extras == ["rope.freqs_cos", "rope.freqs_sin"], extras  # non-persistent: the buffer case
    with ft.Store(SIM, device_budget=2 * nbytes) as store:
        store.add("m", path, module=model)
        got = run_steps("wan", model)
        store.offload("m")
        again = run_steps("wan", model)
    for k, (a, b, c) in enumerate(zip(got, again, want)):
        assert torch.equal(a, c) and torch.equal(b, c), f"step {k}"
    for n in extras:
        assert torch.equal(model.get_buffer(n), ref.get_buffer(n)), n
