//! GGUF v2/v3 reader (<https://github.com/ggml-org/ggml/blob/master/docs/gguf.md>).
//!
//! Guarantee: [`GgufFile::parse`] never panics and never allocates for a size
//! it has not checked against the bytes present. Every count in the header is
//! bounded by `count × minimum item size ≤ remaining bytes`, every string
//! length by the remaining bytes, array nesting by [`MAX_ARRAY_NESTING`]; every
//! tensor's data range is computed with checked arithmetic and must lie inside
//! the file, start at a multiple of `general.alignment` and not overlap another
//! tensor's. A file that passes `parse` can be dequantised tensor by tensor
//! without further range checks failing.

mod cursor;
mod dequant;
mod error;
mod metadata;
mod types;

use std::borrow::Cow;
use std::collections::HashSet;
use std::fs::File;
use std::io::{Read, Seek, SeekFrom};
use std::path::Path;
use std::sync::{Arc, Mutex};

use cursor::Cursor;
pub use dequant::dequantize;
pub(crate) use dequant::f16_slice_to_f32;
pub use error::GgufError;
pub use metadata::{MAX_ARRAY_NESTING, MetadataValue};
pub use types::{GgmlType, QK_K};

/// The four bytes every GGUF file starts with.
pub const GGUF_MAGIC: [u8; 4] = *b"GGUF";
/// Alignment of the data section and of tensor offsets when the file does not
/// set `general.alignment`.
pub const GGUF_DEFAULT_ALIGNMENT: u64 = 32;
/// Most dimensions a ggml tensor may have (`GGML_MAX_DIMS`).
pub const GGML_MAX_DIMS: u32 = 4;

/// Smallest encoded metadata key/value pair: empty key (8), type id (4), u8 (1).
const MIN_KV_SIZE: u64 = 8 + 4 + 1;
/// Smallest encoded tensor info: empty name (8), n_dims (4), type (4), offset (8).
const MIN_TENSOR_INFO_SIZE: u64 = 8 + 4 + 4 + 8;

/// One entry of the tensor info table.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TensorInfo {
    /// Tensor name, e.g. `blk.0.attn_q.weight`.
    pub name: String,
    /// Dimensions in ggml order: `dims[0]` varies fastest (the row length).
    pub dims: Vec<u64>,
    /// Element type.
    pub ggml_type: GgmlType,
    /// Offset of the tensor's data relative to the start of the data section.
    pub offset: u64,
    /// Number of elements (product of `dims`), checked not to overflow.
    pub n_elements: u64,
    /// Number of bytes of data, checked to be whole blocks.
    pub n_bytes: u64,
}

/// A parsed GGUF file: its header, and its tensor data either in memory
/// ([`GgufFile::parse`]) or on disk, read one tensor at a time when asked for
/// ([`GgufFile::open`]).
#[derive(Debug, Clone)]
pub struct GgufFile {
    /// Format version (2 or 3).
    pub version: u32,
    /// Metadata key/value pairs in file order.
    pub metadata: Vec<(String, MetadataValue)>,
    /// Tensor infos in file order.
    pub tensors: Vec<TensorInfo>,
    /// `general.alignment`, or [`GGUF_DEFAULT_ALIGNMENT`].
    pub alignment: u64,
    /// Absolute offset of the data section.
    pub data_start: u64,
    data: Data,
}

/// Where a file's tensor data is.
#[derive(Debug, Clone)]
enum Data {
    /// The whole file, in memory.
    Bytes(Vec<u8>),
    /// The open file: a loader then holds one tensor's bytes at a time instead of
    /// the whole file beside the weights it builds from it (for SmolLM2's 94 MiB
    /// GGUF, that is the difference between 1.58× and 1.42× the f32 weights at the
    /// peak of a wgpu load).
    File {
        file: Arc<Mutex<File>>,
        path: String,
    },
}

/// Raw bytes read at a time by [`GgufFile::tensor_f32`] from an open file. (Tests
/// use a few blocks, so that a tensor takes several chunks.)
#[cfg(not(test))]
const DEQUANTISE_CHUNK: u64 = 1 << 20;
#[cfg(test)]
const DEQUANTISE_CHUNK: u64 = 16;

