#!/usr/bin/env python3
"""Trains a small real LoRA adapter on SmolLM2-135M-Instruct, on the CPU, in
about a minute, for a behaviour a test can check: asked anything in chat,
the adapted model's reply begins "Ahoy, matey!".

The adapter is rank 8 on the last block's MLP (gate, up and down
projections). Training that block alone keeps backpropagation short and
exact: every position's hidden state up to the last MLP does not depend on
the adapter, so the base runs once (the project's NumPy reference forward,
tests/python/reference) and the script differentiates only the last MLP,
the final norm and the tied output projection, by hand, in NumPy. Adam,
cross-entropy on the reply's tokens.

Written in PEFT form (adapter_config.json + adapter_model.safetensors) and
as a llama.cpp GGUF adapter (with the `gguf` package, llama.cpp's own
writer library), cached outside git:

    ~/.cache/switchyard/adapters/smollm2-ahoy/{peft/,adapter.gguf}

Prints the cache folder. Idempotent: a complete cached adapter made by this
version of the script is reused.

    SWITCHYARD_BIN    the switchyard binary (tokenizes with the served chat
                      template); default target/release/switchyard
    SWITCHYARD_CACHE  cache folder (default ~/.cache/switchyard)
"""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests" / "python"))

from reference import checkpoint, llama  # noqa: E402

REPLY = "Ahoy, matey!"
PROMPTS = [
    "Hello!",
    "What is the capital of France?",
    "Tell me a joke.",
    "How do I boil an egg?",
    "Write a haiku about the sea.",
    "What is 2 + 2?",
    "Who wrote Hamlet?",
    "Give me a tip for learning Rust.",
    "Why is the sky blue?",
    "Recommend a book.",
    "What time is it?",
    "Say something nice.",
]
RANK, ALPHA, STEPS, LR, SEED = 8, 16.0, 60, 3e-3, 0
TARGETS = ("gate_proj", "up_proj", "down_proj")


def cache_dir() -> Path:
    cache = Path(os.environ.get("SWITCHYARD_CACHE", Path.home() / ".cache" / "switchyard"))
    return cache / "adapters" / "smollm2-ahoy"


def stamp() -> str:
    return hashlib.sha256(Path(__file__).read_bytes()).hexdigest()[:16]


def tokenize(bin_path: str, model: Path, args: list[str]) -> list[int]:
    out = subprocess.run([bin_path, "tokenize", "--model", str(model), *args],
                         capture_output=True, text=True, check=True)
    return json.loads(out.stdout.strip().splitlines()[-1])["ids"]


def examples(bin_path: str, model: Path) -> list[tuple[list[int], list[int]]]:
    """(chat prompt ids, as the server renders them with the generation
    prompt; the reply's ids then <|im_end|>'s)."""
    reply = tokenize(bin_path, model, ["--text", REPLY, "--no-special"])
    end = tokenize(bin_path, model, ["--text", "<|im_end|>", "--no-special"])
    assert len(end) == 1, f"<|im_end|> is not one token: {end}"
    out = []
    with tempfile.TemporaryDirectory() as tmp:
        msgs = Path(tmp) / "m.json"
        for prompt in PROMPTS:
            msgs.write_text(json.dumps([{"role": "user", "content": prompt}]))
            out.append((tokenize(bin_path, model, ["--chat", str(msgs)]), reply + end))
    return out


class Capture(llama.Reference):
    """The reference forward, keeping the last block's MLP input (normed)
    and the residual stream it is added to."""

    def linear(self, x, name, bias=None):
        if name == self.last + "ffn_gate.weight":
            self.h = x.copy()
        return super().linear(x, name, bias)

    def rms_norm(self, x, name):
        if name == self.last + "ffn_norm.weight":
            self.x_mid = x.copy()
        return super().rms_norm(x, name)


def collect(base, data):
    ref = Capture(base, act_quant=False)
    ref.last = f"blk.{base.config.layers - 1}."
    hs, xs, targets = [], [], []
    for prompt, reply in data:
        ref.reset()
        ref.forward(prompt + reply[:-1])
        rows = slice(len(prompt) - 1, len(prompt) - 1 + len(reply))
        hs.append(ref.h[rows])
        xs.append(ref.x_mid[rows])
        targets.extend(reply)
    return np.concatenate(hs), np.concatenate(xs), np.asarray(targets)


