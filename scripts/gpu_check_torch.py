#!/usr/bin/env python3
"""The PyTorch half of scripts/gpu-check.sh: the baseline figures the CUDA
backend is compared against, one JSON object per line on stdout.

- F16 GEMV at the decode matmuls' shape (11008 x 4096): weight GB/s.
- `transformers` decode tokens/s of a synthetic Llama-7B at batch 1, 16
  and 64: with `--weights DIR`, the very checkpoint the CUDA backend ran
  (`cuda_check --export DIR`: config.json and F16 safetensors), and its
  logits for the tokens of DIR/switchyard_logits.json compared with the
  backend's (written there by `cuda_check --weights DIR`); without it, or
  when the export is missing, random weights built on the GPU.

    python3 scripts/gpu_check_torch.py [--weights DIR]
"""
import json
import os
import sys
import time

import torch


def timed(f, reps=20):
    f()
    torch.cuda.synchronize()
    t = time.perf_counter()
    for _ in range(reps):
        f()
    torch.cuda.synchronize()
    return (time.perf_counter() - t) / reps


def gemv():
    w = torch.randn(11008, 4096, device="cuda", dtype=torch.float16)
    for batch in (1, 16, 64):
        x = torch.randn(batch, 4096, device="cuda", dtype=torch.float16)
        s = timed(lambda: x @ w.T)
        print(json.dumps({"check": "torch_gemv", "batch": batch, "us": round(s * 1e6, 1),
                          "weight_gb_s": round(w.numel() * 2 / s / 1e9, 1)}), flush=True)


def load(folder):
    """The exported checkpoint on the GPU, or None where there is none."""
    from transformers import LlamaForCausalLM

    if not folder or not os.path.exists(os.path.join(folder, "model.safetensors")):
        return None
    t = time.perf_counter()
    model = LlamaForCausalLM.from_pretrained(folder, torch_dtype=torch.float16).to("cuda").eval()
    print(json.dumps({"check": "torch_load", "dir": folder,
                      "seconds": round(time.perf_counter() - t, 1)}), flush=True)
    return model


def same_logits(model, folder):
    """The backend's logits of the exported checkpoint against transformers'."""
    path = os.path.join(folder, "switchyard_logits.json")
    if not os.path.exists(path):
        print(json.dumps({"check": "same_weights_gpu", "pass": False,
                          "error": f"{path} missing: cuda_check --weights did not write it"}))
        return
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    from gpu_check_reference import compare

    ours = json.load(open(path))
    with torch.no_grad():
        logits = model(torch.tensor([ours["tokens"]], device="cuda")).logits[0].float()
    theirs = [logits[p].tolist() for p in ours["positions"]]
    # transformers runs F16 activations through 32 layers, the backend f32;
    # the CPU backend against NumPy differs by 5e-5 at tiny shapes, and a
    # wrong RoPE base or norm epsilon there by 2e-2 to 5e-2.
    print(json.dumps(compare("same_weights_gpu", ours["rows"], theirs, 2e-2,
                             reference="transformers F16")), flush=True)


def llama_decode(folder):
    from transformers import LlamaConfig, LlamaForCausalLM

    model = load(folder)
    same = model is not None
    if same:
        same_logits(model, folder)
    else:
        config = LlamaConfig(hidden_size=4096, intermediate_size=11008, num_hidden_layers=32,
                             num_attention_heads=32, num_key_value_heads=32, vocab_size=32000,
                             rms_norm_eps=1e-5)
        # Built in F16 on the GPU directly: an F32 7B first would take 27 GB
        # and most of the step's time limit.
        torch.set_default_dtype(torch.float16)
        with torch.device("cuda"):
            model = LlamaForCausalLM(config).eval()
        torch.set_default_dtype(torch.float32)
    new = 32
    for batch in (1, 16, 64):
        ids = torch.randint(0, 32000, (batch, 16), device="cuda")
        with torch.no_grad():
            model.generate(ids, max_new_tokens=4, do_sample=False, min_new_tokens=4)
            torch.cuda.synchronize()
            t = time.perf_counter()
            model.generate(ids, max_new_tokens=new, do_sample=False, min_new_tokens=new)
            torch.cuda.synchronize()
        s = time.perf_counter() - t
        print(json.dumps({"check": "torch_llama7b_decode", "batch": batch, "same_weights": same,
                          "tokens_per_s": round(batch * new / s, 1)}), flush=True)


if __name__ == "__main__":
    print(json.dumps({"check": "torch", "version": torch.__version__,
                      "gpu": torch.cuda.get_device_name(0)}), flush=True)
    gemv()
    args = sys.argv[1:]
    folder = args[args.index("--weights") + 1] if "--weights" in args else None
    try:
        llama_decode(folder)
    except ImportError as e:
        print(json.dumps({"check": "torch_llama7b_decode", "skipped": str(e)}))
