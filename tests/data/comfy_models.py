# SPDX-License-Identifier: Apache-2.0
"""comfy_models - tiny random-weight checkpoints with the key names and shape
patterns of real releases, for running ComfyUI on the CPU in tests.

Each writer lays out a file the way the released checkpoint is laid out (the
same tensor names, the same shapes up to the widths and block counts chosen
here, the same dtype), with seeded random values, so that ComfyUI picks the
model class from the file alone (its detection reads keys and shapes):

    Wan 2.1 T2V diffusion model  (Wan-AI / Comfy-Org layout, BF16)
    UMT5-XXL text encoder        (Comfy-Org umt5_xxl_fp16 layout, tokenizer inside)
    Wan 2.1 VAE                  (Wan-AI layout, BF16)
    Flux.1-dev diffusion model   (Black Forest Labs layout, BF16)
    CLIP-L, T5-XXL text encoders (Hugging Face layouts as Comfy-Org ships them, F16)
    Flux autoencoder             (ae.safetensors layout, decoder only, see below)
    SDXL checkpoint              (Stability's single-file layout: UNet, CLIP-L,
                                  OpenCLIP bigG, VAE decoder; F16)
    SDXL LoRA                    (Kohya layout: UNet and both text encoders, F16)

What the shapes cannot say, and so what a test must hand ComfyUI besides the
files (comfy_overrides() returns it, tests/comfyui/harness.py applies it):
- Text encoders are built from fixed JSON configs in ComfyUI, not from the
  weights: the tiny widths go in through the text encoders' model options
  ("<name>_model_config").
- ComfyUI tells T5-XXL from other T5s by the 24th block's feed-forward width
  (10240): the tiny T5s keep 24 blocks of that width, and are tiny through
  their model width (4). Wan's text width is not in its weights: the Wan file
  says it in its "config" metadata, which ComfyUI reads.
- SDXL is recognised only at its real widths (320 channels, 2048-wide context,
  10-deep transformers): the tiny UNet is registered as an SDXL variant.
- ComfyUI builds the SD/Flux VAE encoder at its real width (128 channels,
  34M weights) whatever the file holds; only the decoder's width is read from
  the file. The tiny VAEs hold the decoder (and the quant convolutions) only;
  VAEDecode does not need the encoder.

Standard library and numpy only; values come from numpy's PCG64 seeded per
tensor name, so a file is the same on every machine and run.

    python3 tests/data/comfy_models.py MODELS_DIR   # writes every model
"""
import json
import os
import struct
import sys
import zlib

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import stwriter  # noqa: E402

# The tiny dimensions. Widths that ComfyUI derives are noted; the rest are
# free choices, kept small.
UMT5_DIM = 4          # UMT5-XXL d_model, so also Wan's text_dim
T5_DIM = 4            # T5-XXL d_model, so also Flux's context width
T5_BLOCKS = 24        # detection needs block 23 ...
T5_FF = 10240         # ... with this feed-forward width
T5_HEADS, T5_KV = 2, 4
CLIP_L_DIM, CLIP_L_FF, CLIP_L_HEADS = 32, 64, 2
CLIP_G_DIM, CLIP_G_FF, CLIP_G_HEADS = 32, 64, 2
CLIP_LAYERS = 3       # SDXL takes the penultimate layer: more than 2
CLIP_VOCAB, CLIP_POSITIONS = 49408, 77   # ComfyUI's CLIP tokenizer's ids and length

WAN_DIM, WAN_FFN, WAN_BLOCKS = 128, 256, 2   # heads = dim / 128
WAN_VAE_DIM = 8
FLUX_DIM, FLUX_DOUBLE, FLUX_SINGLE = 128, 2, 2   # heads = dim / 128 (rope axes 16+56+56)
FLUX_MLP = 4 * FLUX_DIM
SD_VAE_CH = 32        # decoder width; GroupNorm's 32 groups make this the least
SDXL_CH, SDXL_MULT, SDXL_DEPTH = 32, (1, 2, 2), (0, 1, 1)   # one res block a level
SDXL_HEAD_CH = 64     # SDXL's attention head width

WAN_FREQ = 256        # sinusoidal time embedding width (fixed in ComfyUI)


# --- the UMT5 tokenizer: a SentencePiece unigram model of single characters ---

def _varint(n):
    if n < 0:
        n += 1 << 64
    out = bytearray()
    while True:
        b = n & 0x7F
        n >>= 7
        out.append(b | 0x80 if n else b)
        if not n:
            return bytes(out)


def _pb_bytes(num, b):
    return _varint(num << 3 | 2) + _varint(len(b)) + b


def _pb_int(num, v):
    return _varint(num << 3) + _varint(v)


def _pb_float(num, v):
    return _varint(num << 3 | 5) + struct.pack("<f", v)


SPIECE_CHARS = ("\u2581abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ"
                "0123456789.,;:!?'\"-()")


