//! `--kv-type` and the settings file's `kv_type` reach the backend's KV
//! configuration, q8_0 included.

use clap::Parser;

use super::*;
use crate::cli::load::ThreadsArg;

#[derive(clap::Parser)]
struct Serve {
    #[command(flatten)]
    args: ServeArgs,
}

fn kv_type(argv: &[&str]) -> anyhow::Result<KvType> {
    let serve = Serve::try_parse_from(std::iter::once("serve").chain(argv.iter().copied()))?;
    Ok(settings(serve.args)?.kv.dtype)
}

#[test]
fn the_flag_takes_every_type() {
    for (name, want) in [
        ("q8_0", KvType::Q8_0),
        ("f32", KvType::F32),
        ("F16", KvType::F16),
    ] {
        let got = kv_type(&["--model", "/m/a.gguf", "--kv-type", name]).unwrap();
        assert_eq!(got, want, "{name}");
    }
    let err = kv_type(&["--model", "/m/a.gguf", "--kv-type", "q4_0"]).unwrap_err();
    assert!(err.to_string().contains("q8_0"), "{err}");
}

#[test]
fn the_settings_file_takes_q8_0_and_the_flag_overrides_it() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("serve.toml");
    std::fs::write(
        &path,
        "kv_type = \"q8_0\"\n[[models]]\npath = \"/m/a.gguf\"\n",
    )
    .unwrap();
    let config = path.to_str().unwrap();
    assert_eq!(kv_type(&["--config", config]).unwrap(), KvType::Q8_0);
    assert_eq!(
        kv_type(&["--config", config, "--kv-type", "f16"]).unwrap(),
        KvType::F16
    );
    std::fs::write(&path, "kv_type = \"q8\"\n").unwrap();
    assert!(kv_type(&["--config", config]).is_err());
}

#[test]
fn generate_takes_q8_0() {
    #[derive(clap::Parser)]
    struct Generate {
        #[command(flatten)]
        threads: ThreadsArg,
    }
    let g = Generate::try_parse_from(["generate", "--kv-type", "q8_0"]).unwrap();
    assert_eq!(g.threads.kv_type, Some(KvType::Q8_0));
}
