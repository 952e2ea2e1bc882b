//! Which instruction set the CPU kernels use, chosen once per backend.
//!
//! Detection runs `is_x86_feature_detected!` at backend construction; every
//! kernel then dispatches on a [`CheckedIsa`], a value that can only exist
//! once the features it names were detected. That is what makes the `unsafe`
//! calls into `#[target_feature]` functions sound.

/// Environment variable that caps the ISA [`Isa::from_env`] picks:
/// `scalar`, `neon` (aarch64), `avx2`, `avx512` (AVX-512 without VNNI) or
/// `avx512vnni`.
pub const ISA_ENV_VAR: &str = "SWITCHYARD_ISA";

/// An instruction-set level for the CPU kernels, ordered from least to most
/// capable: each x86 level implies the x86 levels below it. `Neon` is the
/// aarch64 level; it sorts below every x86 level so that the x86 kernels'
/// `>= Avx512` tests never take it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Isa {
    /// Portable Rust; the reference every SIMD kernel is tested against.
    Scalar,
    /// aarch64 Advanced SIMD: quantized dot products of Q8_0, Q4_0, Q4_1.
    Neon,
    /// AVX2 with FMA and F16C (Haswell, Zen 1 and later).
    Avx2,
    /// AVX-512 F and BW (plus the AVX2 set); integer dot products through
    /// `vpmaddubsw`/`vpmaddwd`.
    Avx512,
    /// AVX-512 with VNNI: integer dot products through `vpdpbusd`.
    Avx512Vnni,
}

impl Isa {
    /// Every level, lowest first.
    pub const ALL: [Isa; 5] = [
        Isa::Scalar,
        Isa::Neon,
        Isa::Avx2,
        Isa::Avx512,
        Isa::Avx512Vnni,
    ];

    /// Lower-case name, as accepted by [`ISA_ENV_VAR`].
    pub const fn name(self) -> &'static str {
        match self {
            Isa::Scalar => "scalar",
            Isa::Neon => "neon",
            Isa::Avx2 => "avx2",
            Isa::Avx512 => "avx512",
            Isa::Avx512Vnni => "avx512vnni",
        }
    }

    /// Parses [`Isa::name`] (case-insensitive).
    pub fn from_name(name: &str) -> Option<Isa> {
        Isa::ALL
            .into_iter()
            .find(|isa| isa.name().eq_ignore_ascii_case(name.trim()))
    }

    /// Whether this machine can run kernels of this level.
    pub fn is_supported(self) -> bool {
        match self {
            Isa::Scalar => true,
            #[cfg(target_arch = "aarch64")]
            Isa::Neon => std::arch::is_aarch64_feature_detected!("neon"),
            #[cfg(target_arch = "x86_64")]
            Isa::Avx2 => {
                is_x86_feature_detected!("avx2")
                    && is_x86_feature_detected!("fma")
                    && is_x86_feature_detected!("f16c")
            }
            #[cfg(target_arch = "x86_64")]
            Isa::Avx512 => {
                Isa::Avx2.is_supported()
                    && is_x86_feature_detected!("avx512f")
                    && is_x86_feature_detected!("avx512bw")
            }
            #[cfg(target_arch = "x86_64")]
            Isa::Avx512Vnni => Isa::Avx512.is_supported() && is_x86_feature_detected!("avx512vnni"),
            #[allow(unreachable_patterns)]
            _ => false,
        }
    }

    /// The most capable level this machine supports.
    pub fn detect() -> Isa {
        Isa::ALL
            .into_iter()
            .rev()
            .find(|isa| isa.is_supported())
            .unwrap_or(Isa::Scalar)
    }

    /// Every level this machine supports, lowest first.
    pub fn supported() -> Vec<Isa> {
        Isa::ALL
            .into_iter()
            .filter(|isa| isa.is_supported())
            .collect()
    }

    /// [`Isa::detect`], capped by [`ISA_ENV_VAR`] when it is set. An
    /// unknown value is ignored with a warning naming the accepted values.
    pub fn from_env() -> Isa {
        let detected = Isa::detect();
        match std::env::var(ISA_ENV_VAR) {
            Ok(value) => match Isa::from_name(&value) {
                Some(cap) => detected.min(cap),
                None => {
                    tracing::warn!(
                        "{ISA_ENV_VAR}={value:?} is not one of scalar, neon, avx2, avx512, avx512vnni; \
                         using the detected {}",
                        detected.name()
                    );
                    detected
                }
            },
            Err(_) => detected,
        }
    }
}

impl std::fmt::Display for Isa {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

/// An [`Isa`] this machine was checked to support. Kernels take this rather
/// than an `Isa` so that no caller can ask for instructions the CPU lacks.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct CheckedIsa(Isa);

impl CheckedIsa {
    /// The most capable supported level at or below `requested`.
    pub(crate) fn at_most(requested: Isa) -> CheckedIsa {
        let isa = Isa::ALL
            .into_iter()
            .rev()
            .find(|isa| *isa <= requested && isa.is_supported())
            .unwrap_or(Isa::Scalar);
        CheckedIsa(isa)
    }

    /// The checked level.
    pub(crate) fn get(self) -> Isa {
        self.0
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_round_trip() {
        for isa in Isa::ALL {
            assert_eq!(Isa::from_name(isa.name()), Some(isa));
        }
        assert_eq!(Isa::from_name("AVX2"), Some(Isa::Avx2));
        assert_eq!(Isa::from_name("NEON"), Some(Isa::Neon));
        assert_eq!(Isa::from_name("sse"), None);
    }

    #[test]
    fn checked_isa_never_exceeds_request_or_machine() {
        for isa in Isa::ALL {
            let checked = CheckedIsa::at_most(isa).get();
            assert!(checked <= isa);
            assert!(checked.is_supported());
        }
        assert_eq!(CheckedIsa::at_most(Isa::Scalar).get(), Isa::Scalar);
        assert_eq!(CheckedIsa::at_most(Isa::Avx512Vnni).get(), Isa::detect());
    }
}
