"""A NumPy Llama-family forward pass: the independent reference.

Shares no code with the engine. Arithmetic is float64, except one step that
is part of the numeric contract of quantized matrix products (as in ggml):
before a product with a block-quantized weight matrix, each activation row is
quantized per 32 elements to int8 with scale d = max|x| / 127 (float32), and
q = round-half-even(x * (1/d)). `act_quant=False` skips that to compare with
plain float arithmetic.

The KV cache is the other: keys (after RoPE) and values are stored rounded
to the engine's KV type, float16 by default (`kv="f16"`, round to nearest
even, as the engine's F16 cache and llama.cpp's `-ctk/-ctv f16`), and
attention reads them back exactly. `kv="f32"` rounds to float32, the
engine's `--kv-type f32`. The engine rounds its float32 keys, the reference
its float64 keys, so an element lying within float32 error of a float16
rounding boundary can land one float16 step (2^-11 relative) apart: like
the int8 activation flips, rare and bounded by the logit tolerances.

`kv="q8_0"` is the engine's `--kv-type q8_0` (llama.cpp's `-ctk q8_0 -ctv
q8_0`): each position's key and value of a KV head, in groups of 32
dimensions, quantized as the activations are (float32 d = max|x| / 127,
q = round-half-even(x * (1/d))) and read back as q * float16(d) in float32
(`quantize_kv_q8_0`). The same boundary effect applies, one int8 step
(d, ~1/127 of the group's largest element) instead of a float16 step.

`attention="bf16"` is the engine's `--attention-precision bf16`
(kernels/src/cpu/attention/bf16.rs): queries, keys and values (as the cache
stores them) and the softmax's probabilities are rounded to BF16 (`to_bf16`:
nearest even, denormals to zero) before the two products, which are then
exact sums here; the softmax's denominator adds the unrounded
probabilities. One difference remains by construction: the engine's
softmax is online, so it rounds each probability relative to the running
maximum of the blocks so far, not the row's maximum as here; both are
relative errors of at most 2^-9 on each weight, and the tolerances of the
tests that use it say what that allows.
"""

from __future__ import annotations

import math

import numpy as np

from . import cache
from .checkpoint import Checkpoint


