"""Loads a checkpoint into NumPy for the reference forward pass.

Independent of the engine: GGUF tensors come from the `gguf` PyPI package
(its reader and its dequantizers), safetensors from a small header parser
here. Tensor names are normalised to GGUF's, matrices are `[rows, cols]`.
"""

from __future__ import annotations

import json
import math
import struct
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import gguf

QUANTIZED = {
    "Q4_0", "Q4_1", "Q5_0", "Q5_1", "Q8_0", "Q2_K", "Q3_K", "Q4_K", "Q5_K", "Q6_K",
    "IQ4_NL", "IQ4_XS",
}


@dataclass
class Config:
    arch: str
    vocab: int
    hidden: int
    ffn: int
    layers: int
    heads: int
    kv_heads: int
    head_dim: int
    eps: float
    theta: float
    rope_style: str  # "interleaved" or "neox"
    scaling: dict | None
    context: int
    # Family traits (defaults: Llama's block).
    gelu: bool = False  # GeGLU (tanh GELU) instead of SwiGLU
    embed_scale: float | None = None  # Gemma: sqrt(hidden)
    post_norms: bool = False  # Gemma: norms after attention and MLP
    qk_norm: bool = False  # Qwen3, Gemma 3: per-head query/key RMSNorm
    attn_scale: float | None = None  # None: 1/sqrt(head_dim)
    attn_softcap: float | None = None
    final_softcap: float | None = None
    window: int | None = None  # sliding window (positions seen, self included)
    swa_pattern: int = 0  # layer i local unless i % n == n - 1; 0: all local
    local_theta: float | None = None  # Gemma 3 local layers' RoPE base
    norm_offset: float = 0.0  # Hugging Face Gemma: norms scale by 1 + w

    def local(self, layer: int) -> bool:
        if self.window is None:
            return False
        n = self.swa_pattern
        return n == 0 or layer % n != n - 1


@dataclass
class Checkpoint:
    config: Config
    tensors: dict[str, np.ndarray]  # float32
    types: dict[str, str]  # tensor name -> storage type name ("Q4_1", "F32", ...)

    def quantized(self, name: str) -> bool:
        return self.types[name] in QUANTIZED


def load(path: str | Path, values: bool = True) -> Checkpoint:
    """The checkpoint at `path`; `values=False` reads a GGUF file's
    configuration and tensor types without dequantizing any tensor (seconds
    less per call, tensors left empty)."""
    path = Path(path)
    return _load_hf(path) if path.is_dir() else _load_gguf(path, values)


class FastReader(gguf.GGUFReader):
    """`gguf.GGUFReader` (its parse, its fields, its tensors) with the
    metadata arrays read faster: the package walks every element of an array
    through a `np.memmap` slice, which for a 262k-token vocabulary (its
    tokens, scores and types) took most of a Gemma 3 load (~11 of 15 CPU
    seconds). Here a numeric array is one slice, and a string array's
    elements are sliced from a plain array over the same memory. The parts
    it yields are views of the same bytes, so `ReaderField.contents()` gives
    what the package's reader gives (test_reference_cache.py compares)."""

    def _get(self, offset, dtype, count=1, override_order=None):
        plain = getattr(self, "_plain", None)
        if plain is None or plain.base is not self.data:
            plain = self._plain = self.data.view(np.ndarray)
        count = int(count)
        itemsize = np.dtype(dtype).itemsize
        arr = plain[offset : offset + itemsize * count].view(dtype=dtype)[:count]
        return arr.view(arr.dtype.newbyteorder(self.byte_order if override_order is None else override_order))

    def _get_field_parts(self, orig_offs, raw_type):
        if gguf.GGUFValueType(raw_type) != gguf.GGUFValueType.ARRAY:
            return super()._get_field_parts(orig_offs, raw_type)
        raw_itype = self._get(orig_offs, np.uint32)
        alen = self._get(orig_offs + 4, np.uint64)
        itype = gguf.GGUFValueType(raw_itype[0])
        nptype = self.gguf_scalar_to_np.get(itype)
        if nptype is None:
            return super()._get_field_parts(orig_offs, raw_type)
        values = self._get(orig_offs + 12, nptype, alen[0])
        # One part holding every element: `contents()` lists them all.
        return 12 + int(values.nbytes), [raw_itype, alen, values], [2], [gguf.GGUFValueType.ARRAY, itype]


