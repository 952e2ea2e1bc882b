//! The CUDA C sources, embedded: every kernel module (one `.cu` of
//! `kernels/cuda/`) and the headers they include. The ahead-of-time build
//! (scripts/build-cuda-kernels.sh) compiles the files themselves; NVRTC,
//! the run-time fallback, gets one translation unit per module with the
//! includes inlined here (it has no file system to read them from).

use super::CudaError;

/// A kernel module: one `.cu` file, one CUDA module loaded at run time.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum KernelModule {
    Quantize,
    Mmvq,
    MmvFloat,
    Dequant,
    Norm,
    Rope,
    Elementwise,
    Softmax,
    Attention,
}

impl KernelModule {
    pub const ALL: [KernelModule; 9] = [
        KernelModule::Quantize,
        KernelModule::Mmvq,
        KernelModule::MmvFloat,
        KernelModule::Dequant,
        KernelModule::Norm,
        KernelModule::Rope,
        KernelModule::Elementwise,
        KernelModule::Softmax,
        KernelModule::Attention,
    ];

    /// The file stem in `kernels/cuda/` (and of its CUBINs and PTX).
    pub const fn name(self) -> &'static str {
        match self {
            KernelModule::Quantize => "quantize",
            KernelModule::Mmvq => "mmvq",
            KernelModule::MmvFloat => "mmv_float",
            KernelModule::Dequant => "dequant",
            KernelModule::Norm => "norm",
            KernelModule::Rope => "rope",
            KernelModule::Elementwise => "elementwise",
            KernelModule::Softmax => "softmax",
            KernelModule::Attention => "attention",
        }
    }

    /// The module's `.cu` source.
    pub fn source(self) -> &'static str {
        match self {
            KernelModule::Quantize => include_str!("../../cuda/quantize.cu"),
            KernelModule::Mmvq => include_str!("../../cuda/mmvq.cu"),
            KernelModule::MmvFloat => include_str!("../../cuda/mmv_float.cu"),
            KernelModule::Dequant => include_str!("../../cuda/dequant.cu"),
            KernelModule::Norm => include_str!("../../cuda/norm.cu"),
            KernelModule::Rope => include_str!("../../cuda/rope.cu"),
            KernelModule::Elementwise => include_str!("../../cuda/elementwise.cu"),
            KernelModule::Softmax => include_str!("../../cuda/softmax.cu"),
            KernelModule::Attention => include_str!("../../cuda/attention.cu"),
        }
    }
}

/// The headers, by the name the sources include them as.
const HEADERS: [(&str, &str); 7] = [
    ("sy_common.cuh", include_str!("../../cuda/sy_common.cuh")),
    ("sy_blocks.cuh", include_str!("../../cuda/sy_blocks.cuh")),
    ("sy_dequant.cuh", include_str!("../../cuda/sy_dequant.cuh")),
    ("sy_dot.cuh", include_str!("../../cuda/sy_dot.cuh")),
    (
        "sy_quant_act.cuh",
        include_str!("../../cuda/sy_quant_act.cuh"),
    ),
    ("sy_warp.cuh", include_str!("../../cuda/sy_warp.cuh")),
    ("sy_weights.cuh", include_str!("../../cuda/sy_weights.cuh")),
];

/// `module`'s source with every `#include "x.cuh"` replaced by the header
/// (each header once, as `#pragma once` would), for NVRTC.
pub fn flattened(module: KernelModule) -> Result<String, CudaError> {
    let mut out = String::new();
    let mut seen = Vec::new();
    inline(module.source(), &mut seen, &mut out)?;
    Ok(out)
}

fn inline(src: &str, seen: &mut Vec<&'static str>, out: &mut String) -> Result<(), CudaError> {
    for line in src.lines() {
        let trimmed = line.trim();
        if trimmed == "#pragma once" {
            continue;
        }
        if let Some(name) = trimmed
            .strip_prefix("#include \"")
            .and_then(|rest| rest.strip_suffix('"'))
        {
            let Some((name, text)) = HEADERS.iter().find(|(n, _)| *n == name) else {
                return Err(CudaError::Layout(format!(
                    "kernels/cuda: `{trimmed}` names a header the NVRTC fallback does not embed"
                )));
            };
            if !seen.contains(name) {
                seen.push(name);
                inline(text, seen, out)?;
            }
            continue;
        }
        out.push_str(line);
        out.push('\n');
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_cu_file_is_a_module_and_every_header_is_embedded() {
        let dir = concat!(env!("CARGO_MANIFEST_DIR"), "/cuda");
        let mut files: Vec<String> = std::fs::read_dir(dir)
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .collect();
        files.sort();
        for f in &files {
            if let Some(stem) = f.strip_suffix(".cu") {
                assert!(
                    KernelModule::ALL.iter().any(|m| m.name() == stem),
                    "kernels/cuda/{f} is not in KernelModule::ALL"
                );
            }
            if f.ends_with(".cuh") {
                assert!(
                    HEADERS.iter().any(|(n, _)| n == f),
                    "kernels/cuda/{f} is not in HEADERS"
                );
            }
        }
        assert_eq!(
            files.iter().filter(|f| f.ends_with(".cu")).count(),
            KernelModule::ALL.len()
        );
    }

    #[test]
    fn flattened_sources_have_no_includes_left_and_each_header_once() {
        for m in KernelModule::ALL {
            let src = flattened(m).unwrap();
            assert!(!src.contains("#include \""), "{}", m.name());
            // sy_common.cuh's first definition appears exactly once.
            assert_eq!(
                src.matches("SY_HD uint32_t sy_f32_bits").count(),
                1,
                "{}",
                m.name()
            );
            assert!(src.contains("extern \"C\" __global__"), "{}", m.name());
        }
    }

    #[test]
    fn an_unknown_include_is_an_error() {
        let mut out = String::new();
        let err = inline("#include \"nope.cuh\"\n", &mut Vec::new(), &mut out).unwrap_err();
        assert!(err.to_string().contains("nope.cuh"), "{err}");
    }
}
