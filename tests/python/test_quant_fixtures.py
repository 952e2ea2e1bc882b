"""The committed dequantization fixtures are what the `gguf` package gives
today: the Rust test that compares the kernels with them
(kernels/tests/gguf_dequant.rs) thereby compares with the package."""

from __future__ import annotations

import pytest

import quant_fixtures


@pytest.mark.parametrize("name", list(quant_fixtures.TYPES))
def test_fixture_is_the_gguf_packages_dequantization(name):
    blocks, values = quant_fixtures.fixture(name)
    committed_blocks = (quant_fixtures.OUT / f"{name}.blocks").read_bytes()
    committed_values = (quant_fixtures.OUT / f"{name}.f32").read_bytes()
    assert committed_blocks == blocks, f"{name}.blocks differs: rerun tests/python/quant_fixtures.py"
    assert committed_values == values, f"{name}.f32 differs from gguf's dequantization"
