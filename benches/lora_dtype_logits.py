"""How far an adapter's storage type moves the logits: `switchyard logits
--positions all` on one prompt with each adapter's A and B kept in F32 (the
reference), BF16 and Q8_0 (`SWITCHYARD_LORA_DTYPE`), same binary, and the
max / mean |difference| against F32 beside the adapter's own mean effect
(F32 against no adapter). The numbers behind the Q8_0 decision in
docs/bench/lora.md.

Usage: .venv/bin/python benches/lora_dtype_logits.py BIN MODEL.gguf ADAPTER...
(e.g. the PEFT folders `benches/lora_serving.py --work target/lora-work`
writes: target/lora-work/a0 a1 a2). The .npy files go to target/lora-logits.
"""
import os
import subprocess
import sys
from pathlib import Path

import numpy as np

OUT = Path("target/lora-logits")
# 24 ids of SmolLM2's vocabulary (any prompt would do; fixed so runs compare).
TOKENS = "1,504,3458,282,4649,314,1345,28,378,2767,282,253,3853,1341,314,30,378,4471,4145,9150,808,28,253,1789"


def logits(bin_path: str, model: str, adapter: str | None, dtype: str) -> np.ndarray:
    out = OUT / f"{Path(adapter).name if adapter else 'none'}-{dtype}.npy"
    cmd = [bin_path, "logits", "--model", model, "--tokens", TOKENS, "--out", str(out), "--positions", "all"]
    if adapter:
        cmd += ["--lora", adapter]
    subprocess.run(cmd, check=True, env={**os.environ, "SWITCHYARD_LORA_DTYPE": dtype}, capture_output=True)
    return np.load(out).astype(np.float64)


def main() -> None:
    if len(sys.argv) < 4:
        sys.exit(__doc__)
    bin_path, model, adapters = sys.argv[1], sys.argv[2], sys.argv[3:]
    OUT.mkdir(parents=True, exist_ok=True)
    base = logits(bin_path, model, None, "f32")
    for adapter in adapters:
        ref = logits(bin_path, model, adapter, "f32")
        effect = np.abs(ref - base).mean()
        for dtype in ["bf16", "q8_0"]:
            got = logits(bin_path, model, adapter, dtype)
            d = np.abs(got - ref)
            agree = int((got.argmax(1) == ref.argmax(1)).sum())
            print(f"{Path(adapter).name} {dtype}: max |d| {d.max():.4f}, mean |d| {d.mean():.5f} "
                  f"(adapter's mean effect {effect:.3f}); argmax agrees on {agree} of {len(ref)} rows")


if __name__ == "__main__":
    main()
