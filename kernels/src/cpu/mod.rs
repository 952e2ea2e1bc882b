//! The CPU backend: SIMD kernels chosen at run time, a scalar twin for each.