/// Bytes of a file read first for its header; the read doubles until the header
/// parses or the whole file has been read. (Tests start small, to exercise the
/// re-reads.)
#[cfg(not(test))]
const HEADER_PREFIX: u64 = 4 << 20;
#[cfg(test)]
const HEADER_PREFIX: u64 = 64;

impl GgufFile {
    /// Opens and parses the file at `path`. Only the header is read now; each
    /// tensor's bytes are read when [`GgufFile::tensor_bytes`] asks for them. The
    /// checks are those of [`GgufFile::parse`] on the whole file (every tensor range
    /// must lie inside the file's length), and the errors the same. Memory maps
    /// would need `unsafe`, which this workspace denies.
    pub fn open(path: impl AsRef<Path>) -> Result<Self, GgufError> {
        let path = path.as_ref();
        let shown = path.display().to_string();
        let io = io_error(&shown);
        let mut file = File::open(path).map_err(io)?;
        let file_len = file.metadata().map_err(io)?.len();
        // The header's size is not known before it is parsed: parse a prefix, and
        // retry on a longer one while the prefix was not the whole file (a count
        // that does not fit, or a field cut off, may be a prefix too short).
        let mut prefix = HEADER_PREFIX.min(file_len);
        let header = loop {
            let mut bytes = Vec::new();
            (&mut file)
                .take(prefix)
                .read_to_end(&mut bytes)
                .map_err(io)?;
            if (bytes.len() as u64) < prefix {
                return Err(io(std::io::ErrorKind::UnexpectedEof.into()));
            }
            match parse_header(&bytes, file_len) {
                Ok(header) => break header,
                Err(e) if prefix == file_len => return Err(e),
                Err(_) => {
                    prefix = prefix.saturating_mul(2).min(file_len);
                    file.seek(SeekFrom::Start(0)).map_err(io)?;
                }
            }
        };
        Ok(Self::from_header(
            header,
            Data::File {
                file: Arc::new(Mutex::new(file)),
                path: shown,
            },
        ))
    }

    /// Parses a whole GGUF file from its bytes.
    pub fn parse(bytes: Vec<u8>) -> Result<Self, GgufError> {
        let header = parse_header(&bytes, bytes.len() as u64)?;
        Ok(Self::from_header(header, Data::Bytes(bytes)))
    }

    fn from_header(header: Header, data: Data) -> Self {
        Self {
            version: header.version,
            metadata: header.metadata,
            tensors: header.tensors,
            alignment: header.alignment,
            data_start: header.data_start,
            data,
        }
    }

    /// The metadata value under `key`.
    pub fn metadata_value(&self, key: &str) -> Option<&MetadataValue> {
        self.metadata.iter().find(|(k, _)| k == key).map(|(_, v)| v)
    }

    /// The tensor info named `name`.
    pub fn tensor_info(&self, name: &str) -> Option<&TensorInfo> {
        self.tensors.iter().find(|t| t.name == name)
    }

