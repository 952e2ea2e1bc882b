//! Which compiled image a GPU loads. The build embeds CUBINs for sm_80,
//! sm_89 and sm_90 and PTX for compute_90. A CUBIN runs on GPUs of its
//! major version with the same or a higher minor one (sm_80 on an A10's
//! 8.6); a GPU newer than every CUBIN JIT-compiles the PTX when its
//! version is at least the PTX's; anything else is compiled by NVRTC at
//! run time for the GPU itself.

/// One embedded image's target: `Sm(8, 9)` is a CUBIN for sm_89,
/// `Compute(9, 0)` PTX for compute_90.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Target {
    Sm(u32, u32),
    Compute(u32, u32),
}

impl Target {
    /// Parses `sm_89` / `compute_90`.
    pub fn parse(name: &str) -> Option<Target> {
        let (kind, digits) = name.split_once('_')?;
        let number: u32 = digits.parse().ok()?;
        let (major, minor) = (number / 10, number % 10);
        match kind {
            "sm" => Some(Target::Sm(major, minor)),
            "compute" => Some(Target::Compute(major, minor)),
            _ => None,
        }
    }
}

/// How a GPU of compute capability `major.minor` gets its kernels.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Choice {
    /// Load this embedded image.
    Embedded(Target),
    /// Compile the sources with NVRTC for `compute_<major><minor>`.
    Nvrtc,
}

/// The best of `available` for a GPU `major.minor`: the CUBIN of the same
/// major with the highest minor not above the GPU's, else the newest PTX
/// not above the GPU, else NVRTC.
pub fn choose(available: &[Target], major: u32, minor: u32) -> Choice {
    let cubin = available
        .iter()
        .filter_map(|t| match *t {
            Target::Sm(ma, mi) if ma == major && mi <= minor => Some((mi, *t)),
            _ => None,
        })
        .max_by_key(|(mi, _)| *mi);
    if let Some((_, t)) = cubin {
        return Choice::Embedded(t);
    }
    let ptx = available
        .iter()
        .filter_map(|t| match *t {
            Target::Compute(ma, mi) if (ma, mi) <= (major, minor) => Some(((ma, mi), *t)),
            _ => None,
        })
        .max_by_key(|(v, _)| *v);
    match ptx {
        Some((_, t)) => Choice::Embedded(t),
        None => Choice::Nvrtc,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const BUILT: [Target; 4] = [
        Target::Sm(8, 0),
        Target::Sm(8, 9),
        Target::Sm(9, 0),
        Target::Compute(9, 0),
    ];

    #[test]
    fn gpus_get_the_closest_image() {
        assert_eq!(choose(&BUILT, 8, 0), Choice::Embedded(Target::Sm(8, 0)));
        assert_eq!(choose(&BUILT, 8, 6), Choice::Embedded(Target::Sm(8, 0)));
        assert_eq!(choose(&BUILT, 8, 9), Choice::Embedded(Target::Sm(8, 9)));
        assert_eq!(choose(&BUILT, 9, 0), Choice::Embedded(Target::Sm(9, 0)));
        // Blackwell (10.0, 12.0) JIT-compiles the compute_90 PTX.
        assert_eq!(
            choose(&BUILT, 10, 0),
            Choice::Embedded(Target::Compute(9, 0))
        );
        assert_eq!(
            choose(&BUILT, 12, 0),
            Choice::Embedded(Target::Compute(9, 0))
        );
        // Nothing fits a Turing card; nothing is embedded in a build without nvcc.
        assert_eq!(choose(&BUILT, 7, 5), Choice::Nvrtc);
        assert_eq!(choose(&[], 9, 0), Choice::Nvrtc);
    }

    #[test]
    fn target_names_parse() {
        assert_eq!(Target::parse("sm_89"), Some(Target::Sm(8, 9)));
        assert_eq!(Target::parse("compute_90"), Some(Target::Compute(9, 0)));
        assert_eq!(Target::parse("sm_x"), None);
        assert_eq!(Target::parse("ptx_90"), None);
    }
}
