//! GgufWriter → GgufFile round trips: every metadata type, nested arrays,
//! alignment, tensor placement and zero-copy data.
#![allow(clippy::unwrap_used)] // a test: a failed unwrap is a failed test

use switchyard_engine::formats::gguf::{GgufFile, GgufWriter, MetaValue};
use switchyard_kernels::quantize::quantize;
use switchyard_kernels::DType;

fn every_value_type() -> Vec<(&'static str, MetaValue)> {
    use MetaValue::*;
    vec![
        ("u8", U8(200)),
        ("i8", I8(-100)),
        ("u16", U16(60_000)),
        ("i16", I16(-30_000)),
        ("u32", U32(4_000_000_000)),
        ("i32", I32(-2_000_000_000)),
        ("u64", U64(u64::MAX)),
        ("i64", I64(i64::MIN)),
        ("f32", F32(1.5e-5)),
        ("f64", F64(-2.25)),
        ("bool", Bool(true)),
        ("string", String("héllo ✓".into())),
        ("empty", Array(vec![])),
        (
            "strings",
            Array(vec![String("a".into()), String(std::string::String::new())]),
        ),
        (
            "nested",
            Array(vec![
                Array(vec![I32(1), I32(2)]),
                Array(vec![]),
                Array(vec![I32(3)]),
            ]),
        ),
    ]
}

#[test]
fn metadata_and_tensors_round_trip() {
    for alignment in [32u32, 64, 1] {
        let mut w = GgufWriter::new("roundtrip.gguf");
        if alignment != 32 {
            w.set_alignment(alignment).unwrap();
        }
        for (k, v) in every_value_type() {
            w.add_metadata(k, v);
        }
        let values: Vec<f32> = (0..512).map(|i| (i as f32 * 0.37).sin()).collect();
        let q = quantize(DType::Q6K, &values).unwrap();
        w.add_tensor("m", DType::Q6K, &[2, 256], q.clone().into())
            .unwrap();
        let v = quantize(DType::F32, &values[..7]).unwrap();
        w.add_tensor("v", DType::F32, &[7], v.clone().into())
            .unwrap();
        let t = quantize(DType::F16, &values[..24]).unwrap();
        w.add_tensor("t", DType::F16, &[2, 3, 4], t.clone().into())
            .unwrap();

        let file = GgufFile::parse(&w.to_bytes().unwrap()).unwrap();
        assert_eq!(file.version(), 3);
        assert_eq!(file.alignment(), u64::from(alignment));
        for (k, v) in every_value_type() {
            let got = file.metadata().get(k);
            // An empty array reads back as an empty array whatever its type.
            assert_eq!(got, Some(&v), "{k}");
        }
        for (name, bytes, shape) in [
            ("m", &q, vec![2, 256]),
            ("v", &v, vec![7]),
            ("t", &t, vec![2, 3, 4]),
        ] {
            let info = &file.tensors()[name];
            assert_eq!(info.offset % u64::from(alignment), 0);
            let data = file.tensor_data(name).unwrap();
            assert_eq!(
                (&data.shape, &data.data[..]),
                (&shape, &bytes[..]),
                "{name}"
            );
        }
    }
}

#[test]
fn writer_refuses_inconsistent_tensors() {
    let mut w = GgufWriter::new("bad.gguf");
    let err = w
        .add_tensor("short", DType::Q8_0, &[1, 32], vec![0u8; 33].into())
        .unwrap_err();
    assert!(err.to_string().contains("short") && err.to_string().contains("bad.gguf"));
    assert!(w
        .add_tensor("ragged", DType::Q8_0, &[2, 16], vec![0u8; 34].into())
        .is_err());
    assert!(w
        .add_tensor("empty", DType::F32, &[], vec![].into())
        .is_err());
    w.add_tensor("ok", DType::F32, &[1], vec![0u8; 4].into())
        .unwrap();
    assert!(w
        .add_tensor("ok", DType::F32, &[1], vec![0u8; 4].into())
        .is_err());
    assert!(w.set_alignment(48).is_err());
    w.add_metadata(
        "mixed",
        MetaValue::Array(vec![MetaValue::U8(1), MetaValue::I8(1)]),
    );
    assert!(w.to_bytes().is_err());
}

#[test]
fn opening_a_written_file_maps_it() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("mapped.gguf");
    let mut w = GgufWriter::new(&path);
    w.add_metadata("general.architecture", MetaValue::String("llama".into()));
    let bytes = quantize(DType::BF16, &[1.0, 2.0, 3.0, 4.0]).unwrap();
    w.add_tensor("x", DType::BF16, &[4], bytes.clone().into())
        .unwrap();
    w.write().unwrap();
    let file = GgufFile::open(&path).unwrap();
    assert_eq!(file.path(), path);
    assert_eq!(&file.tensor_data("x").unwrap().data[..], &bytes[..]);
    let err = file.tensor_data("y").unwrap_err();
    assert!(err.to_string().contains("'y'"), "{err}");
}
