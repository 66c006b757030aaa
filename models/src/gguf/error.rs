//! Typed errors of the GGUF reader and of dequantisation.

use thiserror::Error;

/// Everything that can be wrong with a GGUF file or with a tensor handed to the
/// dequantiser. Each variant names the problem and where it was found; the
/// reader never panics and never allocates on a size it has not checked against
/// the bytes actually present.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
#[non_exhaustive]
pub enum GgufError {
    /// The input ends before a field that the header declares.
    #[error(
        "truncated: needed {needed} bytes at offset {offset} for {what}, but the file has {len}"
    )]
    Truncated {
        /// What was being read.
        what: &'static str,
        /// Byte offset at which it starts.
        offset: u64,
        /// How many bytes it needs.
        needed: u64,
        /// Total length of the input.
        len: u64,
    },
    /// The first four bytes are not `GGUF`.
    #[error("bad magic {found:02x?}: not a GGUF file (expected \"GGUF\")")]
    BadMagic {
        /// The four bytes found.
        found: [u8; 4],
    },
    /// A GGUF version other than 2 or 3.
    #[error("unsupported GGUF version {0} (this reader accepts 2 and 3)")]
    UnsupportedVersion(u32),
    /// A metadata value type id that the GGUF specification does not define.
    #[error("unknown metadata value type {type_id} at offset {offset}")]
    UnknownValueType {
        /// The raw type id.
        type_id: u32,
        /// Byte offset of the type id.
        offset: u64,
    },
    /// Arrays of arrays nested deeper than [`crate::gguf::MAX_ARRAY_NESTING`].
    #[error("metadata arrays nested deeper than {max} at offset {offset}")]
    NestingTooDeep {
        /// The limit.
        max: usize,
        /// Byte offset of the array that went too deep.
        offset: u64,
    },
    /// A string that is not UTF-8.
    #[error("string at offset {offset} is not valid UTF-8")]
    InvalidUtf8 {
        /// Byte offset of the string's bytes.
        offset: u64,
    },
    /// A count declared in the header cannot fit in the remaining bytes even if
    /// every item had its minimum encoded size.
    #[error(
        "{what}: {count} items of at least {min_item_size} bytes each cannot fit in the {remaining} bytes left at offset {offset}"
    )]
    CountTooLarge {
        /// What is being counted.
        what: &'static str,
        /// The declared count.
        count: u64,
        /// Minimum encoded size of one item.
        min_item_size: u64,
        /// Bytes left in the input.
        remaining: u64,
        /// Byte offset of the count.
        offset: u64,
    },
    /// A ggml tensor type id that ggml does not define.
    #[error("unknown ggml type id {type_id} for tensor {tensor:?}")]
    UnknownGgmlType {
        /// The raw type id.
        type_id: u32,
        /// The tensor's name.
        tensor: String,
    },
    /// A ggml type that the file may hold but that this crate cannot dequantise.
    #[error("dequantisation of ggml type {0} is not supported")]
    UnsupportedGgmlType(&'static str),
    /// A tensor with more dimensions than ggml allows.
    #[error("tensor {tensor:?} has {n_dims} dimensions; ggml allows at most {max}")]
    TooManyDimensions {
        /// The tensor's name.
        tensor: String,
        /// The declared number of dimensions.
        n_dims: u32,
        /// The limit.
        max: u32,
    },
    /// A product or sum of declared sizes overflows `u64`.
    #[error("size overflow computing {what}")]
    SizeOverflow {
        /// The quantity being computed.
        what: String,
    },
    /// A tensor's element count (or first dimension) is not a multiple of its
    /// type's block size, or a byte length is not a whole number of blocks.
    #[error("{what}: {value} is not a multiple of the block size {block}")]
    NotWholeBlocks {
        /// What was checked.
        what: String,
        /// The offending value.
        value: u64,
        /// The block size.
        block: u64,
    },
    /// `general.alignment` is zero, not a power of two, or not an integer.
    #[error("invalid general.alignment: {0}")]
    InvalidAlignment(String),
    /// A tensor's offset is not a multiple of the file's alignment.
    #[error("tensor {tensor:?} offset {offset} is not a multiple of the alignment {alignment}")]
    Misaligned {
        /// The tensor's name.
        tensor: String,
        /// Its offset relative to the data section.
        offset: u64,
        /// The file's alignment.
        alignment: u64,
    },
    /// A tensor's data range ends past the end of the file.
    #[error(
        "tensor {tensor:?} data [{start}, {end}) lies outside the data section, which ends at {file_len}"
    )]
    OffsetOutOfRange {
        /// The tensor's name.
        tensor: String,
        /// Absolute start of its data.
        start: u64,
        /// Absolute end of its data.
        end: u64,
        /// Length of the file.
        file_len: u64,
    },
    /// Two tensors' data ranges overlap.
    #[error("tensors {first:?} and {second:?} have overlapping data")]
    OverlappingTensors {
        /// The tensor that starts first.
        first: String,
        /// The tensor whose data starts inside the first's.
        second: String,
    },
    /// Two metadata keys or two tensors with the same name.
    #[error("duplicate {what} {name:?}")]
    Duplicate {
        /// "metadata key" or "tensor".
        what: &'static str,
        /// The repeated name.
        name: String,
    },
    /// No tensor of that name.
    #[error("no tensor named {0:?}")]
    MissingTensor(String),
    /// The file could not be read.
    #[error("I/O error reading {path}: {message}")]
    Io {
        /// The path.
        path: String,
        /// The operating system's message.
        message: String,
    },
}