def spiece_model():
    """A serialized sentencepiece ModelProto with UMT5's special ids (pad 0,
    eos 1, unk 2, no bos) and one piece per character: what UMT5's tokenizer
    needs, in under 1 kB instead of UMT5's 4.5 MB 256k-piece model."""
    pieces = [("<pad>", 0.0, 3), ("</s>", 0.0, 3), ("<unk>", 0.0, 2)]   # CONTROL, UNKNOWN
    pieces += [(c, -1.0 - 0.01 * i, 1) for i, c in enumerate(SPIECE_CHARS)]   # NORMAL
    m = b"".join(_pb_bytes(1, _pb_bytes(1, p.encode()) + _pb_float(2, s) + _pb_int(3, t))
                 for p, s, t in pieces)
    # trainer_spec: unigram, vocab size, unk/bos/eos/pad ids
    m += _pb_bytes(2, _pb_int(3, 1) + _pb_int(4, len(pieces)) + _pb_int(40, 2) + _pb_int(41, -1)
                   + _pb_int(42, 1) + _pb_int(43, 0))
    # normalizer_spec: no character map; dummy prefix, whitespace handling as T5's
    m += _pb_bytes(3, _pb_bytes(1, b"identity") + _pb_int(3, 1) + _pb_int(4, 1) + _pb_int(5, 1))
    return m


UMT5_VOCAB = 3 + len(SPIECE_CHARS)


# --- random values ---

_EMBEDDINGS = ("token_embedding.weight", "position_embedding.weight", "positional_embedding",
               "shared.weight", "relative_attention_bias.weight")


def value_rule(name, shape):
    """How a tensor's values derive from standard normal x, by its name and
    shape: ("const", v), ("norm",) 1 + 0.02x (a norm's scale: every 1-D
    weight is one), ("bias",) 0.02x, ("embed",) 0.5x, or ("fan_in", f) x/sqrt(f)
    (matrices, so that activations stay in range)."""
    leaf = name.rsplit(".", 1)[-1]
    if leaf == "logit_scale":
        return ("const", float(np.log(100.0)))
    if leaf in ("weight", "gamma", "scale") and sum(d != 1 for d in shape) <= 1:
        return ("norm",)
    if leaf == "bias":
        return ("bias",)
    if name.endswith(_EMBEDDINGS):
        return ("embed",)
    if leaf == "text_projection":          # OpenCLIP stores it as x @ P: fan-in first
        return ("fan_in", shape[0])
    return ("fan_in", int(np.prod(shape[1:])) if len(shape) > 1 else shape[0])


def _values(name, shape, seed):
    """float32 values for one tensor (value_rule's), from a generator seeded
    by the tensor's name."""
    rng = np.random.Generator(np.random.PCG64([seed, zlib.crc32(name.encode())]))
    n = int(np.prod(shape)) if shape else 1
    rule = value_rule(name, shape)
    if rule[0] == "const":
        return np.full(n, rule[1], np.float32)
    x = rng.standard_normal(n, dtype=np.float32)
    if rule[0] == "norm":
        return 1.0 + 0.02 * x
    if rule[0] == "bias":
        return 0.02 * x
    if rule[0] == "embed":
        return 0.5 * x
    return x / np.sqrt(rule[1])


def _encode(x, dtype):
    if dtype == "F32":
        return x.astype("<f4").tobytes()
    if dtype == "F16":
        return x.astype("<f2").tobytes()
    if dtype == "BF16":   # round to nearest even on the upper 16 bits
        b = x.astype("<f4").view("<u4").astype(np.uint64)
        return ((b + 0x7FFF + ((b >> 16) & 1)) >> 16).astype("<u2").tobytes()
    raise ValueError(dtype)


def write(path, entries, dtype, seed, metadata=None, extra=()):
    """entries: [(name, shape)] given random values in `dtype`; extra:
    [(name, dtype, shape, bytes)] written as they are. Returns the path."""
    tensors = [(name, dtype, list(shape), _encode(_values(name, shape, seed), dtype))
               for name, shape in entries]
    tensors += [(n, d, list(s), b) for n, d, s, b in extra]
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    stwriter.write(path, tensors, metadata=metadata)
    return path


def _linear(prefix, n_out, n_in, bias=True):
    out = [(prefix + ".weight", (n_out, n_in))]
    if bias:
        out.append((prefix + ".bias", (n_out,)))
    return out


def _norm(prefix, n, bias=True):
    return [(prefix + ".weight", (n,))] + ([(prefix + ".bias", (n,))] if bias else [])


def _conv(prefix, n_out, n_in, *kernel):
    return [(prefix + ".weight", (n_out, n_in) + kernel), (prefix + ".bias", (n_out,))]


# --- Wan 2.1 ---

