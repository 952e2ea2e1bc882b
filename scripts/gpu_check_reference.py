#!/usr/bin/env python3
"""The logits check of scripts/gpu-check.sh on the host: a Hugging Face
Llama forward in NumPy (float64) over the folder `cuda_check
--cpu-reference DIR` wrote (config.json, model.safetensors in F16, and
switchyard_logits.json: the CPU backend's logits for the same tokens),
compared row by row. One JSON line on stdout; exit 1 when it differs.

    python3 scripts/gpu_check_reference.py DIR

`compare` is shared with scripts/gpu_check_torch.py, which makes the same
check against `transformers` on the GPU.
"""
import json
import os
import sys


def compare(check, ours, theirs, tolerance, **extra):
    """One report line: max |difference| over the rows against
    `tolerance` x max |reference logit|, and whether each row's top token
    agrees (reported, not required: near ties may swap)."""
    max_abs, top1, scale = 0.0, [], 0.0
    for a, b in zip(ours, theirs):
        scale = max(scale, max(abs(x) for x in b))
        max_abs = max(max_abs, max(abs(x - y) for x, y in zip(a, b)))
        top1.append(max(range(len(a)), key=a.__getitem__) == max(range(len(b)), key=b.__getitem__))
    rel = max_abs / scale if scale else float("inf")
    passed = len(ours) == len(theirs) and len(ours) > 0 and rel <= tolerance
    return {"check": check, "rows": len(ours), "max_abs": max_abs, "max_logit": scale,
            "rel_to_max_logit": rel, "tolerance": tolerance, "top1_agree": top1,
            "pass": passed, **extra}


def forward(cfg, w, tokens):
    """Logits of every position of `tokens` (one sequence), as
    transformers' LlamaForCausalLM computes them, in float64."""
    import numpy as np

    f = lambda name: w[name].astype(np.float64)
    n, heads, hd = len(tokens), cfg["num_attention_heads"], cfg["head_dim"]
    eps, theta = cfg["rms_norm_eps"], cfg["rope_theta"]
    inv = 1.0 / theta ** (np.arange(0, hd, 2, dtype=np.float64) / hd)
    ang = np.outer(np.arange(n, dtype=np.float64), inv)
    cos, sin = np.cos(np.concatenate([ang, ang], 1)), np.sin(np.concatenate([ang, ang], 1))

    def rope(t):  # n x heads x hd, rotate_half
        rot = np.concatenate([-t[..., hd // 2:], t[..., :hd // 2]], -1)
        return t * cos[:, None, :] + rot * sin[:, None, :]

    def norm(t, name):
        return t / np.sqrt((t * t).mean(-1, keepdims=True) + eps) * f(name)

    mask = np.triu(np.full((n, n), -np.inf), 1)
    x = f("model.embed_tokens.weight")[tokens]
    for l in range(cfg["num_hidden_layers"]):
        p = f"model.layers.{l}."
        h = norm(x, p + "input_layernorm.weight")
        q, k, v = (h @ f(p + f"self_attn.{m}_proj.weight").T for m in "qkv")
        q, k = rope(q.reshape(n, heads, hd)), rope(k.reshape(n, heads, hd))
        s = np.einsum("ihd,jhd->hij", q, k) / np.sqrt(hd) + mask
        s = np.exp(s - s.max(-1, keepdims=True))
        s /= s.sum(-1, keepdims=True)
        o = np.einsum("hij,jhd->ihd", s, v.reshape(n, heads, hd)).reshape(n, -1)
        x = x + o @ f(p + "self_attn.o_proj.weight").T
        h = norm(x, p + "post_attention_layernorm.weight")
        g = h @ f(p + "mlp.gate_proj.weight").T
        x = x + (g / (1 + np.exp(-g)) * (h @ f(p + "mlp.up_proj.weight").T)) @ f(p + "mlp.down_proj.weight").T
    return norm(x, "model.norm.weight") @ f("lm_head.weight").T


def main(folder):
    try:
        from safetensors.numpy import load_file
    except ImportError as e:
        print(json.dumps({"check": "same_weights_cpu", "skipped": f"no NumPy/safetensors: {e}"}))
        return 0
    cfg = json.load(open(os.path.join(folder, "config.json")))
    ours = json.load(open(os.path.join(folder, "switchyard_logits.json")))
    logits = forward(cfg, load_file(os.path.join(folder, "model.safetensors")), ours["tokens"])
    theirs = [logits[p].tolist() for p in ours["positions"]]
    # The CPU backend keeps activations in f32 and its KV cache in F16.
    line = compare("same_weights_cpu", ours["rows"], theirs, 1e-3, reference="numpy float64")
    print(json.dumps(line))
    return 0 if line["pass"] else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1]))
