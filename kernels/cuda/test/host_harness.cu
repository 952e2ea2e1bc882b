// The block decoders, the activation quantizer and the per-block dot
// products, compiled for the host (by nvcc, or by a C++ compiler where the
// toolkit is absent) so the Rust tests can check them against the CPU
// backend bit for bit. Driven over stdin/stdout by
// kernels/src/cuda/host_harness.rs; requests, all little-endian u32 words
// then payload, until end of input:
//
//   1 type nblocks  <blocks>           -> f32 × nblocks·block_len (decoded)
//   2 type k rows   <rows> <f32 × k>   -> i8 × k, f32 × 2·k/32 (d, s), f32 × rows
//   3 type k rows   <rows> <f32 × k>   -> f32 × rows (float weights · x)
//   4 n             <f32 × n>          -> u16 × n (f32 → f16, nearest even)
#include <stdio.h>
#include <stdlib.h>
#include <vector>

#include "../sy_dequant.cuh"
#include "../sy_dot.cuh"
#include "../sy_quant_act.cuh"

static bool read_exact(void *p, size_t n) { return fread(p, 1, n, stdin) == n; }

static void write_all(const void *p, size_t n) {
  if (fwrite(p, 1, n, stdout) != n) exit(3);
}

static void fail(const char *what) {
  fprintf(stderr, "host_harness: %s\n", what);
  exit(2);
}

int main() {
  uint32_t op;
  while (read_exact(&op, 4)) {
    if (op == 4) {
      uint32_t n;
      if (!read_exact(&n, 4)) fail("short header");
      std::vector<float> x(n);
      if (!read_exact(x.data(), 4 * (size_t)n)) fail("short payload");
      std::vector<uint16_t> h(n);
      for (uint32_t i = 0; i < n; i++) h[i] = sy_f32_to_half(x[i]);
      write_all(h.data(), 2 * (size_t)n);
      continue;
    }
    uint32_t hdr[3];
    if (!read_exact(hdr, 8)) fail("short header");
    int t = (int)hdr[0];
    int len = sy_block_len(t), bytes = sy_block_bytes(t);
    if (len == 0) fail("unknown type");
    if (op == 1) {
      size_t nblocks = hdr[1];
      std::vector<uint8_t> blocks(nblocks * bytes);
      if (!read_exact(blocks.data(), blocks.size())) fail("short blocks");
      std::vector<float> out(nblocks * len);
      for (size_t i = 0; i < nblocks; i++) sy_dequant_block(t, &blocks[i * bytes], &out[i * len]);
      write_all(out.data(), 4 * out.size());
      continue;
    }
    if (op != 2 && op != 3) fail("unknown request");
    if (!read_exact(hdr + 2, 4)) fail("short header");
    size_t k = hdr[1], rows = hdr[2];
    if (k % 32 != 0 || k % len != 0) fail("k is not whole blocks");
    size_t row_bytes = k / len * bytes;
    std::vector<uint8_t> w(rows * row_bytes);
    std::vector<float> x(k);
    if (!read_exact(w.data(), w.size()) || !read_exact(x.data(), 4 * k)) fail("short payload");
    std::vector<float> out(rows);
    if (op == 3) {
      for (size_t r = 0; r < rows; r++) {
        float sum = 0.0f;
        for (size_t i = 0; i < k; i++) sum = SY_ADD(sum, SY_MUL(sy_float_weight(t, &w[r * row_bytes], (int)i), x[i]));
        out[r] = sum;
      }
      write_all(out.data(), 4 * rows);
      continue;
    }
    size_t nb = k / 32;
    std::vector<int8_t> q(k);
    std::vector<float> ds(2 * nb);
    for (size_t b = 0; b < nb; b++) {
      int halves[2];
      ds[2 * b] = sy_quantize_block_q8_1(&x[32 * b], &q[32 * b], &ds[2 * b + 1], halves);
    }
    for (size_t r = 0; r < rows; r++) {
      float sum = 0.0f;
      for (size_t b = 0; b < nb; b++)
        sum = SY_ADD(sum, sy_dot_block(t, &w[r * row_bytes], (int)b, &q[32 * b], ds[2 * b], ds[2 * b + 1]));
      out[r] = sum;
    }
    write_all(q.data(), k);
    write_all(ds.data(), 4 * ds.size());
    write_all(out.data(), 4 * rows);
  }
  return 0;
}