    /// The raw bytes of tensor `name` (in range: checked by `parse` or `open`
    /// against the file's length), borrowed from memory or read from the file.
    pub fn tensor_bytes(&self, name: &str) -> Result<Cow<'_, [u8]>, GgufError> {
        let info = self
            .tensor_info(name)
            .ok_or_else(|| GgufError::MissingTensor(name.to_string()))?;
        // The header check made data_start + offset + n_bytes <= file length.
        let start = self.data_start + info.offset;
        match &self.data {
            Data::Bytes(bytes) => {
                let start = start as usize;
                Ok(Cow::Borrowed(&bytes[start..start + info.n_bytes as usize]))
            }
            Data::File { file, path } => {
                let n = usize::try_from(info.n_bytes).map_err(|_| GgufError::SizeOverflow {
                    what: format!("data of tensor {name:?}"),
                })?;
                let mut out = vec![0u8; n];
                read_at(file, path, start, &mut out)?;
                Ok(Cow::Owned(out))
            }
        }
    }

    /// Tensor `name` dequantised to `f32`, in ggml element order. From an open
    /// file the bytes are read and dequantised in chunks of whole blocks (about
    /// `DEQUANTISE_CHUNK` bytes), so no copy of the raw tensor is ever whole in
    /// memory beside its f32 values.
    pub fn tensor_f32(&self, name: &str) -> Result<Vec<f32>, GgufError> {
        let info = self
            .tensor_info(name)
            .ok_or_else(|| GgufError::MissingTensor(name.to_string()))?;
        let Data::File { file, path } = &self.data else {
            return dequantize(info.ggml_type, &self.tensor_bytes(name)?, info.n_elements);
        };
        let ty = info.ggml_type;
        if !ty.is_dequantisable() {
            return Err(GgufError::UnsupportedGgmlType(ty.name()));
        }
        let (block, block_bytes) = (ty.block_size() as u64, ty.type_size() as u64);
        // The header check made n_bytes = (n_elements / block) · block_bytes.
        let blocks_per_chunk = (DEQUANTISE_CHUNK / block_bytes).max(1);
        let n_blocks = info.n_bytes / block_bytes;
        let start = self.data_start + info.offset;
        let mut out = Vec::with_capacity(info.n_elements as usize);
        let mut bytes = Vec::new();
        let mut done = 0;
        while done < n_blocks {
            let blocks = blocks_per_chunk.min(n_blocks - done);
            bytes.resize((blocks * block_bytes) as usize, 0);
            read_at(file, path, start + done * block_bytes, &mut bytes)?;
            out.extend(dequantize(ty, &bytes, blocks * block)?);
            done += blocks;
        }
        Ok(out)
    }
}

/// An I/O error on the file shown as `path`, as a [`GgufError::Io`].
fn io_error(path: &str) -> impl Fn(std::io::Error) -> GgufError + Copy + '_ {
    move |e| GgufError::Io {
        path: path.to_string(),
        message: e.to_string(),
    }
}

/// Fills `out` with the file's bytes from `start` on. A file cut short since it was
/// opened is an I/O error here, never a panic.
fn read_at(file: &Mutex<File>, path: &str, start: u64, out: &mut [u8]) -> Result<(), GgufError> {
    // A poisoned lock only means another reader panicked mid-read; the seek below
    // resets the position, so the handle is still usable.
    let mut file = file.lock().unwrap_or_else(|e| e.into_inner());
    file.seek(SeekFrom::Start(start)).map_err(io_error(path))?;
    file.read_exact(out).map_err(io_error(path))
}

/// Everything before the data section.
struct Header {
    version: u32,
    metadata: Vec<(String, MetadataValue)>,
    tensors: Vec<TensorInfo>,
    alignment: u64,
    data_start: u64,
}

/// Parses the header at the start of `bytes` (the whole file, or a prefix of a file
/// of `file_len` bytes), checking every tensor's range against `file_len`.
fn parse_header(bytes: &[u8], file_len: u64) -> Result<Header, GgufError> {
    let mut c = Cursor::new(bytes);
    let magic = c.magic()?;
    if magic != GGUF_MAGIC {
        return Err(GgufError::BadMagic { found: magic });
    }
    let version = c.u32("version")?;
    if version != 2 && version != 3 {
        return Err(GgufError::UnsupportedVersion(version));
    }
    let n_tensors = c.u64("tensor count")?;
    let n_kv = c.u64("metadata count")?;

    let n_kv = c.check_count(n_kv, MIN_KV_SIZE, "metadata key/value pairs")?;
    let mut metadata = Vec::with_capacity(n_kv);
    let mut seen_keys = HashSet::with_capacity(n_kv);
    for _ in 0..n_kv {
        let key = c.string("metadata key")?;
        let type_offset = c.position();
        let type_id = c.u32("metadata value type")?;
        let value = metadata::read_value(&mut c, type_id, type_offset, 0)?;
        if !seen_keys.insert(key.clone()) {
            return Err(GgufError::Duplicate {
                what: "metadata key",
                name: key,
            });
        }
        metadata.push((key, value));
    }

    let alignment = match metadata.iter().find(|(k, _)| k == "general.alignment") {
        None => GGUF_DEFAULT_ALIGNMENT,
        Some((_, v)) => match v.as_u64() {
            Some(a) if a.is_power_of_two() => a,
            _ => return Err(GgufError::InvalidAlignment(format!("{v:?}"))),
        },
    };

    let n_tensors = c.check_count(n_tensors, MIN_TENSOR_INFO_SIZE, "tensor infos")?;
    let mut tensors = Vec::with_capacity(n_tensors);
    for _ in 0..n_tensors {
        tensors.push(read_tensor_info(&mut c)?);
    }

    let header_end = c.position();
    let data_start = header_end
        .checked_next_multiple_of(alignment)
        .ok_or_else(|| GgufError::SizeOverflow {
            what: "data section start".to_string(),
        })?;
    check_tensor_ranges(&tensors, alignment, data_start, file_len)?;
    Ok(Header {
        version,
        metadata,
        tensors,
        alignment,
        data_start,
    })
}

