"""The peer: llama.cpp (through llama-cpp-python) on the same GGUF, the same
prompt ids and thread counts as benches/generation.rs. Prints JSON lines.

Usage: python benches/llama_cpp_peer.py MODEL.gguf [--repeats N]
"""

from __future__ import annotations

import argparse
import json
import time

import numpy as np
from llama_cpp import Llama

PROMPT_LENGTHS = (128, 512)
GENERATED_TOKENS = 128


def prompt_ids(n: int) -> list[int]:
    return [100 + (i * 7919) % 48000 for i in range(n)]


def measure(model: str, threads: int, repeats: int) -> dict:
    llm = Llama(model_path=model, n_ctx=1024, n_threads=threads, n_threads_batch=threads,
                n_batch=512, n_ubatch=512, verbose=False)
    prompt = prompt_ids(max(PROMPT_LENGTHS))
    prompt_s = {n: [] for n in PROMPT_LENGTHS}
    gen_s = []
    for _ in range(repeats):
        for n in PROMPT_LENGTHS:
            llm.reset()
            start = time.perf_counter()
            llm.eval(prompt[:n])
            prompt_s[n].append(time.perf_counter() - start)

        llm.reset()
        llm.eval(prompt[:8])
        start = time.perf_counter()
        for _ in range(GENERATED_TOKENS):
            nxt = int(np.argmax(llm.scores[llm.n_tokens - 1]))
            llm.eval([nxt])
        gen_s.append(time.perf_counter() - start)
    result = {"threads": threads,
              "generate_tok_s": GENERATED_TOKENS / float(np.median(gen_s))}
    for n in PROMPT_LENGTHS:
        result[f"prompt{n}_tok_s"] = n / float(np.median(prompt_s[n]))
    return result


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("model")
    ap.add_argument("--repeats", type=int, default=10)
    args = ap.parse_args()
    for threads in (1, 2):
        print(json.dumps(measure(args.model, threads, args.repeats)))


if __name__ == "__main__":
    main()