def wan21_t2v_entries(dim=WAN_DIM, ffn=WAN_FFN, blocks=WAN_BLOCKS, text_dim=UMT5_DIM,
                      in_ch=16, out_ch=16, patch=(1, 2, 2)):
    """Wan 2.1 text-to-video DiT: patch embedding, text and time MLPs, blocks of
    self-attention, cross-attention and feed-forward with per-block modulation."""
    e = _conv("patch_embedding", dim, in_ch, *patch)
    e += _linear("text_embedding.0", dim, text_dim) + _linear("text_embedding.2", dim, dim)
    e += _linear("time_embedding.0", dim, WAN_FREQ) + _linear("time_embedding.2", dim, dim)
    e += _linear("time_projection.1", 6 * dim, dim)
    for i in range(blocks):
        b = f"blocks.{i}."
        e.append((b + "modulation", (1, 6, dim)))
        for attn in ("self_attn", "cross_attn"):
            for p in "qkvo":
                e += _linear(f"{b}{attn}.{p}", dim, dim)
            e += _norm(f"{b}{attn}.norm_q", dim, bias=False) + _norm(f"{b}{attn}.norm_k", dim, bias=False)
            if attn == "self_attn":
                e += _norm(b + "norm3", dim)   # the cross-attention's input norm
        e += _linear(b + "ffn.0", ffn, dim) + _linear(b + "ffn.2", dim, ffn)
    e.append(("head.modulation", (1, 2, dim)))
    e += _linear("head.head", out_ch * patch[0] * patch[1] * patch[2], dim)
    return e


def write_wan21_t2v(path, seed=1, dtype="BF16"):
    # ComfyUI reads the widths from the shapes, except the text width (fixed
    # at UMT5-XXL's 4096 unless the file's "config" metadata says otherwise).
    # dtype F32: what ComfyUI computes with on the CPU, so that it keeps the
    # file's tensors as they are (BF16 ones become FP32 copies there)
    meta = {"config": json.dumps({"transformer": {"text_dim": UMT5_DIM}})}
    return write(path, wan21_t2v_entries(), dtype, seed, metadata=meta)


# GGUF block types for the quantized tiny Wan: rows of 128 take the 32-value
# types, rows of 256 (ffn.2) the 256-value K types; each block's f16 fields
# (offset, scale of the values it gives) drawn sane, the rest random bytes
_GGUF_LEGACY = ("Q8_0", "Q4_0", "Q4_1", "Q5_0", "Q5_1")
_GGUF_K = ("Q2_K", "Q3_K", "Q4_K", "Q5_K", "Q6_K")
_GGUF_F16 = {"Q8_0": ((0, 2e-4),), "Q4_0": ((0, 3e-3),), "Q4_1": ((0, 3e-3), (2, 1e-2)),
             "Q5_0": ((0, 1.5e-3),), "Q5_1": ((0, 1.5e-3), (2, 1e-2)), "Q2_K": ((80, 1e-3), (82, 1e-3)),
             "Q3_K": ((108, 2e-4),), "Q4_K": ((0, 2e-4), (2, 2e-4)), "Q5_K": ((0, 1e-4), (2, 2e-4)),
             "Q6_K": ((208, 2e-5),)}


def _gguf_blocks(qtype, n_blocks, rng):
    size = {"Q8_0": 34, "Q4_0": 18, "Q4_1": 20, "Q5_0": 22, "Q5_1": 24, "Q2_K": 84, "Q3_K": 110,
            "Q4_K": 144, "Q5_K": 176, "Q6_K": 210}[qtype]
    raw = rng.integers(0, 256, size=(n_blocks, size), dtype=np.uint8)
    for off, scale in _GGUF_F16[qtype]:
        raw[:, off:off + 2] = (rng.uniform(0.5, 1.5, n_blocks) * scale).astype("<f2").view(np.uint8).reshape(-1, 2)
    return raw.tobytes()


