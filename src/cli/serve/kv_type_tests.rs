//! `--kv-type`, `--kv-block` and the settings file's `kv_type` and
//! `kv_block` reach the executor's KV configuration, q8_0 included; a block
//! size that is not whole key blocks is refused; `--device` (and the
//! file's `device`) picks the backend and names an unknown one.

use clap::Parser;

use super::*;
use crate::cli::device::{Device, DeviceArgs};

#[derive(clap::Parser)]
struct Serve {
    #[command(flatten)]
    args: ServeArgs,
}

fn kv_type(argv: &[&str]) -> anyhow::Result<KvType> {
    let serve = Serve::try_parse_from(std::iter::once("serve").chain(argv.iter().copied()))?;
    Ok(settings(serve.args)?.executor.kv.dtype)
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

fn kv_block(argv: &[&str]) -> anyhow::Result<usize> {
    let serve = Serve::try_parse_from(std::iter::once("serve").chain(argv.iter().copied()))?;
    Ok(settings(serve.args)?.executor.kv.block_positions)
}

#[test]
fn the_block_size_comes_from_the_flag_or_the_file_in_whole_key_blocks() {
    assert_eq!(kv_block(&["--model", "/m/a.gguf"]).unwrap(), 1024);
    assert_eq!(
        kv_block(&["--model", "/m/a.gguf", "--kv-block", "64"]).unwrap(),
        64
    );
    for bad in ["48", "0", "lots"] {
        let err = kv_block(&["--model", "/m/a.gguf", "--kv-block", bad]).unwrap_err();
        assert!(err.to_string().contains(bad), "{bad}: {err}");
    }
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("serve.toml");
    std::fs::write(&path, "kv_block = 256\n[[models]]\npath = \"/m/a.gguf\"\n").unwrap();
    let config = path.to_str().unwrap();
    assert_eq!(kv_block(&["--config", config]).unwrap(), 256);
    std::fs::write(&path, "kv_block = 100\n[[models]]\npath = \"/m/a.gguf\"\n").unwrap();
    let err = kv_block(&["--config", config]).unwrap_err();
    assert!(err.to_string().contains("multiple of 32"), "{err}");
}

#[test]
fn generate_takes_q8_0() {
    #[derive(clap::Parser)]
    struct Generate {
        #[command(flatten)]
        device: DeviceArgs,
    }
    let g = Generate::try_parse_from(["generate", "--kv-type", "q8_0"]).unwrap();
    assert_eq!(g.device.kv_type, Some(KvType::Q8_0));
    assert_eq!(g.device.device, Device::Cpu);
    let err = Generate::try_parse_from(["generate", "--device", "gpu"])
        .err()
        .map(|e| e.to_string())
        .unwrap_or_default();
    assert!(
        err.contains("unknown device \"gpu\"; known: cpu, cuda"),
        "{err}"
    );
}

fn device(argv: &[&str]) -> anyhow::Result<Device> {
    let serve = Serve::try_parse_from(std::iter::once("serve").chain(argv.iter().copied()))?;
    Ok(settings(serve.args)?.device)
}

#[test]
fn serve_takes_the_device_from_the_flag_or_the_file_and_names_an_unknown_one() {
    assert_eq!(device(&["--model", "/m/a.gguf"]).unwrap(), Device::Cpu);
    assert_eq!(
        device(&["--model", "/m/a.gguf", "--device", "cpu"]).unwrap(),
        Device::Cpu
    );
    assert_eq!(
        device(&["--model", "/m/a.gguf", "--device", "cuda:1"]).unwrap(),
        Device::Cuda(1)
    );
    let err = device(&["--model", "/m/a.gguf", "--device", "tpu"]).unwrap_err();
    assert!(err.to_string().contains("unknown device \"tpu\""), "{err}");
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("serve.toml");
    std::fs::write(
        &path,
        "device = \"cpu\"\n[[models]]\npath = \"/m/a.gguf\"\n",
    )
    .unwrap();
    let config = path.to_str().unwrap();
    assert_eq!(device(&["--config", config]).unwrap(), Device::Cpu);
    std::fs::write(&path, "device = \"npu\"\n").unwrap();
    let err = device(&["--config", config]).unwrap_err();
    assert!(
        format!("{err:#}").contains("unknown device \"npu\""),
        "{err:#}"
    );
}

/// `--attention-precision` on serve (flag over file) and on the
/// one-model subcommands (generate, logits, eval); an unknown name is
/// refused naming the known ones.
#[test]
fn attention_precision_reaches_the_settings() {
    let attention = |argv: &[&str]| -> anyhow::Result<AttentionPrecision> {
        let serve = Serve::try_parse_from(std::iter::once("serve").chain(argv.iter().copied()))?;
        Ok(settings(serve.args)?.attention)
    };
    let model = ["--model", "/m/a.gguf"];
    assert_eq!(attention(&model).unwrap(), AttentionPrecision::default());
    let bf16 = [&model[..], &["--attention-precision", "bf16"]].concat();
    assert_eq!(attention(&bf16).unwrap(), AttentionPrecision::Bf16);
    let prompt = [&model[..], &["--attention-precision", "bf16-prompt"]].concat();
    assert_eq!(
        attention(&prompt).expect("bf16-prompt is a precision"),
        AttentionPrecision::Bf16Prompt
    );
    let split = [&model[..], &["--attention-precision", "bf16x3"]].concat();
    assert_eq!(
        attention(&split).expect("bf16x3 is a precision"),
        AttentionPrecision::Bf16x3
    );
    let err = attention(&[&model[..], &["--attention-precision", "fp8"]].concat()).unwrap_err();
    assert!(err.to_string().contains("known: f32, bf16"), "{err}");
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("serve.toml");
    std::fs::write(
        &path,
        "attention_precision = \"bf16\"\n[[models]]\npath = \"/m/a.gguf\"\n",
    )
    .unwrap();
    let config = path.to_str().unwrap();
    assert_eq!(
        attention(&["--config", config]).unwrap(),
        AttentionPrecision::Bf16
    );
    let flag = ["--config", config, "--attention-precision", "f32"];
    assert_eq!(attention(&flag).unwrap(), AttentionPrecision::F32);

    #[derive(clap::Parser)]
    struct Generate {
        #[command(flatten)]
        device: DeviceArgs,
    }
    let g = Generate::try_parse_from(["generate", "--attention-precision", "BF16"]).unwrap();
    assert_eq!(g.device.attention(), AttentionPrecision::Bf16);
    let g = Generate::try_parse_from(["generate"]).unwrap();
    assert_eq!(g.device.attention(), AttentionPrecision::default());
}
