//! Golden tests against the Python `gguf` package (llama.cpp's gguf-py), an
//! independent implementation: fixtures and expected values are made by
//! `fixtures/make_gguf_fixtures.py` (see its docstring for how to rerun).

use std::path::PathBuf;

use privmix_models::gguf::{GgmlType, GgufFile, MetadataValue, dequantize};
use serde_json::{Value, json};

fn fixture(name: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fixtures")
        .join(name)
}

fn golden() -> Value {
    let text = std::fs::read_to_string(fixture("gguf_golden.json")).unwrap();
    serde_json::from_str(&text).unwrap()
}

fn f32_bits_le(bytes: &[u8]) -> Vec<u32> {
    bytes
        .chunks_exact(4)
        .map(|b| u32::from_le_bytes([b[0], b[1], b[2], b[3]]))
        .collect()
}

#[test]
fn dequantisation_matches_gguf_py_bit_for_bit() {
    let cases = golden()["dequant"].as_array().unwrap().clone();
    assert_eq!(cases.len(), 9);
    for case in cases {
        let name = case["type"].as_str().unwrap();
        let ty = GgmlType::from_id(case["type_id"].as_u64().unwrap() as u32).unwrap();
        assert_eq!(ty.name(), name);
        let n = case["n_elements"].as_u64().unwrap();
        let blocks = std::fs::read(fixture(&format!("dequant/{name}.blocks"))).unwrap();
        let want = f32_bits_le(&std::fs::read(fixture(&format!("dequant/{name}.f32"))).unwrap());
        let got: Vec<u32> = dequantize(ty, &blocks, n)
            .unwrap()
            .iter()
            .map(|v| v.to_bits())
            .collect();
        assert_eq!(got.len(), want.len(), "{name}");
        for (i, (g, w)) in got.iter().zip(&want).enumerate() {
            assert_eq!(
                g,
                w,
                "{name} element {i}: got {} want {}",
                f32::from_bits(*g),
                f32::from_bits(*w)
            );
        }
        // A truncated block is a typed error, not a panic.
        assert!(dequantize(ty, &blocks[..blocks.len() - 1], n).is_err());
    }
}

/// The fixture's typed JSON form of a metadata value.
fn typed_json(v: &MetadataValue) -> Value {
    let (ty, value) = match v {
        MetadataValue::U8(x) => ("UINT8", json!(x)),
        MetadataValue::I8(x) => ("INT8", json!(x)),
        MetadataValue::U16(x) => ("UINT16", json!(x)),
        MetadataValue::I16(x) => ("INT16", json!(x)),
        MetadataValue::U32(x) => ("UINT32", json!(x)),
        MetadataValue::I32(x) => ("INT32", json!(x)),
        MetadataValue::F32(x) => ("FLOAT32", json!(x.to_bits())),
        MetadataValue::Bool(x) => ("BOOL", json!(x)),
        MetadataValue::String(x) => ("STRING", json!(x)),
        MetadataValue::Array(xs) => ("ARRAY", Value::Array(xs.iter().map(typed_json).collect())),
        MetadataValue::U64(x) => ("UINT64", json!(x)),
        MetadataValue::I64(x) => ("INT64", json!(x)),
        MetadataValue::F64(x) => ("FLOAT64", json!(x.to_bits())),
        other => panic!("value type the fixture does not use: {other:?}"),
    };
    json!({ "type": ty, "value": value })
}

#[test]
fn tiny_files_written_by_gguf_py_parse_identically() {
    let g = golden();
    let files = g["gguf_files"].as_object().unwrap();
    assert_eq!(files.len(), 2);
    for (file_name, want) in files {
        let f = GgufFile::open(fixture(file_name)).unwrap();
        assert_eq!(f.version, 3);
        assert_eq!(
            f.alignment,
            want["alignment"].as_u64().unwrap(),
            "{file_name}"
        );
        assert_eq!(
            f.data_start,
            want["data_start"].as_u64().unwrap(),
            "{file_name}"
        );

        let want_meta = want["metadata"].as_object().unwrap();
        let got_keys: Vec<&str> = f.metadata.iter().map(|(k, _)| k.as_str()).collect();
        let want_keys: Vec<&str> = want_meta.keys().map(String::as_str).collect();
        let mut sorted = got_keys.clone();
        sorted.sort_unstable();
        assert_eq!(sorted, want_keys, "{file_name}: metadata keys");
        for (key, value) in &f.metadata {
            assert_eq!(&typed_json(value), &want_meta[key], "{file_name}: {key}");
        }

        let want_tensors = want["tensors"].as_array().unwrap();
        assert_eq!(f.tensors.len(), want_tensors.len());
        for (t, w) in f.tensors.iter().zip(want_tensors) {
            assert_eq!(t.name, w["name"].as_str().unwrap());
            let dims: Vec<u64> = w["dims"]
                .as_array()
                .unwrap()
                .iter()
                .map(|d| d.as_u64().unwrap())
                .collect();
            assert_eq!(t.dims, dims, "{}", t.name);
            assert_eq!(u64::from(t.ggml_type.id()), w["type_id"].as_u64().unwrap());
            assert_eq!(t.offset, w["offset"].as_u64().unwrap(), "{}", t.name);
            assert_eq!(t.n_bytes, w["n_bytes"].as_u64().unwrap(), "{}", t.name);
            let got: Vec<u64> = f
                .tensor_f32(&t.name)
                .unwrap()
                .iter()
                .map(|v| u64::from(v.to_bits()))
                .collect();
            let want_bits: Vec<u64> = w["values_f32_bits"]
                .as_array()
                .unwrap()
                .iter()
                .map(|v| v.as_u64().unwrap())
                .collect();
            assert_eq!(got, want_bits, "{file_name}: {}", t.name);
        }
    }
}

#[test]
fn every_truncation_of_the_tiny_file_is_a_typed_error() {
    let bytes = std::fs::read(fixture("tiny.gguf")).unwrap();
    for cut in 0..bytes.len() {
        let r = GgufFile::parse(bytes[..cut].to_vec());
        assert!(r.is_err(), "parsed a file cut at {cut} of {}", bytes.len());
    }
}