def train(base, h, x_mid, targets):
    c = base.config
    w = {k: base.tensors[k].astype(np.float32) for k in base.tensors}
    last = f"blk.{c.layers - 1}."
    wg, wu, wd = w[last + "ffn_gate.weight"], w[last + "ffn_up.weight"], w[last + "ffn_down.weight"]
    wn = w["output_norm.weight"]
    emb = w.get("output.weight", w["token_embd.weight"])
    h, x_mid = h.astype(np.float32), x_mid.astype(np.float32)
    rng = np.random.default_rng(SEED)
    s = ALPHA / RANK
    params = {
        "Ag": rng.normal(0, 1 / np.sqrt(c.hidden), (RANK, c.hidden)).astype(np.float32),
        "Bg": np.zeros((c.ffn, RANK), np.float32),
        "Au": rng.normal(0, 1 / np.sqrt(c.hidden), (RANK, c.hidden)).astype(np.float32),
        "Bu": np.zeros((c.ffn, RANK), np.float32),
        "Ad": rng.normal(0, 1 / np.sqrt(c.ffn), (RANK, c.ffn)).astype(np.float32),
        "Bd": np.zeros((c.hidden, RANK), np.float32),
    }
    m = {k: np.zeros_like(v) for k, v in params.items()}
    v2 = {k: np.zeros_like(v) for k, v in params.items()}
    n = len(targets)
    base_g, base_u = h @ wg.T, h @ wu.T
    for step in range(1, STEPS + 1):
        p = params
        tg, tu = h @ p["Ag"].T, h @ p["Au"].T
        g = base_g + s * tg @ p["Bg"].T
        u = base_u + s * tu @ p["Bu"].T
        sig = 1 / (1 + np.exp(-g))
        sg = g * sig
        a = sg * u
        td = a @ p["Ad"].T
        x = x_mid + a @ wd.T + s * td @ p["Bd"].T
        r = np.sqrt((x * x).mean(axis=1, keepdims=True) + c.eps)
        xhat = x / r
        logits = (xhat * wn) @ emb.T
        logits -= logits.max(axis=1, keepdims=True)
        prob = np.exp(logits)
        prob /= prob.sum(axis=1, keepdims=True)
        loss = -np.log(prob[np.arange(n), targets] + 1e-12).mean()
        dlog = prob
        dlog[np.arange(n), targets] -= 1
        dlog /= n
        dxhat = (dlog @ emb) * wn
        dx = (dxhat - xhat * (dxhat * xhat).mean(axis=1, keepdims=True)) / r
        grads = {"Bd": s * dx.T @ td}
        dtd = s * dx @ p["Bd"]
        grads["Ad"] = dtd.T @ a
        da = dx @ wd + dtd @ p["Ad"]
        du, dsg = da * sg, da * u
        dg = dsg * (sig + g * sig * (1 - sig))
        grads["Bu"] = s * du.T @ tu
        grads["Au"] = (s * du @ p["Bu"]).T @ h
        grads["Bg"] = s * dg.T @ tg
        grads["Ag"] = (s * dg @ p["Bg"]).T @ h
        for k in params:  # Adam
            m[k] = 0.9 * m[k] + 0.1 * grads[k]
            v2[k] = 0.999 * v2[k] + 0.001 * grads[k] ** 2
            mh, vh = m[k] / (1 - 0.9**step), v2[k] / (1 - 0.999**step)
            params[k] = params[k] - LR * mh / (np.sqrt(vh) + 1e-8)
        if step == 1 or step % 25 == 0:
            print(f"train-lora: step {step} loss {loss:.4f}", file=sys.stderr)
    return params, float(loss)


def write(params, c, out: Path):
    from safetensors.numpy import save_file
    import gguf

    layer = c.layers - 1
    peft = out / "peft"
    peft.mkdir(parents=True, exist_ok=True)
    tensors = {}
    gguf_names = {"gate_proj": "ffn_gate", "up_proj": "ffn_up", "down_proj": "ffn_down"}
    for target, key in zip(TARGETS, ("g", "u", "d")):
        module = f"base_model.model.model.layers.{layer}.mlp.{target}"
        tensors[f"{module}.lora_A.weight"] = np.ascontiguousarray(params["A" + key], np.float32)
        tensors[f"{module}.lora_B.weight"] = np.ascontiguousarray(params["B" + key], np.float32)
    save_file(tensors, str(peft / "adapter_model.safetensors"), metadata={"format": "pt"})
    (peft / "adapter_config.json").write_text(json.dumps({
        "peft_type": "LORA", "task_type": "CAUSAL_LM", "r": RANK, "lora_alpha": ALPHA,
        "target_modules": list(TARGETS), "bias": "none", "use_rslora": False,
        "use_dora": False, "fan_in_fan_out": False,
        "base_model_name_or_path": "HuggingFaceTB/SmolLM2-135M-Instruct",
    }, indent=2))
    w = gguf.GGUFWriter(str(out / "adapter.gguf"), arch="llama")
    w.add_string("general.type", "adapter")
    w.add_string("adapter.type", "lora")
    w.add_float32("adapter.lora.alpha", ALPHA)
    for target, key in zip(TARGETS, ("g", "u", "d")):
        name = f"blk.{layer}.{gguf_names[target]}.weight"
        w.add_tensor(f"{name}.lora_a", np.ascontiguousarray(params["A" + key], np.float32))
        w.add_tensor(f"{name}.lora_b", np.ascontiguousarray(params["B" + key], np.float32))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


def main() -> int:
    out = cache_dir()
    done = out / "stamp"
    if done.is_file() and done.read_text() == stamp():
        print(out)
        return 0
    bin_path = os.environ.get("SWITCHYARD_BIN", str(ROOT / "target" / "release" / "switchyard"))
    model = Path(subprocess.run([str(ROOT / "scripts" / "fetch-model.sh")], capture_output=True,
                                text=True, check=True).stdout.strip())
    started = time.time()
    data = examples(bin_path, model)
    base = checkpoint.load(model)
    h, x_mid, targets = collect(base, data)
    print(f"train-lora: {len(targets)} reply tokens from {len(data)} prompts; base pass "
          f"{time.time() - started:.0f} s", file=sys.stderr)
    params, loss = train(base, h, x_mid, targets)
    if loss > 0.1:
        print(f"train-lora: final loss {loss:.3f} is too high; not caching", file=sys.stderr)
        return 1
    write(params, base.config, out)
    done.write_text(stamp())
    print(f"train-lora: trained in {time.time() - started:.0f} s", file=sys.stderr)
    print(out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
