// The weight pointer table: a device array of u64 addresses, one per
// weight slot (a layer's Q, K, V, ... as the host's PointerTable numbers
// them). Kernels take the table and a slot, never a weight address, so a
// launch (and a CUDA graph that captured it) stays valid when the next
// batch's checkpoint is swapped in: the swap rewrites the table with one
// small copy. See kernels/src/cuda/pointer_table.rs.
#pragma once
#include "sy_common.cuh"

SY_HD const uint8_t *sy_weight(const uint64_t *table, uint32_t slot) {
  return (const uint8_t *)(uintptr_t_sy)table[slot];
}