fn read_tensor_info(c: &mut Cursor<'_>) -> Result<TensorInfo, GgufError> {
    let name = c.string("tensor name")?;
    let n_dims = c.u32("tensor dimension count")?;
    if n_dims > GGML_MAX_DIMS {
        return Err(GgufError::TooManyDimensions {
            tensor: name,
            n_dims,
            max: GGML_MAX_DIMS,
        });
    }
    let mut dims = Vec::with_capacity(n_dims as usize);
    for _ in 0..n_dims {
        dims.push(c.u64("tensor dimension")?);
    }
    let type_id = c.u32("tensor type")?;
    let offset = c.u64("tensor offset")?;
    let ggml_type = GgmlType::from_id(type_id).ok_or_else(|| GgufError::UnknownGgmlType {
        type_id,
        tensor: name.clone(),
    })?;
    let n_elements = dims
        .iter()
        .try_fold(1u64, |acc, &d| acc.checked_mul(d))
        .ok_or_else(|| GgufError::SizeOverflow {
            what: format!("element count of tensor {name:?}"),
        })?;
    // ggml quantises along rows: the row length must be whole blocks.
    let block = ggml_type.block_size() as u64;
    let row = dims.first().copied().unwrap_or(1);
    if !row.is_multiple_of(block) {
        return Err(GgufError::NotWholeBlocks {
            what: format!("first dimension of tensor {name:?} ({})", ggml_type.name()),
            value: row,
            block,
        });
    }
    let n_bytes = ggml_type
        .byte_size(n_elements)
        .ok_or_else(|| GgufError::SizeOverflow {
            what: format!("byte size of tensor {name:?}"),
        })?;
    Ok(TensorInfo {
        name,
        dims,
        ggml_type,
        offset,
        n_elements,
        n_bytes,
    })
}

fn check_tensor_ranges(
    tensors: &[TensorInfo],
    alignment: u64,
    data_start: u64,
    file_len: u64,
) -> Result<(), GgufError> {
    let mut names = HashSet::with_capacity(tensors.len());
    let mut ranges = Vec::with_capacity(tensors.len());
    for (i, t) in tensors.iter().enumerate() {
        if !names.insert(t.name.as_str()) {
            return Err(GgufError::Duplicate {
                what: "tensor",
                name: t.name.clone(),
            });
        }
        if !t.offset.is_multiple_of(alignment) {
            return Err(GgufError::Misaligned {
                tensor: t.name.clone(),
                offset: t.offset,
                alignment,
            });
        }
        let overflow = || GgufError::SizeOverflow {
            what: format!("data range of tensor {:?}", t.name),
        };
        let start = data_start.checked_add(t.offset).ok_or_else(overflow)?;
        let end = start.checked_add(t.n_bytes).ok_or_else(overflow)?;
        if end > file_len {
            return Err(GgufError::OffsetOutOfRange {
                tensor: t.name.clone(),
                start,
                end,
                file_len,
            });
        }
        ranges.push((start, end, i));
    }
    ranges.sort_unstable();
    // Empty tensors occupy no bytes and overlap nothing; among the others, each
    // must start at or after the furthest end seen so far.
    let mut furthest: Option<(u64, usize)> = None;
    for &(start, end, i) in ranges.iter().filter(|(s, e, _)| e > s) {
        if let Some((prev_end, j)) = furthest
            && start < prev_end
        {
            return Err(GgufError::OverlappingTensors {
                first: tensors[j].name.clone(),
                second: tensors[i].name.clone(),
            });
        }
        if furthest.is_none_or(|(prev_end, _)| end > prev_end) {
            furthest = Some((end, i));
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests;
