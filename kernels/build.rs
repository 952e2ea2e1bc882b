//! With the `cuda` feature: embeds the CUDA kernels' CUBINs (sm_80, sm_89,
//! sm_90) and PTX (compute_90) in the crate, from
//! `$SWITCHYARD_CUDA_KERNELS_DIR` when set (scripts that built them
//! already), else by running scripts/build-cuda-kernels.sh (compile gate
//! included) with the toolkit of scripts/install-cuda-toolchain.sh or
//! `$SWITCHYARD_CUDA_ROOT`. Without a toolkit it embeds none and says so:
//! the kernels then compile with NVRTC at run time.
//!
//! Always: gives the tests an `OUT_DIR` to build their host harness in.

use std::path::{Path, PathBuf};
use std::process::Command;

const TARGETS: [(&str, &str); 4] = [
    ("sm_80", "cubin"),
    ("sm_89", "cubin"),
    ("sm_90", "cubin"),
    ("compute_90", "ptx"),
];

fn main() {
    println!("cargo:rerun-if-changed=build.rs");
    if std::env::var_os("CARGO_FEATURE_CUDA").is_none() {
        return;
    }
    println!("cargo:rerun-if-changed=cuda");
    println!("cargo:rerun-if-env-changed=SWITCHYARD_CUDA_KERNELS_DIR");
    println!("cargo:rerun-if-env-changed=SWITCHYARD_CUDA_ROOT");
    let manifest =
        PathBuf::from(std::env::var_os("CARGO_MANIFEST_DIR").expect("CARGO_MANIFEST_DIR"));
    let out = PathBuf::from(std::env::var_os("OUT_DIR").expect("OUT_DIR"));
    let mut modules: Vec<String> = std::fs::read_dir(manifest.join("cuda"))
        .expect("kernels/cuda")
        .filter_map(|e| {
            e.ok()?
                .file_name()
                .to_str()?
                .strip_suffix(".cu")
                .map(str::to_owned)
        })
        .collect();
    modules.sort();

    let dir = match std::env::var_os("SWITCHYARD_CUDA_KERNELS_DIR") {
        Some(dir) => Some(PathBuf::from(dir)),
        None => toolkit().map(|root| build(&manifest, &out, &root)),
    };
    let mut code = String::from("/// Embedded kernel images: (module, target, bytes).\n");
    code.push_str("pub(crate) static IMAGES: &[(&str, &str, &[u8])] = &[\n");
    match &dir {
        Some(dir) => {
            for m in &modules {
                for (target, ext) in TARGETS {
                    let file = dir.join(format!("{m}.{target}.{ext}"));
                    assert!(file.is_file(), "CUDA kernel image missing: {}", file.display());
                    code.push_str(&format!("    ({m:?}, {target:?}, include_bytes!({:?})),\n", file.display().to_string()));
                }
            }
        }
        None => println!(
            "cargo:warning=switchyard-kernels: no CUDA toolkit (scripts/install-cuda-toolchain.sh); no CUBINs embedded, the kernels compile with NVRTC at run time"
        ),
    }
    code.push_str("];\n");
    std::fs::write(out.join("cuda_images.rs"), code).expect("write cuda_images.rs");
}

/// The toolkit root (a folder with bin/nvcc), if installed.
fn toolkit() -> Option<PathBuf> {
    let root = match std::env::var_os("SWITCHYARD_CUDA_ROOT") {
        Some(root) => PathBuf::from(root),
        None => {
            let cache = std::env::var_os("XDG_CACHE_HOME")
                .map(PathBuf::from)
                .or_else(|| std::env::var_os("HOME").map(|h| Path::new(&h).join(".cache")))?;
            cache.join("switchyard/cuda-13.0/nvidia/cu13")
        }
    };
    root.join("bin/nvcc").is_file().then_some(root)
}

fn build(manifest: &Path, out: &Path, root: &Path) -> PathBuf {
    let dir = out.join("cuda-kernels");
    let script = manifest.join("../scripts/build-cuda-kernels.sh");
    let status = Command::new("bash")
        .arg(&script)
        .arg(&dir)
        .env("SWITCHYARD_CUDA_ROOT", root)
        .status()
        .expect("run scripts/build-cuda-kernels.sh");
    assert!(
        status.success(),
        "scripts/build-cuda-kernels.sh failed (see above)"
    );
    dir
}
