"""Random blocks of every quantized tensor type and their dequantization by
the `gguf` package: the fixtures of the kernels' dequantization test
(kernels/tests/gguf_dequant.rs), which must equal these values exactly.

    .venv/bin/python tests/python/quant_fixtures.py   # rewrites the fixtures

For each type, `<type>.blocks` holds the raw blocks and `<type>.f32` the
dequantized values (little-endian f32). The blocks are random bytes (every
bit of every quant and scale field exercised) except the f16 scales and
mins, which get finite values of real checkpoints' magnitudes and both
signs, so that no NaN or infinity hides a wrong field.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
from gguf import GGML_QUANT_SIZES, GGMLQuantizationType
from gguf.quants import dequantize

OUT = Path(__file__).resolve().parents[2] / "kernels" / "tests" / "fixtures" / "gguf_dequant"

# Switchyard's name → (ggml type, byte offsets of the block's f16 fields).
TYPES = {
    "q8_0": (GGMLQuantizationType.Q8_0, [0]),
    "q4_0": (GGMLQuantizationType.Q4_0, [0]),
    "q4_1": (GGMLQuantizationType.Q4_1, [0, 2]),
    "q5_0": (GGMLQuantizationType.Q5_0, [0]),
    "q5_1": (GGMLQuantizationType.Q5_1, [0, 2]),
    "q4_k": (GGMLQuantizationType.Q4_K, [0, 2]),
    "q6_k": (GGMLQuantizationType.Q6_K, [208]),
    "q2_k": (GGMLQuantizationType.Q2_K, [80, 82]),
    "q3_k": (GGMLQuantizationType.Q3_K, [108]),
    "q5_k": (GGMLQuantizationType.Q5_K, [0, 2]),
    "iq4_nl": (GGMLQuantizationType.IQ4_NL, [0]),
    "iq4_xs": (GGMLQuantizationType.IQ4_XS, [0]),
}

# Elements per type: several blocks, and rows of more than one block.
ELEMENTS = 2048


def fixture(name: str) -> tuple[bytes, bytes]:
    """(blocks, dequantized f32) for the type `name`, deterministic."""
    qtype, f16_fields = TYPES[name]
    block_len, block_bytes = GGML_QUANT_SIZES[qtype]
    n_blocks = ELEMENTS // block_len
    # One seed per type, from its ggml id, so adding a type changes no other.
    rng = np.random.default_rng(1000 + int(qtype))
    blocks = rng.integers(0, 256, size=(n_blocks, block_bytes), dtype=np.uint8)
    for at in f16_fields:
        magnitude = rng.uniform(1e-4, 5e-2, size=n_blocks)
        sign = rng.choice([-1.0, 1.0], size=n_blocks)
        blocks[:, at:at + 2] = (magnitude * sign).astype(np.float16).view(np.uint8).reshape(n_blocks, 2)
    values = dequantize(blocks.reshape(-1), qtype).astype("<f4")
    assert values.shape == (ELEMENTS,), values.shape
    assert np.isfinite(values).all()
    return blocks.tobytes(), values.tobytes()


def main() -> None:
    OUT.mkdir(parents=True, exist_ok=True)
    for name in TYPES:
        blocks, values = fixture(name)
        (OUT / f"{name}.blocks").write_bytes(blocks)
        (OUT / f"{name}.f32").write_bytes(values)
        print(f"{name}: {len(blocks)} bytes of blocks, {len(values) // 4} values")


if __name__ == "__main__":
    main()
