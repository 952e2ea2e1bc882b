"""LoRA adapters for the NumPy reference: random adapters written as a
PEFT folder and as a llama.cpp GGUF adapter, and the updates either form
holds, in the base's row order.

Independent of the engine: safetensors through `safetensors.numpy`, GGUF
through the `gguf` PyPI package, and llama.cpp's Q/K `permute` written out
here as its converter has it.
"""

from __future__ import annotations

import json
from pathlib import Path

import gguf
import numpy as np
from safetensors.numpy import save_file

from .checkpoint import Config, _read_safetensors

TARGETS = {
    "q_proj": ("self_attn", "attn_q"),
    "k_proj": ("self_attn", "attn_k"),
    "v_proj": ("self_attn", "attn_v"),
    "o_proj": ("self_attn", "attn_output"),
    "gate_proj": ("mlp", "ffn_gate"),
    "up_proj": ("mlp", "ffn_up"),
    "down_proj": ("mlp", "ffn_down"),
}


def dims(cfg: Config, target: str) -> tuple[int, int]:
    q, kv, h, f = cfg.heads * cfg.head_dim, cfg.kv_heads * cfg.head_dim, cfg.hidden, cfg.ffn
    return {
        "q_proj": (h, q), "k_proj": (h, kv), "v_proj": (h, kv), "o_proj": (q, h),
        "gate_proj": (h, f), "up_proj": (h, f), "down_proj": (f, h),
    }[target]


def permute(w: np.ndarray, n_head: int) -> np.ndarray:
    """llama.cpp's `LlamaModel.permute` (convert_hf_to_gguf.py) on rows."""
    return w.reshape(n_head, 2, w.shape[0] // n_head // 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


def random_peft(cfg: Config, rank: int, alpha: float, seed: int, magnitude: float) -> dict[str, np.ndarray]:
    """PEFT-named tensors of a random adapter on every target of every layer."""
    rng = np.random.default_rng(seed)
    out = {}
    for layer in range(cfg.layers):
        for target, (block, _) in TARGETS.items():
            i, o = dims(cfg, target)
            module = f"base_model.model.model.layers.{layer}.{block}.{target}"
            out[f"{module}.lora_A.weight"] = rng.uniform(-magnitude, magnitude, (rank, i)).astype(np.float32)
            out[f"{module}.lora_B.weight"] = rng.uniform(-magnitude, magnitude, (o, rank)).astype(np.float32)
    return out


def write_peft(folder: Path, tensors: dict[str, np.ndarray], rank: int, alpha: float) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    save_file(tensors, str(folder / "adapter_model.safetensors"), metadata={"format": "pt"})
    (folder / "adapter_config.json").write_text(json.dumps({
        "peft_type": "LORA", "r": rank, "lora_alpha": alpha, "target_modules": sorted(TARGETS),
        "bias": "none", "use_rslora": False, "use_dora": False, "fan_in_fan_out": False,
        "task_type": "CAUSAL_LM",
    }))


def write_gguf(path: Path, tensors: dict[str, np.ndarray], cfg: Config, alpha: float) -> None:
    """As convert_lora_to_gguf.py writes a Llama adapter: Q and K's lora_b
    rows permuted, F32 tensors."""
    w = gguf.GGUFWriter(str(path), arch=cfg.arch)
    w.add_string("general.type", "adapter")
    w.add_string("adapter.type", "lora")
    w.add_float32("adapter.lora.alpha", alpha)
    for name, value in sorted(tensors.items()):
        layer = int(name.split(".layers.")[1].split(".")[0])
        target = name.split(".lora_")[0].rsplit(".", 1)[1]
        gguf_name = f"blk.{layer}.{TARGETS[target][1]}.weight"
        if ".lora_A." in name:
            w.add_tensor(f"{gguf_name}.lora_a", value)
        else:
            if cfg.rope_style == "interleaved" and target in ("q_proj", "k_proj"):
                heads = cfg.heads if target == "q_proj" else cfg.kv_heads
                value = permute(value, heads)
            w.add_tensor(f"{gguf_name}.lora_b", np.ascontiguousarray(value))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


def peft_updates(folder: Path, cfg: Config) -> dict[str, tuple[np.ndarray, np.ndarray, float]]:
    """The updates of a PEFT folder for a base of `cfg`, by GGUF weight name."""
    config = json.loads((folder / "adapter_config.json").read_text())
    tensors = _read_safetensors(folder / "adapter_model.safetensors")
    out = {}
    for name, (_, a) in tensors.items():
        if ".lora_A." not in name:
            continue
        _, b = tensors[name.replace(".lora_A.", ".lora_B.")]
        layer = int(name.split(".layers.")[1].split(".")[0])
        target = name.split(".lora_")[0].rsplit(".", 1)[1]
        if cfg.rope_style == "interleaved" and target in ("q_proj", "k_proj"):
            b = permute(b, cfg.heads if target == "q_proj" else cfg.kv_heads)
        scale = config["lora_alpha"] / a.shape[0]
        out[f"blk.{layer}.{TARGETS[target][1]}.weight"] = (a.astype(np.float64), b.astype(np.float64), scale)
    return out


def gguf_updates(path: Path) -> dict[str, tuple[np.ndarray, np.ndarray, float]]:
    """The updates of a GGUF adapter (already in a GGUF base's row order)."""
    reader = gguf.GGUFReader(str(path))
    alpha = float(reader.fields["adapter.lora.alpha"].parts[-1][0])
    tensors = {}
    for t in reader.tensors:
        values = gguf.quants.dequantize(t.data, t.tensor_type)
        tensors[t.name] = np.asarray(values, dtype=np.float64).reshape([int(d) for d in reversed(t.shape)])
    out = {}
    for name, a in tensors.items():
        if name.endswith(".lora_a"):
            weight = name[: -len(".lora_a")]
            b = tensors[weight + ".lora_b"]
            out[weight] = (a, b, alpha / a.shape[0])
    return out
