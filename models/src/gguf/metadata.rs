//! GGUF metadata values: the thirteen value types of the GGUF specification
//! (<https://github.com/ggml-org/ggml/blob/master/docs/gguf.md>), including
//! strings and (nested) arrays.

use super::cursor::Cursor;
use super::error::GgufError;

/// Deepest nesting of arrays of arrays that the reader accepts. The format sets
/// no limit; this bound keeps the recursive parser's stack use small on hostile
/// input (real files nest at most one level: arrays of strings or numbers).
pub const MAX_ARRAY_NESTING: usize = 8;

/// One metadata value.
#[derive(Debug, Clone, PartialEq)]
#[non_exhaustive]
pub enum MetadataValue {
    /// `GGUF_METADATA_VALUE_TYPE_UINT8`.
    U8(u8),
    /// `INT8`.
    I8(i8),
    /// `UINT16`.
    U16(u16),
    /// `INT16`.
    I16(i16),
    /// `UINT32`.
    U32(u32),
    /// `INT32`.
    I32(i32),
    /// `FLOAT32`.
    F32(f32),
    /// `BOOL` (one byte; any nonzero value is read as `true`).
    Bool(bool),
    /// `STRING`: UTF-8.
    String(String),
    /// `ARRAY`: elements all of one type, possibly arrays themselves.
    Array(Vec<MetadataValue>),
    /// `UINT64`.
    U64(u64),
    /// `INT64`.
    I64(i64),
    /// `FLOAT64`.
    F64(f64),
}

impl MetadataValue {
    /// The value as a `u64` if it is a non-negative integer of any width.
    pub fn as_u64(&self) -> Option<u64> {
        match *self {
            Self::U8(v) => Some(v.into()),
            Self::U16(v) => Some(v.into()),
            Self::U32(v) => Some(v.into()),
            Self::U64(v) => Some(v),
            Self::I8(v) => u64::try_from(v).ok(),
            Self::I16(v) => u64::try_from(v).ok(),
            Self::I32(v) => u64::try_from(v).ok(),
            Self::I64(v) => u64::try_from(v).ok(),
            _ => None,
        }
    }

    /// The value as a string slice if it is a string.
    pub fn as_str(&self) -> Option<&str> {
        match self {
            Self::String(s) => Some(s),
            _ => None,
        }
    }
}

/// Smallest encoded size of a value of type `type_id` (the type id itself
/// excluded), used to bound array lengths before allocating. `None` for an
/// unknown type.
fn min_encoded_size(type_id: u32) -> Option<u64> {
    Some(match type_id {
        0 | 1 | 7 => 1,
        2 | 3 => 2,
        4..=6 => 4,
        10..=12 => 8,
        8 => 8,     // u64 length of an empty string
        9 => 4 + 8, // element type and count of an empty array
        _ => return None,
    })
}

/// Reads one value of type `type_id` (already consumed, at `type_offset`).
pub(crate) fn read_value(
    c: &mut Cursor<'_>,
    type_id: u32,
    type_offset: u64,
    depth: usize,
) -> Result<MetadataValue, GgufError> {
    const W: &str = "metadata value";
    Ok(match type_id {
        0 => MetadataValue::U8(c.u8(W)?),
        1 => MetadataValue::I8(c.u8(W)? as i8),
        2 => MetadataValue::U16(c.u16(W)?),
        3 => MetadataValue::I16(c.u16(W)? as i16),
        4 => MetadataValue::U32(c.u32(W)?),
        5 => MetadataValue::I32(c.u32(W)? as i32),
        6 => MetadataValue::F32(f32::from_bits(c.u32(W)?)),
        7 => MetadataValue::Bool(c.u8(W)? != 0),
        8 => MetadataValue::String(c.string("metadata string")?),
        9 => {
            if depth >= MAX_ARRAY_NESTING {
                return Err(GgufError::NestingTooDeep {
                    max: MAX_ARRAY_NESTING,
                    offset: type_offset,
                });
            }
            let elem_offset = c.position();
            let elem_type = c.u32("array element type")?;
            let min = min_encoded_size(elem_type).ok_or(GgufError::UnknownValueType {
                type_id: elem_type,
                offset: elem_offset,
            })?;
            let count = c.u64("array length")?;
            let count = c.check_count(count, min, "metadata array")?;
            let mut items = Vec::with_capacity(count);
            for _ in 0..count {
                items.push(read_value(c, elem_type, elem_offset, depth + 1)?);
            }
            MetadataValue::Array(items)
        }
        10 => MetadataValue::U64(c.u64(W)?),
        11 => MetadataValue::I64(c.u64(W)? as i64),
        12 => MetadataValue::F64(f64::from_bits(c.u64(W)?)),
        _ => {
            return Err(GgufError::UnknownValueType {
                type_id,
                offset: type_offset,
            });
        }
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(bytes: &[u8], type_id: u32) -> Result<MetadataValue, GgufError> {
        read_value(&mut Cursor::new(bytes), type_id, 0, 0)
    }

    #[test]
    fn scalars_are_little_endian() {
        assert_eq!(parse(&[0xfe], 1).unwrap(), MetadataValue::I8(-2));
        assert_eq!(parse(&[0x34, 0x12], 2).unwrap(), MetadataValue::U16(0x1234));
        assert_eq!(
            parse(&1.5f32.to_le_bytes(), 6).unwrap(),
            MetadataValue::F32(1.5)
        );
        assert_eq!(parse(&[2], 7).unwrap(), MetadataValue::Bool(true));
        assert!(matches!(
            parse(&[0; 8], 13),
            Err(GgufError::UnknownValueType { type_id: 13, .. })
        ));
    }

    #[test]
    fn nested_arrays_parse_and_depth_is_bounded() {
        // [[7u8, 8u8]]
        let mut b = 9u32.to_le_bytes().to_vec();
        b.extend(1u64.to_le_bytes());
        b.extend(0u32.to_le_bytes());
        b.extend(2u64.to_le_bytes());
        b.extend([7, 8]);
        let v = parse(&b, 9).unwrap();
        let inner = MetadataValue::Array(vec![MetadataValue::U8(7), MetadataValue::U8(8)]);
        assert_eq!(v, MetadataValue::Array(vec![inner]));

        let mut deep = Vec::new();
        for _ in 0..=MAX_ARRAY_NESTING {
            deep.extend(9u32.to_le_bytes());
            deep.extend(1u64.to_le_bytes());
        }
        deep.extend(0u32.to_le_bytes());
        deep.extend(0u64.to_le_bytes());
        assert!(matches!(
            parse(&deep, 9),
            Err(GgufError::NestingTooDeep { .. })
        ));
    }

    #[test]
    fn huge_array_length_is_refused_before_allocation() {
        let mut b = 10u32.to_le_bytes().to_vec();
        b.extend((u64::MAX / 4).to_le_bytes());
        assert!(matches!(parse(&b, 9), Err(GgufError::CountTooLarge { .. })));
    }
}