def _load_gguf(path: Path, values: bool = True) -> Checkpoint:
    reader = FastReader(str(path))

    def field(key, default=None):
        f = reader.get_field(key)
        return default if f is None else f.contents()

    arch = field("general.architecture")
    tensors, types, shapes = {}, {}, {}
    for t in reader.tensors:
        shape = tuple(int(d) for d in reversed(t.shape.tolist()))
        shapes[t.name] = shape
        types[t.name] = t.tensor_type.name
        if values:
            tensors[t.name] = gguf.quants.dequantize(t.data, t.tensor_type).astype(np.float32).reshape(shape)
    heads = int(field(f"{arch}.attention.head_count"))
    hidden = int(field(f"{arch}.embedding_length"))
    scaling = None
    if field(f"{arch}.rope.scaling.type") == "linear":
        scaling = {"type": "linear", "factor": float(field(f"{arch}.rope.scaling.factor"))}
    head_dim = int(field(f"{arch}.attention.key_length", hidden // heads))
    layers = int(field(f"{arch}.block_count"))
    window = field(f"{arch}.attention.sliding_window")
    traits = dict(window=int(window) if window else None)
    if arch == "qwen3":
        traits = dict(qk_norm=True)
    if arch in ("gemma2", "gemma3"):
        g3 = arch == "gemma3"
        # llama.cpp: 1/sqrt(head_dim), or 1/sqrt(hidden/heads) for the 27B models.
        big = layers == (62 if g3 else 46)
        traits.update(
            gelu=True,
            embed_scale=math.sqrt(hidden),
            post_norms=True,
            qk_norm=g3,
            attn_scale=1.0 / math.sqrt(hidden // heads if big else head_dim),
            attn_softcap=field(f"{arch}.attention.logit_softcapping"),
            final_softcap=field(f"{arch}.final_logit_softcapping"),
            swa_pattern=int(field(f"{arch}.attention.sliding_window_pattern", 6 if g3 else 2)),
            local_theta=float(field(f"{arch}.rope.freq_base_swa", 10000.0)) if g3 else None,
        )
    config = Config(
        arch=arch,
        vocab=shapes["token_embd.weight"][0],
        hidden=hidden,
        ffn=int(field(f"{arch}.feed_forward_length")),
        layers=int(field(f"{arch}.block_count")),
        heads=heads,
        kv_heads=int(field(f"{arch}.attention.head_count_kv", heads)),
        head_dim=head_dim,
        eps=float(field(f"{arch}.attention.layer_norm_rms_epsilon")),
        theta=float(field(f"{arch}.rope.freq_base", 10000.0)),
        # llama.cpp's converter permutes Llama/Mistral Q/K into interleaved
        # pairs; the other families keep Hugging Face's halves.
        rope_style="interleaved" if arch in ("llama", "mistral") else "neox",
        scaling=scaling,
        context=int(field(f"{arch}.context_length")),
        **traits,
    )
    return Checkpoint(config, tensors, types)


HF_NAMES = {
    "model.embed_tokens.weight": "token_embd.weight",
    "model.norm.weight": "output_norm.weight",
    "lm_head.weight": "output.weight",
}
HF_LAYER_NAMES = {
    "self_attn.q_proj": "attn_q",
    "self_attn.k_proj": "attn_k",
    "self_attn.v_proj": "attn_v",
    "self_attn.o_proj": "attn_output",
    "self_attn.q_norm": "attn_q_norm",
    "self_attn.k_norm": "attn_k_norm",
    "self_attn.qkv_proj": "attn_qkv",
    "input_layernorm": "attn_norm",
    "post_attention_layernorm": "ffn_norm",
    "mlp.gate_proj": "ffn_gate",
    "mlp.up_proj": "ffn_up",
    "mlp.gate_up_proj": "ffn_up",
    "mlp.down_proj": "ffn_down",
}
# Gemma names its MLP input norm `pre_feedforward_layernorm` and has a norm
# after attention under Llama's name for that one.
GEMMA_LAYER_NAMES = {
    **HF_LAYER_NAMES,
    "post_attention_layernorm": "post_attention_norm",
    "pre_feedforward_layernorm": "ffn_norm",
    "post_feedforward_layernorm": "post_ffw_norm",
}


def _gguf_name(hf: str, gemma: bool = False) -> str:
    if hf in HF_NAMES:
        return HF_NAMES[hf]
    parts = hf.split(".")
    # model.layers.N.<module...>.<weight|bias>
    layer, module, kind = parts[2], ".".join(parts[3:-1]), parts[-1]
    names = GEMMA_LAYER_NAMES if gemma else HF_LAYER_NAMES
    return f"blk.{layer}.{names[module]}.{kind}"


def _read_safetensors(path: Path) -> dict[str, tuple[str, np.ndarray]]:
    raw = path.read_bytes()
    (header_len,) = struct.unpack("<Q", raw[:8])
    header = json.loads(raw[8 : 8 + header_len])
    base = 8 + header_len
    out = {}
    for name, info in header.items():
        if name == "__metadata__":
            continue
        start, end = info["data_offsets"]
        buf = np.frombuffer(raw[base + start : base + end], dtype=np.uint8)
        dtype = info["dtype"]
        if dtype == "F32":
            values = buf.view("<f4")
        elif dtype == "F16":
            values = buf.view("<f2").astype(np.float32)
        elif dtype == "BF16":
            values = (buf.view("<u2").astype(np.uint32) << 16).view(np.float32)
        else:
            raise ValueError(f"{path}: unsupported dtype {dtype}")
        out[name] = (dtype, values.astype(np.float32).reshape(info["shape"]))
    return out


def _load_hf(folder: Path) -> Checkpoint:
    cfg = json.loads((folder / "config.json").read_text())
    index = folder / "model.safetensors.index.json"
    files = (
        sorted(set(json.loads(index.read_text())["weight_map"].values()))
        if index.exists()
        else ["model.safetensors"]
    )
    tensors, types = {}, {}
    arch = cfg["model_type"]
    gemma = arch in ("gemma2", "gemma3_text")
    for f in files:
        for name, (dtype, values) in _read_safetensors(folder / f).items():
            tensors[_gguf_name(name, gemma)] = values
            types[_gguf_name(name, gemma)] = dtype
    heads = cfg["num_attention_heads"]
    head_dim = cfg.get("head_dim") or cfg["hidden_size"] // heads
    traits = {}
    if arch in ("mistral", "phi3"):
        traits = dict(window=cfg.get("sliding_window"))
    if arch == "qwen3":
        traits = dict(qk_norm=True)
    if gemma:
        g3 = arch == "gemma3_text"
        traits = dict(
            gelu=True,
            embed_scale=math.sqrt(cfg["hidden_size"]),
            post_norms=True,
            qk_norm=g3,
            attn_scale=cfg.get("query_pre_attn_scalar", head_dim) ** -0.5,
            attn_softcap=cfg.get("attn_logit_softcapping"),
            final_softcap=cfg.get("final_logit_softcapping"),
            window=cfg.get("sliding_window"),
            swa_pattern=cfg.get("sliding_window_pattern", 6 if g3 else 2),
            local_theta=cfg.get("rope_local_base_freq", 10000.0) if g3 else None,
            norm_offset=1.0,
        )
    scaling = cfg.get("rope_scaling")
    if scaling is not None:
        scaling = dict(scaling)
        scaling["type"] = scaling.get("rope_type", scaling.get("type"))
    config = Config(
        arch=cfg["model_type"],
        vocab=cfg["vocab_size"],
        hidden=cfg["hidden_size"],
        ffn=cfg["intermediate_size"],
        layers=cfg["num_hidden_layers"],
        heads=heads,
        kv_heads=cfg.get("num_key_value_heads", heads),
        head_dim=head_dim,
        eps=cfg["rms_norm_eps"],
        theta=cfg.get("rope_theta", 10000.0),
        rope_style="neox",  # Hugging Face's rotate_half
        scaling=scaling,
        context=cfg["max_position_embeddings"],
        **traits,
    )
    return Checkpoint(config, tensors, types)