def _q8_blocks(x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Q8_0 rounding of `x` by blocks of 32 along the last axis: the quants
    (as float32) and each block's float32 scale `amax / 127`."""
    x32 = x.astype(np.float32)
    blocks = x32.reshape(*x32.shape[:-1], -1, 32)
    amax = np.abs(blocks).max(axis=-1, keepdims=True)
    d = (amax / np.float32(127.0)).astype(np.float32)
    with np.errstate(divide="ignore"):
        inv = np.where(d != 0, np.float32(1.0) / d, np.float32(0.0)).astype(np.float32)
    q = np.clip(np.rint(blocks * inv), -127, 127).astype(np.float32)
    return q, d


def quantize_activations(x: np.ndarray) -> np.ndarray:
    q, d = _q8_blocks(x)
    return (q.astype(np.float64) * d.astype(np.float64)).reshape(x.shape)


def quantize_kv_q8_0(x: np.ndarray) -> np.ndarray:
    """`x` (last axis a multiple of 32) as a Q8_0 KV cache reads it back:
    the activations' rounding, but the scale stored as float16 and the
    product taken in float32 (the engine's `kv_q8` contract)."""
    q, d = _q8_blocks(x)
    scale = d.astype(np.float16).astype(np.float32)
    return (q * scale).astype(np.float64).reshape(x.shape)


def to_bf16(x: np.ndarray) -> np.ndarray:
    """`x` (as float32) rounded to BF16, to nearest even, a denormal to its
    signed zero (the engine's `bf16::round`), returned as float64."""
    bits = np.asarray(x, dtype=np.float32).view(np.uint32).astype(np.uint64)
    rounded = ((bits + 0x7FFF + ((bits >> 16) & 1)) >> 16) << 16
    out = np.where(bits & 0x7F800000 == 0, bits & 0x80000000, rounded) & 0xFFFFFFFF
    return out.astype(np.uint32).view(np.float32).astype(np.float64)


def inv_freq(cfg, theta=None, scaling=True) -> np.ndarray:
    dims = np.arange(0, cfg.head_dim, 2, dtype=np.float64)
    freq = 1.0 / ((theta or cfg.theta) ** (dims / cfg.head_dim))
    s = cfg.scaling if scaling else None
    if not s or s.get("type") in (None, "default", "none"):
        return freq
    if s["type"] == "linear":
        return freq / s["factor"]
    if s["type"] == "llama3":
        factor, low, high = s["factor"], s["low_freq_factor"], s["high_freq_factor"]
        old = s["original_max_position_embeddings"]
        wavelen = 2 * math.pi / freq
        smooth = (old / wavelen - low) / (high - low)
        scaled = np.where(
            wavelen < old / high,
            freq,
            np.where(wavelen > old / low, freq / factor, (1 - smooth) * freq / factor + smooth * freq),
        )
        return scaled
    raise ValueError(f"unknown rope scaling {s}")


class Reference:
    def __init__(self, ckpt: Checkpoint, act_quant: bool = True, kv: str = "f16",
                 attention: str = "f32"):
        self.c = ckpt.config
        if kv not in ("f16", "f32", "q8_0"):
            raise ValueError(f"unknown KV type {kv}")
        if attention not in ("f32", "bf16"):
            raise ValueError(f"unknown attention precision {attention}")
        self.kv = kv
        self.attention = attention
        self.ckpt = ckpt
        self.act_quant = act_quant
        self.w = {k: v.astype(np.float64) for k, v in ckpt.tensors.items()}
        # LoRA updates by weight name: (A [r, in], B [out, r] in the base's
        # row order, scale); see reference/lora.py.
        self.lora: dict[str, tuple[np.ndarray, np.ndarray, float]] = {}
        self.freq = inv_freq(self.c)
        # Gemma 3's local layers: their own base, no scaling.
        self.local_freq = inv_freq(self.c, self.c.local_theta, scaling=False) if self.c.local_theta else None
        if "rope_freqs.weight" in ckpt.tensors:
            # GGUF Llama 3 files carry their RoPE scaling as per-dimension
            # divisors of the frequency (llama.cpp's `rope_freqs`).
            self.freq = self.freq / ckpt.tensors["rope_freqs.weight"].astype(np.float64)
        self.reset()

    def reset(self):
        self.k_cache = [np.zeros((0, self.c.kv_heads, self.c.head_dim)) for _ in range(self.c.layers)]
        self.v_cache = [np.zeros((0, self.c.kv_heads, self.c.head_dim)) for _ in range(self.c.layers)]
        # The sequence the caches hold, and the logits of its last row when
        # `forward` computed them: a caller that goes on from here (the
        # teacher-forced check of a greedy continuation, conftest.greedy_gaps)
        # appends the continuation instead of running the prompt again.
        self.tokens: list[int] = []
        self.last_logits: np.ndarray | None = None
        # The tail of `tokens` that cache hits answered without running the
        # layers: the KV caches do not hold it yet (see `hidden`).
        self.unrun: list[int] = []

    def linear(self, x, name, bias=None):
        xin = quantize_activations(x) if (self.act_quant and self.ckpt.quantized(name)) else x
        y = xin @ self.w[name].T
        if bias is not None and bias in self.w:
            y = y + self.w[bias]
        if name in self.lora:
            # The low-rank update takes the unquantized input.
            a, b, scale = self.lora[name]
            y = y + scale * ((x @ a.T) @ b.T)
        return y

    def rms_norm(self, x, name):
        x32 = x
        ms = np.mean(x32 * x32, axis=-1, keepdims=True)
        # Hugging Face Gemma stores w and scales by 1 + w.
        return x32 / np.sqrt(ms + self.c.eps) * (self.w[name] + self.c.norm_offset)

    def rope(self, x, positions, freq=None):
        # x: [n, heads, head_dim]
        freq = self.freq if freq is None else freq
        ang = positions[:, None].astype(np.float64) * freq[None, :]
        cos, sin = np.cos(ang)[:, None, :], np.sin(ang)[:, None, :]
        out = x.copy()
        half = self.c.head_dim // 2
        if self.c.rope_style == "interleaved":
            a, b = x[..., 0::2], x[..., 1::2]
            out[..., 0::2] = a * cos - b * sin
            out[..., 1::2] = a * sin + b * cos
        else:
            a, b = x[..., :half], x[..., half:]
            out[..., :half] = a * cos - b * sin
            out[..., half:] = a * sin + b * cos
        return out

    def stored(self, x: np.ndarray) -> np.ndarray:
        """`x` as the KV cache holds it (see the module documentation)."""
        if self.kv == "q8_0":
            return quantize_kv_q8_0(x)
        dtype = np.float16 if self.kv == "f16" else np.float32
        return x.astype(np.float32).astype(dtype).astype(np.float64)

    def forward(self, tokens: list[int], from_row: int = 0) -> np.ndarray:
        """Appends `tokens` to the sequence; returns logits for each of them
        from row `from_row` on (a 262k vocabulary makes every row costly)."""
        h = self.hidden(tokens, from_row)
        head = "output.weight" if "output.weight" in self.w else "token_embd.weight"
        logits = self.linear(h, head)
        if self.c.final_softcap:
            logits = self.c.final_softcap * np.tanh(logits / self.c.final_softcap)
        self.last_logits = logits[-1].copy() if len(logits) else None
        return logits

    def embedding(self, tokens: list[int]) -> np.ndarray:
        """`tokens`' embedding as `POST /v1/embeddings` defines it (llama.cpp's
        server): the mean of the final hidden states after the output norm,
        scaled to unit length. Resets the sequence first."""
        self.reset()
        mean = self.hidden(tokens).mean(axis=0)
        return mean / np.linalg.norm(mean)

    def hidden(self, tokens: list[int], from_row: int = 0) -> np.ndarray:
        """Appends `tokens` to the sequence; returns the final hidden states
        after the output norm (what the output projection reads) from row
        `from_row` on.

        Answered from the disk cache (reference/cache.py) when the same pass
        ran before. A hit leaves the KV caches behind the sequence; the next
        miss runs the tokens they lack first, so every result is what an
        uncached run gives."""
        tokens = [int(t) for t in tokens]
        # A subclass may watch the pass itself (scripts/train-lora.py keeps
        # a layer's activations): it always runs.
        here = cache.folder() if type(self) is Reference else None
        if here is None:
            return self._catch_up_and_run(tokens, from_row)
        name = cache.key([
            cache.weights_digest(self.ckpt), cache.lora_digest(self.lora), self.act_quant, self.kv,
            self.attention, self.tokens, tokens, from_row,
        ])
        rows = cache.load(here, name)
        if rows is not None:
            self.tokens += tokens
            self.unrun += tokens
            self.last_logits = None
            return rows
        rows = self._catch_up_and_run(tokens, from_row)
        cache.store(here, name, rows)
        return rows

    def _catch_up_and_run(self, tokens: list[int], from_row: int) -> np.ndarray:
        if self.unrun:
            unrun, self.unrun = self.unrun, []
            del self.tokens[-len(unrun):]
            self._run(unrun, from_row=len(unrun))
        return self._run(tokens, from_row)

    def _run(self, tokens: list[int], from_row: int) -> np.ndarray:
        """The forward pass through every layer (see `hidden`)."""
        c = self.c
        start = self.k_cache[0].shape[0]
        n = len(tokens)
        self.tokens += [int(t) for t in tokens]
        self.last_logits = None
        positions = np.arange(start, start + n)
        x = self.w["token_embd.weight"][np.asarray(tokens)]
        group = c.heads // c.kv_heads
        mask = positions[:, None] >= np.arange(start + n)[None, :]
        if c.embed_scale:
            x = x * c.embed_scale
        q_width, kv_width = c.heads * c.head_dim, c.kv_heads * c.head_dim
        distance = positions[:, None] - np.arange(start + n)[None, :]
        for i in range(c.layers):
            p = f"blk.{i}."
            h = self.rms_norm(x, p + "attn_norm.weight")
            if p + "attn_qkv.weight" in self.w:
                # Phi-3: Q, K and V rows in one matrix.
                qkv = self.linear(h, p + "attn_qkv.weight")
                q, k, v = qkv[:, :q_width], qkv[:, q_width : q_width + kv_width], qkv[:, q_width + kv_width :]
            else:
                q = self.linear(h, p + "attn_q.weight", p + "attn_q.bias")
                k = self.linear(h, p + "attn_k.weight", p + "attn_k.bias")
                v = self.linear(h, p + "attn_v.weight", p + "attn_v.bias")
            q = q.reshape(n, c.heads, c.head_dim)
            k = k.reshape(n, c.kv_heads, c.head_dim)
            v = v.reshape(n, c.kv_heads, c.head_dim)
            if c.qk_norm:
                q = self.rms_norm(q, p + "attn_q_norm.weight")
                k = self.rms_norm(k, p + "attn_k_norm.weight")
            local = c.local(i)
            freq = self.local_freq if (local and self.local_freq is not None) else self.freq
            q, k = self.rope(q, positions, freq), self.rope(k, positions, freq)
            self.k_cache[i] = np.concatenate([self.k_cache[i], self.stored(k)])
            self.v_cache[i] = np.concatenate([self.v_cache[i], self.stored(v)])
            keys = np.repeat(self.k_cache[i], group, axis=1)  # [t, heads, d]
            vals = np.repeat(self.v_cache[i], group, axis=1)
            bf16 = self.attention == "bf16"
            if bf16:
                q, keys, vals = to_bf16(q), to_bf16(keys), to_bf16(vals)
            scale = c.attn_scale if c.attn_scale else 1.0 / math.sqrt(c.head_dim)
            # Batched matrix products (BLAS) rather than einsum: the same
            # float64 sums, fast enough for 4k-token contexts.
            scores = np.matmul(q.transpose(1, 0, 2), keys.transpose(1, 2, 0)) * scale  # [h, n, t]
            if c.attn_softcap:
                scores = c.attn_softcap * np.tanh(scores / c.attn_softcap)
            seen = mask & (distance < c.window) if local else mask
            scores = np.where(seen[None], scores, -np.inf)
            scores -= scores.max(axis=-1, keepdims=True)
            probs = np.exp(scores)
            total = probs.sum(axis=-1, keepdims=True)
            probs = (to_bf16(probs) if bf16 else probs) / total
            attn = np.matmul(probs, vals.transpose(1, 0, 2)).transpose(1, 0, 2).reshape(n, c.heads * c.head_dim)
            out = self.linear(attn, p + "attn_output.weight")
            if c.post_norms:
                out = self.rms_norm(out, p + "post_attention_norm.weight")
            x = x + out
            h = self.rms_norm(x, p + "ffn_norm.weight")
            if p + "ffn_gate.weight" in self.w:
                g = self.linear(h, p + "ffn_gate.weight")
                u = self.linear(h, p + "ffn_up.weight")
            else:
                # Phi-3: gate then up in one matrix.
                gu = self.linear(h, p + "ffn_up.weight")
                g, u = gu[:, : c.ffn], gu[:, c.ffn :]
            if c.gelu:
                act = 0.5 * g * (1.0 + np.tanh(math.sqrt(2.0 / math.pi) * (g + 0.044715 * g**3)))
            else:
                act = g / (1.0 + np.exp(-g))
            out = self.linear(act * u, p + "ffn_down.weight")
            if c.post_norms:
                out = self.rms_norm(out, p + "post_ffw_norm.weight")
            x = x + out
        return self.rms_norm(x[from_row:], "output_norm.weight")

    def greedy(self, prompt: list[int], steps: int) -> tuple[np.ndarray, list[int]]:
        """Prefills `prompt`, then decodes `steps` tokens greedily (EOS ignored).
        Returns the prompt's logits and the generated ids."""
        self.reset()
        logits = self.forward(prompt)
        out = []
        nxt = int(np.argmax(logits[-1]))
        for _ in range(steps):
            out.append(nxt)
            if len(out) == steps:
                break
            nxt = int(np.argmax(self.forward([nxt])[-1]))
        return logits, out
