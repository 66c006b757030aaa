//! safetensors checkpoints (<https://github.com/huggingface/safetensors>):
//! one file, or shards listed by a `model.safetensors.index.json`.
//!
//! Header parsing and layout validation (offsets contiguous, inside the file,
//! sizes consistent with shape × dtype, header ≤ 100 MB) are the `safetensors`
//! crate's; this module adds conversion of F32/F16/BF16 tensors to `f32` (via
//! `half`, exact: every f16 and bf16 value is an f32), typed errors for
//! dtype/shape expectations, and the sharded index.

mod error;
mod sharded;

use std::path::Path;

use ::safetensors::{Dtype, SafeTensors, tensor::Metadata};
use half::bf16;

pub use ::safetensors::Dtype as SafetensorsDtype;
pub use error::SafetensorsError;
pub use sharded::ShardedSafetensors;

/// Bytes of the little-endian `u64` header length that starts every file.
const HEADER_LEN_BYTES: usize = 8;

/// One safetensors file held in memory, its header parsed and validated.
#[derive(Debug)]
pub struct SafetensorsFile {
    label: String,
    bytes: Vec<u8>,
    data_start: usize,
    metadata: Metadata,
}

impl SafetensorsFile {
    /// Reads and validates the file at `path`.
    pub fn open(path: impl AsRef<Path>) -> Result<Self, SafetensorsError> {
        let path = path.as_ref();
        let bytes = std::fs::read(path).map_err(|e| SafetensorsError::Io {
            path: path.display().to_string(),
            message: e.to_string(),
        })?;
        Self::from_bytes_labelled(bytes, path.display().to_string())
    }

    /// Validates a whole safetensors file given as bytes.
    pub fn from_bytes(bytes: Vec<u8>) -> Result<Self, SafetensorsError> {
        Self::from_bytes_labelled(bytes, "<memory>".to_string())
    }

    fn from_bytes_labelled(bytes: Vec<u8>, label: String) -> Result<Self, SafetensorsError> {
        let (header_len, metadata) =
            SafeTensors::read_metadata(&bytes).map_err(|e| SafetensorsError::Format {
                file: label.clone(),
                message: e.to_string(),
            })?;
        Ok(Self {
            label,
            data_start: HEADER_LEN_BYTES + header_len,
            bytes,
            metadata,
        })
    }

    /// Tensor names, sorted.
    pub fn names(&self) -> Vec<String> {
        let mut names: Vec<String> = self.metadata.tensors().into_keys().collect();
        names.sort();
        names
    }

    /// Dtype and shape of tensor `name`.
    pub fn info(&self, name: &str) -> Result<(Dtype, &[usize]), SafetensorsError> {
        let info = self
            .metadata
            .info(name)
            .ok_or_else(|| SafetensorsError::MissingTensor(name.to_string()))?;
        Ok((info.dtype, &info.shape))
    }

    /// Raw little-endian bytes of tensor `name`.
    pub fn tensor_bytes(&self, name: &str) -> Result<&[u8], SafetensorsError> {
        let info = self
            .metadata
            .info(name)
            .ok_or_else(|| SafetensorsError::MissingTensor(name.to_string()))?;
        let (begin, end) = info.data_offsets;
        // read_metadata validated the offsets against the buffer; `get` keeps
        // this panic-free regardless.
        self.bytes
            .get(self.data_start + begin..self.data_start + end)
            .ok_or_else(|| SafetensorsError::Format {
                file: self.label.clone(),
                message: format!("tensor {name:?} data out of range"),
            })
    }

    /// Tensor `name` as `f32` in row-major order, with its shape.
    pub fn tensor_f32(&self, name: &str) -> Result<(Vec<f32>, Vec<usize>), SafetensorsError> {
        let (dtype, shape) = self.info(name)?;
        let shape = shape.to_vec();
        let values = to_f32(name, dtype, self.tensor_bytes(name)?)?;
        Ok((values, shape))
    }

    /// Tensor `name` as `f32`, after checking it has exactly `shape`.
    pub fn tensor_f32_with_shape(
        &self,
        name: &str,
        shape: &[usize],
    ) -> Result<Vec<f32>, SafetensorsError> {
        check_shape(name, shape, self.info(name)?.1)?;
        Ok(self.tensor_f32(name)?.0)
    }

    /// Checks that tensor `name` has dtype `expected`.
    pub fn expect_dtype(&self, name: &str, expected: Dtype) -> Result<(), SafetensorsError> {
        let found = self.info(name)?.0;
        if found != expected {
            return Err(SafetensorsError::DtypeMismatch {
                tensor: name.to_string(),
                expected: expected.to_string(),
                found: found.to_string(),
            });
        }
        Ok(())
    }

    /// The free-form `__metadata__` map of the header, if any.
    pub fn user_metadata(&self) -> Option<&std::collections::HashMap<String, String>> {
        self.metadata.metadata().as_ref()
    }
}

pub(crate) fn check_shape(
    name: &str,
    expected: &[usize],
    found: &[usize],
) -> Result<(), SafetensorsError> {
    if expected != found {
        return Err(SafetensorsError::ShapeMismatch {
            tensor: name.to_string(),
            expected: expected.to_vec(),
            found: found.to_vec(),
        });
    }
    Ok(())
}

/// Converts little-endian F32/F16/BF16 bytes to `f32` (exactly).
fn to_f32(name: &str, dtype: Dtype, bytes: &[u8]) -> Result<Vec<f32>, SafetensorsError> {
    Ok(match dtype {
        Dtype::F32 => bytes
            .chunks_exact(4)
            .map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]]))
            .collect(),
        Dtype::F16 => crate::gguf::f16_slice_to_f32(bytes),
        Dtype::BF16 => bytes
            .chunks_exact(2)
            .map(|b| bf16::from_le_bytes([b[0], b[1]]).to_f32())
            .collect(),
        other => {
            return Err(SafetensorsError::UnsupportedDtype {
                tensor: name.to_string(),
                dtype: other.to_string(),
            });
        }
    })
}

#[cfg(test)]
mod tests;
