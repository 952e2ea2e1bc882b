//! Which kernel serves a tensor type: the CUDA side of ggml's per-type
//! table. Names are built from [`DType::name`], which is also how the `.cu`
//! files name their instantiations (`SY_MMVQ_ALL(q4_k, SY_Q4_K)` defines
//! `sy_mmvq_q4_k_n1` .. `_n8`); a test reads the sources to keep the two
//! in step.

use super::sources::KernelModule;
use crate::DType;

/// Activation rows one matrix-vector kernel takes: the instantiated tiles.
pub const ACTIVATION_TILES: [usize; 4] = [1, 2, 4, 8];

/// The largest tile not above `rows` (a batch of 11 runs as 8 + 2 + 1).
pub fn tile_for(rows: usize) -> usize {
    ACTIVATION_TILES
        .into_iter()
        .rev()
        .find(|t| *t <= rows)
        .unwrap_or(1)
}

/// The decode kernel multiplying `dtype` weights by `tile` activation
/// rows, and its module: MMVQ over q8_1 activations for the quantized
/// types, the float kernel over f32 activations for F32/F16/BF16.
pub fn matvec(dtype: DType, tile: usize) -> Option<(KernelModule, String)> {
    if !ACTIVATION_TILES.contains(&tile) {
        return None;
    }
    Some(if dtype.is_quantized() {
        (
            KernelModule::Mmvq,
            format!("sy_mmvq_{}_n{tile}", dtype.name()),
        )
    } else {
        (
            KernelModule::MmvFloat,
            format!("sy_mmv_{}_n{tile}", dtype.name()),
        )
    })
}

/// The decoder of a whole `dtype` matrix to F16 (prefill through cuBLAS).
pub fn dequant_f16(dtype: DType) -> String {
    format!("sy_dequant_f16_{}", dtype.name())
}

/// The decoder of selected `dtype` rows to F32 (embeddings).
pub fn embed(dtype: DType) -> String {
    format!("sy_embed_{}", dtype.name())
}

/// The attention kernel for a head size, where one is instantiated.
pub fn attention(head_dim: usize) -> Option<&'static str> {
    match head_dim {
        64 => Some("sy_attention_hd64"),
        128 => Some("sy_attention_hd128"),
        256 => Some("sy_attention_hd256"),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The kernel names a module's source defines, from its instantiation
    /// macros and plain `extern "C"` kernels.
    fn defined(module: KernelModule) -> Vec<String> {
        let src = module.source();
        let mut names = Vec::new();
        for line in src.lines() {
            let line = line.trim();
            for (prefix, stem) in [("SY_MMVQ_ALL(", "sy_mmvq_"), ("SY_MMV_ALL(", "sy_mmv_")] {
                if let Some(rest) = line.strip_prefix(prefix) {
                    let ty = rest.split(',').next().unwrap_or_default();
                    names.extend(ACTIVATION_TILES.map(|n| format!("{stem}{ty}_n{n}")));
                }
            }
            if let Some(rest) = line.strip_prefix("SY_DEQUANT(") {
                let ty = rest.split(',').next().unwrap_or_default();
                names.push(format!("sy_dequant_f16_{ty}"));
                names.push(format!("sy_embed_{ty}"));
            }
            if let Some(rest) = line.strip_prefix("SY_ATTENTION(") {
                names.push(format!("sy_attention_hd{}", rest.trim_end_matches(')')));
            }
        }
        names
    }

    #[test]
    fn every_dtype_has_its_kernels_in_the_sources() {
        let mmvq = defined(KernelModule::Mmvq);
        let float = defined(KernelModule::MmvFloat);
        let dequant = defined(KernelModule::Dequant);
        for dtype in DType::ALL {
            for tile in ACTIVATION_TILES {
                let (module, name) = matvec(dtype, tile).unwrap();
                let names = if module == KernelModule::Mmvq {
                    &mmvq
                } else {
                    &float
                };
                assert!(names.contains(&name), "{name} is not defined");
            }
            assert!(dequant.contains(&dequant_f16(dtype)), "{dtype}");
            assert!(dequant.contains(&embed(dtype)), "{dtype}");
        }
        let attention_defs = defined(KernelModule::Attention);
        for hd in [64, 128, 256] {
            assert!(attention_defs.contains(&attention(hd).unwrap().to_string()));
        }
        assert_eq!(attention(96), None);
    }

    #[test]
    fn tiles_cover_a_batch_greedily() {
        assert_eq!(tile_for(1), 1);
        assert_eq!(tile_for(3), 2);
        assert_eq!(tile_for(7), 4);
        assert_eq!(tile_for(64), 8);
        assert_eq!(matvec(DType::Q4K, 3), None);
    }
}
