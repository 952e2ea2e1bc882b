#!/usr/bin/env python3
"""The PyTorch half of scripts/gpu-check.sh: the baseline figures the CUDA
backend is compared against, one JSON object per line on stdout.

- F16 GEMV at the decode matmuls' shape (11008 x 4096): weight GB/s.
- `transformers` decode tokens/s of a synthetic Llama-7B (random F16
  weights, built on the GPU) at batch 1, 16 and 64.
"""
import json
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


def llama_decode():
    from transformers import LlamaConfig, LlamaForCausalLM

    config = LlamaConfig(hidden_size=4096, intermediate_size=11008, num_hidden_layers=32,
                         num_attention_heads=32, num_key_value_heads=32, vocab_size=32000)
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
        print(json.dumps({"check": "torch_llama7b_decode", "batch": batch,
                          "tokens_per_s": round(batch * new / s, 1)}), flush=True)


if __name__ == "__main__":
    print(json.dumps({"check": "torch", "version": torch.__version__,
                      "gpu": torch.cuda.get_device_name(0)}), flush=True)
    gemv()
    try:
        llama_decode()
    except ImportError as e:
        print(json.dumps({"check": "torch_llama7b_decode", "skipped": str(e)}))