def write_wan21_t2v_gguf(path, ref_path, dequantize, seed=31, blocks=5):
    """A tiny Wan 2.1 T2V as a GGUF file whose blocks' Linear weights are
    block-quantized (every type of _GGUF_LEGACY and _GGUF_K, in turn) and the
    rest F32, and the same model as an F32 safetensors file at ref_path with
    the quantized weights' values: dequantize(bytes, type, shape) -> float32
    numpy array (the dequantizer under test gives them; a GGUF cross-check
    tests it against the reference implementation)."""
    import gguf_writer
    rng = np.random.default_rng(seed)
    entries = wan21_t2v_entries(blocks=blocks)
    meta = {"config": json.dumps({"transformer": {"text_dim": UMT5_DIM}})}
    legacy, k = 0, 0
    tensors, ref = [], []
    kvs = [("general.architecture", gguf_writer.STRING, "wan"), ("config", gguf_writer.STRING, meta["config"])]
    for name, shape in entries:
        quant = name.startswith("blocks.") and name.endswith(".weight") and len(shape) == 2 and \
            any(p in name for p in (".q.", ".k.", ".v.", ".o.", ".ffn."))
        if quant and shape[-1] % 256 == 0:
            qtype, k = _GGUF_K[k % len(_GGUF_K)], k + 1
        elif quant:
            qtype, legacy = _GGUF_LEGACY[legacy % len(_GGUF_LEGACY)], legacy + 1
        else:
            data = _encode(_values(name, shape, seed), "F32")
            stored = list(shape)
            if len(shape) > 4:  # GGUF holds 4 dimensions: the real shape goes in the metadata, as converters do
                stored = [int(np.prod(shape[:-3]))] + list(shape[-3:])
                kvs.append(("comfy.gguf.orig_shape." + name, gguf_writer.ARRAY, (gguf_writer.INT32, list(shape))))
            tensors.append((name, "F32", stored, data))
            ref.append((name, "F32", list(shape), data))
            continue
        n = int(np.prod(shape))
        block = 256 if qtype.endswith("_K") else 32
        data = _gguf_blocks(qtype, n // block, rng)
        tensors.append((name, qtype, list(shape), data))
        ref.append((name, "F32", list(shape), np.asarray(dequantize(data, qtype, shape), dtype="<f4").tobytes()))
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    gguf_writer.write(path, tensors, kvs=kvs)
    stwriter.write(ref_path, ref, metadata=meta)
    return sorted({t[1] for t in tensors if t[1] != "F32"})


def write_wan21_t2v_fp8_scaled(path, seed=41):
    """A tiny Wan 2.1 T2V in ComfyUI's scaled-FP8 form: the blocks' Linear
    weights F8_E4M3 (random finite values up to 1.875), each with a
    ".scale_weight" (F32 scalar), the "scaled_fp8" marker (an empty F8_E4M3
    tensor), everything else F32."""
    rng = np.random.default_rng(seed)
    plain, extra = [], []
    for name, shape in wan21_t2v_entries():
        if name.startswith("blocks.") and name.endswith(".weight") and len(shape) == 2:
            n = int(np.prod(shape))
            b = (rng.integers(0, 2, n) << 7) | (rng.integers(0, 8, n) << 3) | rng.integers(0, 8, n)
            extra.append((name, "F8_E4M3", list(shape), b.astype(np.uint8).tobytes()))
            scale = np.float32(rng.uniform(0.01, 0.03))
            extra.append((name[:-len(".weight")] + ".scale_weight", "F32", [], scale.tobytes()))
        else:
            plain.append((name, shape))
    extra.append(("scaled_fp8", "F8_E4M3", [0], b""))
    meta = {"config": json.dumps({"transformer": {"text_dim": UMT5_DIM}})}
    return write(path, plain, "F32", seed, metadata=meta, extra=extra)


def _wan_residual(prefix, n_in, n_out):
    e = [(prefix + "residual.0.gamma", (n_in, 1, 1, 1))]
    e += _conv(prefix + "residual.2", n_out, n_in, 3, 3, 3)
    e += [(prefix + "residual.3.gamma", (n_out, 1, 1, 1))]
    e += _conv(prefix + "residual.6", n_out, n_out, 3, 3, 3)
    if n_in != n_out:
        e += _conv(prefix + "shortcut", n_out, n_in, 1, 1, 1)
    return e


def _wan_middle(prefix, n):
    e = _wan_residual(prefix + "middle.0.", n, n)
    e += [(prefix + "middle.1.norm.gamma", (n, 1, 1))]
    e += _conv(prefix + "middle.1.to_qkv", 3 * n, n, 1, 1) + _conv(prefix + "middle.1.proj", n, n, 1, 1)
    return e + _wan_residual(prefix + "middle.2.", n, n)


def wan21_vae_entries(dim=WAN_VAE_DIM, z=16, mult=(1, 2, 4, 4), res_blocks=2,
                      time_down=(False, True, True)):
    """Wan 2.1 causal 3D VAE: encoder (residual blocks and 2D/3D downsamplers),
    middle with attention, the two latent 1x1x1 convolutions, and the mirrored
    decoder whose upsamplers halve the width."""
    e = _conv("encoder.conv1", dim, 3, 3, 3, 3)
    dims = [dim * m for m in (1,) + tuple(mult)]
    k = 0
    for i, (a, b) in enumerate(zip(dims[:-1], dims[1:])):
        for _ in range(res_blocks):
            e += _wan_residual(f"encoder.downsamples.{k}.", a, b)
            a = b
            k += 1
        if i != len(mult) - 1:
            e += _conv(f"encoder.downsamples.{k}.resample.1", b, b, 3, 3)
            if time_down[i]:
                e += _conv(f"encoder.downsamples.{k}.time_conv", b, b, 3, 1, 1)
            k += 1
    e += _wan_middle("encoder.", dims[-1])
    e += [("encoder.head.0.gamma", (dims[-1], 1, 1, 1))] + _conv("encoder.head.2", 2 * z, dims[-1], 3, 3, 3)
    e += _conv("conv1", 2 * z, 2 * z, 1, 1, 1) + _conv("conv2", z, z, 1, 1, 1)

    dims = [dim * m for m in (mult[-1],) + tuple(mult[::-1])]
    time_up = time_down[::-1]
    e += _conv("decoder.conv1", dims[0], z, 3, 3, 3)
    e += _wan_middle("decoder.", dims[0])
    k = 0
    for i, (a, b) in enumerate(zip(dims[:-1], dims[1:])):
        if i in (1, 2, 3):
            a //= 2   # the previous upsampler halved the width
        for _ in range(res_blocks + 1):
            e += _wan_residual(f"decoder.upsamples.{k}.", a, b)
            a = b
            k += 1
        if i != len(mult) - 1:
            e += _conv(f"decoder.upsamples.{k}.resample.1", b // 2, b, 3, 3)
            if time_up[i]:
                e += _conv(f"decoder.upsamples.{k}.time_conv", 2 * b, b, 3, 1, 1)
            k += 1
    e += [("decoder.head.0.gamma", (dims[-1], 1, 1, 1))] + _conv("decoder.head.2", 3, dims[-1], 3, 3, 3)
    return e


def write_wan21_vae(path, seed=2):
    return write(path, wan21_vae_entries(), "BF16", seed)


# --- T5 encoders ---

def t5_entries(dim, vocab, umt5, blocks=T5_BLOCKS, ff=T5_FF, heads=T5_HEADS, kv=T5_KV):
    """T5 v1.1 encoder (gated-GELU feed-forward) as Hugging Face names it. UMT5
    has a relative position bias in every block, T5 in the first only."""
    inner = heads * kv
    e = []
    for i in range(blocks):
        b = f"encoder.block.{i}.layer."
        for p in "qkv":
            e += _linear(f"{b}0.SelfAttention.{p}", inner, dim, bias=False)
        e += _linear(f"{b}0.SelfAttention.o", dim, inner, bias=False)
        if umt5 or i == 0:
            e.append((f"{b}0.SelfAttention.relative_attention_bias.weight", (32, heads)))
        e += _norm(f"{b}0.layer_norm", dim, bias=False)
        e += _linear(f"{b}1.DenseReluDense.wi_0", ff, dim, bias=False)
        e += _linear(f"{b}1.DenseReluDense.wi_1", ff, dim, bias=False)
        e += _linear(f"{b}1.DenseReluDense.wo", dim, ff, bias=False)
        e += _norm(f"{b}1.layer_norm", dim, bias=False)
    e += _norm("encoder.final_layer_norm", dim, bias=False)
    e.append(("shared.weight", (vocab, dim)))
    return e


def write_umt5_xxl(path, seed=3):
    sp = spiece_model()
    return write(path, t5_entries(UMT5_DIM, UMT5_VOCAB, umt5=True), "F16", seed,
                 extra=[("spiece_model", "U8", [len(sp)], sp)])


T5_VOCAB = 32128   # ComfyUI's T5 tokenizer (t5_tokenizer/) gives ids below this


def write_t5_xxl(path, seed=4):
    return write(path, t5_entries(T5_DIM, T5_VOCAB, umt5=False), "F16", seed)


# --- CLIP text encoders ---

def clip_hf_entries(prefix, dim, ff, layers, projection=True):
    """CLIPTextModel as Hugging Face names it (CLIP-L)."""
    p = prefix + "text_model."
    e = [(p + "embeddings.token_embedding.weight", (CLIP_VOCAB, dim)),
         (p + "embeddings.position_embedding.weight", (CLIP_POSITIONS, dim))]
    for i in range(layers):
        b = f"{p}encoder.layers.{i}."
        e += _norm(b + "layer_norm1", dim)
        for q in ("q_proj", "k_proj", "v_proj", "out_proj"):
            e += _linear(f"{b}self_attn.{q}", dim, dim)
        e += _norm(b + "layer_norm2", dim)
        e += _linear(b + "mlp.fc1", ff, dim) + _linear(b + "mlp.fc2", dim, ff)
    e += _norm(p + "final_layer_norm", dim)
    if projection:
        e += _linear(prefix + "text_projection", dim, dim, bias=False)
    return e


def clip_openclip_entries(prefix, dim, ff, layers):
    """OpenCLIP's text tower as SDXL's single file holds it (bigG): fused
    in_proj, ln_1/ln_2, c_fc/c_proj, positional_embedding, text_projection."""
    e = [(prefix + "token_embedding.weight", (CLIP_VOCAB, dim)),
         (prefix + "positional_embedding", (CLIP_POSITIONS, dim))]
    for i in range(layers):
        b = f"{prefix}transformer.resblocks.{i}."
        e += _norm(b + "ln_1", dim)
        e += [(b + "attn.in_proj_weight", (3 * dim, dim)), (b + "attn.in_proj_bias", (3 * dim,))]
        e += _linear(b + "attn.out_proj", dim, dim)
        e += _norm(b + "ln_2", dim)
        e += _linear(b + "mlp.c_fc", ff, dim) + _linear(b + "mlp.c_proj", dim, ff)
    e += _norm(prefix + "ln_final", dim)
    e += [(prefix + "text_projection", (dim, dim)), (prefix + "logit_scale", ())]
    return e


def write_clip_l(path, seed=5):
    return write(path, clip_hf_entries("", CLIP_L_DIM, CLIP_L_FF, CLIP_LAYERS), "F16", seed)


# --- Flux.1-dev ---

def flux_entries(dim=FLUX_DIM, mlp=FLUX_MLP, double=FLUX_DOUBLE, single=FLUX_SINGLE,
                 ctx=T5_DIM, vec=CLIP_L_DIM, in_ch=16, patch=2, guidance=True):
    """Flux DiT as Black Forest Labs' file names it: double-stream blocks (image
    and text streams, each with modulation, attention with RMS q/k norms and an
    MLP), single-stream blocks, and the final adaptive layer."""
    head = 128
    e = _linear("img_in", dim, in_ch * patch * patch)
    e += _linear("time_in.in_layer", dim, 256) + _linear("time_in.out_layer", dim, dim)
    e += _linear("vector_in.in_layer", dim, vec) + _linear("vector_in.out_layer", dim, dim)
    if guidance:
        e += _linear("guidance_in.in_layer", dim, 256) + _linear("guidance_in.out_layer", dim, dim)
    e += _linear("txt_in", dim, ctx)
    for i in range(double):
        b = f"double_blocks.{i}."
        for s in ("img", "txt"):
            e += _linear(f"{b}{s}_mod.lin", 6 * dim, dim)
            e += _linear(f"{b}{s}_attn.qkv", 3 * dim, dim)
            e += [(f"{b}{s}_attn.norm.query_norm.scale", (head,)), (f"{b}{s}_attn.norm.key_norm.scale", (head,))]
            e += _linear(f"{b}{s}_attn.proj", dim, dim)
            e += _linear(f"{b}{s}_mlp.0", mlp, dim) + _linear(f"{b}{s}_mlp.2", dim, mlp)
    for i in range(single):
        b = f"single_blocks.{i}."
        e += _linear(b + "linear1", 3 * dim + mlp, dim) + _linear(b + "linear2", dim, dim + mlp)
        e += [(b + "norm.query_norm.scale", (head,)), (b + "norm.key_norm.scale", (head,))]
        e += _linear(b + "modulation.lin", 3 * dim, dim)
    e += _linear("final_layer.linear", patch * patch * in_ch, dim)
    e += _linear("final_layer.adaLN_modulation.1", 2 * dim, dim)
    return e


def write_flux_dev(path, seed=6):
    return write(path, flux_entries(), "BF16", seed)


# --- the SD / SDXL / Flux autoencoder (decoder side) ---

def _sd_resnet(prefix, n_in, n_out):
    e = _norm(prefix + "norm1", n_in) + _conv(prefix + "conv1", n_out, n_in, 3, 3)
    e += _norm(prefix + "norm2", n_out) + _conv(prefix + "conv2", n_out, n_out, 3, 3)
    if n_in != n_out:
        e += _conv(prefix + "nin_shortcut", n_out, n_in, 1, 1)
    return e


def sd_vae_decoder_entries(prefix, z, ch=SD_VAE_CH, mult=(1, 2, 4, 4), res_blocks=2, quant=True):
    """The LDM AutoencoderKL's decoder (conv_in, middle with attention, up
    levels of res_blocks + 1 ResNet blocks and an upsampler, norm_out,
    conv_out) and, for SD/SDXL files, the quant convolutions."""
    d = prefix + "decoder."
    top = ch * mult[-1]
    e = _conv(d + "conv_in", top, z, 3, 3)
    e += _sd_resnet(d + "mid.block_1.", top, top)
    e += _norm(d + "mid.attn_1.norm", top)
    for p in ("q", "k", "v", "proj_out"):
        e += _conv(f"{d}mid.attn_1.{p}", top, top, 1, 1)
    e += _sd_resnet(d + "mid.block_2.", top, top)
    n = top
    for level in reversed(range(len(mult))):
        out = ch * mult[level]
        for j in range(res_blocks + 1):
            e += _sd_resnet(f"{d}up.{level}.block.{j}.", n, out)
            n = out
        if level != 0:
            e += _conv(f"{d}up.{level}.upsample.conv", n, n, 3, 3)
    e += _norm(d + "norm_out", n) + _conv(d + "conv_out", 3, n, 3, 3)
    if quant:
        e += _conv(prefix + "quant_conv", 2 * z, 2 * z, 1, 1) + _conv(prefix + "post_quant_conv", z, z, 1, 1)
    return e


def write_flux_vae(path, seed=7):
    return write(path, sd_vae_decoder_entries("", 16, quant=False), "BF16", seed)


# --- SDXL ---

SDXL_CONTEXT = CLIP_L_DIM + CLIP_G_DIM     # penultimate CLIP-L and bigG states, concatenated
SDXL_ADM = CLIP_G_DIM + 6 * 256            # pooled bigG + size/crop/target embeddings


def _sdxl_res(prefix, n_in, n_out, emb):
    e = _norm(prefix + "in_layers.0", n_in) + _conv(prefix + "in_layers.2", n_out, n_in, 3, 3)
    e += _linear(prefix + "emb_layers.1", n_out, emb)
    e += _norm(prefix + "out_layers.0", n_out) + _conv(prefix + "out_layers.3", n_out, n_out, 3, 3)
    if n_in != n_out:
        e += _conv(prefix + "skip_connection", n_out, n_in, 1, 1)
    return e


def _sdxl_transformer(prefix, n, depth, ctx):
    e = _norm(prefix + "norm", n) + _linear(prefix + "proj_in", n, n)
    for i in range(depth):
        b = f"{prefix}transformer_blocks.{i}."
        for a, kv in (("attn1", n), ("attn2", ctx)):
            e += _linear(f"{b}{a}.to_q", n, n, bias=False)
            e += _linear(f"{b}{a}.to_k", n, kv, bias=False) + _linear(f"{b}{a}.to_v", n, kv, bias=False)
            e += _linear(f"{b}{a}.to_out.0", n, n)
        e += _linear(b + "ff.net.0.proj", 8 * n, n) + _linear(b + "ff.net.2", n, 4 * n)   # GEGLU
        for k in (1, 2, 3):
            e += _norm(f"{b}norm{k}", n)
    return e + _linear(prefix + "proj_out", n, n)


def sdxl_unet_entries(prefix="model.diffusion_model.", ch=SDXL_CH, mult=SDXL_MULT, depth=SDXL_DEPTH,
                      ctx=SDXL_CONTEXT, adm=SDXL_ADM, in_ch=4):
    """The SGM UNet as SDXL's file names it: time and label (ADM) embeddings,
    input blocks (one ResNet block a level here, a spatial transformer on the
    levels with depth, a strided downsampler between levels), the middle
    block, output blocks (one more ResNet block a level, taking the skips) and
    the output head. Linear proj_in/proj_out as SDXL."""
    emb = 4 * ch
    p = prefix
    e = _linear(p + "time_embed.0", emb, ch) + _linear(p + "time_embed.2", emb, emb)
    e += _linear(p + "label_emb.0.0", emb, adm) + _linear(p + "label_emb.0.2", emb, emb)
    e += _conv(p + "input_blocks.0.0", ch, in_ch, 3, 3)
    skips = [ch]
    n, k = ch, 1
    for level, m in enumerate(mult):
        out = ch * m
        e += _sdxl_res(f"{p}input_blocks.{k}.0.", n, out, emb)
        if depth[level]:
            e += _sdxl_transformer(f"{p}input_blocks.{k}.1.", out, depth[level], ctx)
        n = out
        skips.append(n)
        k += 1
        if level != len(mult) - 1:
            e += _conv(f"{p}input_blocks.{k}.0.op", n, n, 3, 3)
            skips.append(n)
            k += 1
    e += _sdxl_res(p + "middle_block.0.", n, n, emb)
    e += _sdxl_transformer(p + "middle_block.1.", n, depth[-1], ctx)
    e += _sdxl_res(p + "middle_block.2.", n, n, emb)
    k = 0
    for level in reversed(range(len(mult))):
        out = ch * mult[level]
        for j in range(2):   # one ResNet block a level, plus one
            s = skips.pop()
            e += _sdxl_res(f"{p}output_blocks.{k}.0.", n + s, out, emb)
            n = out
            sub = 1
            if depth[level]:
                e += _sdxl_transformer(f"{p}output_blocks.{k}.1.", n, depth[level], ctx)
                sub = 2
            if level != 0 and j == 1:
                e += _conv(f"{p}output_blocks.{k}.{sub}.conv", n, n, 3, 3)
            k += 1
    e += _norm(p + "out.0", n) + _conv(p + "out.2", in_ch, n, 3, 3)
    return e


def sdxl_checkpoint_entries():
    e = sdxl_unet_entries()
    # CLIP-L as transformers' CLIPTextModel (no projection in SDXL's file)
    e += clip_hf_entries("conditioner.embedders.0.transformer.", CLIP_L_DIM, CLIP_L_FF, CLIP_LAYERS,
                         projection=False)
    e += clip_openclip_entries("conditioner.embedders.1.model.", CLIP_G_DIM, CLIP_G_FF, CLIP_LAYERS)
    e += sd_vae_decoder_entries("first_stage_model.", 4)
    return e


def write_sdxl_checkpoint(path, seed=8):
    return write(path, sdxl_checkpoint_entries(), "F16", seed)


# --- a LoRA for the tiny SDXL ---

LORA_RANK = 4

# (Kohya module name, out features, in features): layers of the tiny SDXL's
# UNet (a self- and a cross-attention projection, a feed-forward) and of both
# text encoders (CLIP-L's first layer, bigG's second: SDXL reads the
# penultimate layer of each, so both change the conditioning)
SDXL_LORA_MODULES = [
    ("lora_unet_input_blocks_3_1_transformer_blocks_0_attn1_to_q", 2 * SDXL_CH, 2 * SDXL_CH),
    ("lora_unet_middle_block_1_transformer_blocks_0_attn2_to_k", 2 * SDXL_CH, SDXL_CONTEXT),
    ("lora_unet_middle_block_1_transformer_blocks_0_ff_net_2", 2 * SDXL_CH, 8 * SDXL_CH),
    ("lora_te1_text_model_encoder_layers_0_self_attn_q_proj", CLIP_L_DIM, CLIP_L_DIM),
    ("lora_te2_text_model_encoder_layers_1_mlp_fc1", CLIP_G_FF, CLIP_G_DIM),
]


def write_sdxl_lora(path, seed=9, rank=LORA_RANK):
    """A LoRA for the tiny SDXL in Kohya's layout, as most SDXL LoRAs are
    shipped (F16): per module lora_down [rank, in], lora_up [out, rank] and
    alpha (= rank: scale 1). Values scaled by fan-in, so that up @ down is of
    the size of the weight it is added to."""
    entries, alphas = [], []
    for name, n_out, n_in in SDXL_LORA_MODULES:
        entries += [(name + ".lora_down.weight", (rank, n_in)), (name + ".lora_up.weight", (n_out, rank))]
        alphas.append((name + ".alpha", "F16", [], _encode(np.array([rank], np.float32), "F16")))
    return write(path, entries, "F16", seed, extra=alphas)


# --- the whole set, in ComfyUI's models/ layout ---

FILES = {
    "wan": {"unet": "diffusion_models/tiny_wan2.1_t2v.safetensors",
            "clip": "text_encoders/tiny_umt5_xxl.safetensors",
            "vae": "vae/tiny_wan_2.1_vae.safetensors"},
    "flux": {"unet": "diffusion_models/tiny_flux1_dev.safetensors",
             "clip_l": "text_encoders/tiny_clip_l.safetensors",
             "t5": "text_encoders/tiny_t5xxl.safetensors",
             "vae": "vae/tiny_flux_ae.safetensors"},
    "sdxl": {"ckpt": "checkpoints/tiny_sdxl.safetensors",
             "lora": "loras/tiny_sdxl_lora.safetensors"},
}

_WRITERS = {
    "wan": {"unet": write_wan21_t2v, "clip": write_umt5_xxl, "vae": write_wan21_vae},
    "flux": {"unet": write_flux_dev, "clip_l": write_clip_l, "t5": write_t5_xxl, "vae": write_flux_vae},
    "sdxl": {"ckpt": write_sdxl_checkpoint, "lora": write_sdxl_lora},
}


def write_models(models_dir, archs=("wan", "flux", "sdxl")):
    """Write the tiny models of `archs` under models_dir (diffusion_models/,
    text_encoders/, vae/, checkpoints/, loras/). Returns {arch: {role: file name as
    ComfyUI's loaders list it}}."""
    out = {}
    for a in archs:
        out[a] = {}
        for role, rel in FILES[a].items():
            _WRITERS[a][role](os.path.join(models_dir, rel))
            out[a][role] = rel.split("/", 1)[1]
    return out


def comfy_overrides():
    """What ComfyUI cannot read from the tiny files (see the module's comment),
    in the form tests/comfyui/harness.py takes: text-encoder configs merged
    into the text encoders' model options, and model configs registered as
    variants of ComfyUI's supported models."""
    return {
        "text_encoder_configs": {
            "umt5xxl": {"d_model": UMT5_DIM, "num_heads": T5_HEADS, "d_kv": T5_KV, "vocab_size": UMT5_VOCAB},
            "t5xxl": {"d_model": T5_DIM, "num_heads": T5_HEADS, "d_kv": T5_KV},
            "clip_l": {"hidden_size": CLIP_L_DIM, "intermediate_size": CLIP_L_FF,
                       "num_attention_heads": CLIP_L_HEADS, "num_hidden_layers": CLIP_LAYERS,
                       "projection_dim": CLIP_L_DIM},
            "clip_g": {"hidden_size": CLIP_G_DIM, "intermediate_size": CLIP_G_FF,
                       "num_attention_heads": CLIP_G_HEADS, "num_hidden_layers": CLIP_LAYERS,
                       "projection_dim": CLIP_G_DIM},
        },
        "supported_models": [
            {"name": "TinySDXL", "base": "SDXL",
             "unet_config": {"model_channels": SDXL_CH, "use_linear_in_transformer": True,
                             "transformer_depth": list(SDXL_DEPTH), "context_dim": SDXL_CONTEXT,
                             "adm_in_channels": SDXL_ADM, "use_temporal_attention": False}},
        ],
    }


if __name__ == "__main__":
    if len(sys.argv) != 2:
        sys.exit("usage: comfy_models.py MODELS_DIR")
    files = write_models(sys.argv[1])
    for arch, roles in files.items():
        for role, name in roles.items():
            p = os.path.join(sys.argv[1], FILES[arch][role])
            print(f"{arch:5} {role:6} {os.path.getsize(p):>10} {p}")
