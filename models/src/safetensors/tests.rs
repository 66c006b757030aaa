//! Unit tests: values written with the `safetensors` crate's serializer are
//! checked against hand-written expectations (exact f16/bf16 values).

use std::collections::HashMap;

use ::safetensors::{Dtype, serialize, tensor::TensorView};
use half::{bf16, f16};

use super::*;

fn le<T: Copy, const N: usize>(xs: &[T], to: impl Fn(T) -> [u8; N]) -> Vec<u8> {
    xs.iter().flat_map(|&x| to(x)).collect()
}

pub(crate) fn sample_file() -> Vec<u8> {
    let a = le(&[1.0f32, -2.5, 3.25, 0.0, 1e-3, 7.0], f32::to_le_bytes);
    let b = le(
        &[
            f16::from_f32(0.5),
            f16::from_f32(-65504.0),
            f16::from_bits(1),
        ],
        f16::to_le_bytes,
    );
    let c = le(
        &[bf16::from_f32(1.0), bf16::from_bits(0x4049)],
        bf16::to_le_bytes,
    );
    let i = le(&[5i32], i32::to_le_bytes);
    let tensors = vec![
        ("a", TensorView::new(Dtype::F32, vec![2, 3], &a).unwrap()),
        ("b", TensorView::new(Dtype::F16, vec![3], &b).unwrap()),
        ("c", TensorView::new(Dtype::BF16, vec![1, 2], &c).unwrap()),
        ("i", TensorView::new(Dtype::I32, vec![1], &i).unwrap()),
    ];
    let meta = HashMap::from([("format".to_string(), "pt".to_string())]);
    serialize(tensors, Some(meta)).unwrap()
}

#[test]
fn reads_f32_f16_bf16_exactly() {
    let f = SafetensorsFile::from_bytes(sample_file()).unwrap();
    assert_eq!(f.names(), ["a", "b", "c", "i"]);
    let (a, shape) = f.tensor_f32("a").unwrap();
    assert_eq!(shape, [2, 3]);
    assert_eq!(a, [1.0, -2.5, 3.25, 0.0, 1e-3, 7.0]);
    // f16 bits 1 is the smallest subnormal, 2^-24.
    assert_eq!(
        f.tensor_f32("b").unwrap().0,
        [0.5, -65504.0, 2f32.powi(-24)]
    );
    // bf16 0x4049 is the top half of f32 0x40490000 = 3.140625.
    assert_eq!(f.tensor_f32("c").unwrap().0, [1.0, 3.140625]);
    assert_eq!(
        f.user_metadata().unwrap().get("format").map(String::as_str),
        Some("pt")
    );
}

#[test]
fn typed_errors_for_missing_dtype_and_shape() {
    let f = SafetensorsFile::from_bytes(sample_file()).unwrap();
    assert_eq!(
        f.tensor_f32("nope"),
        Err(SafetensorsError::MissingTensor("nope".into()))
    );
    assert!(matches!(
        f.tensor_f32("i"),
        Err(SafetensorsError::UnsupportedDtype { .. })
    ));
    assert!(matches!(
        f.tensor_f32_with_shape("a", &[3, 2]),
        Err(SafetensorsError::ShapeMismatch { .. })
    ));
    assert_eq!(f.tensor_f32_with_shape("a", &[2, 3]).unwrap().len(), 6);
    assert!(matches!(
        f.expect_dtype("b", Dtype::BF16),
        Err(SafetensorsError::DtypeMismatch { .. })
    ));
    assert!(f.expect_dtype("b", Dtype::F16).is_ok());
}

#[test]
fn corrupt_files_are_format_errors() {
    let bytes = sample_file();
    for cut in [0, 4, 8, 20, bytes.len() - 1] {
        assert!(matches!(
            SafetensorsFile::from_bytes(bytes[..cut].to_vec()),
            Err(SafetensorsError::Format { .. })
        ));
    }
    let mut huge = bytes.clone();
    huge[..8].copy_from_slice(&u64::MAX.to_le_bytes());
    assert!(SafetensorsFile::from_bytes(huge).is_err());
}
