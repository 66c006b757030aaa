//! A bounds-checked little-endian cursor over the bytes of a GGUF file.
//!
//! Every read checks the remaining length first and returns
//! [`GgufError::Truncated`]; [`Cursor::check_count`] lets callers refuse a
//! declared element count before allocating for it.

use super::error::GgufError;

/// Reads little-endian fields from a byte slice, never past its end.
pub(crate) struct Cursor<'a> {
    bytes: &'a [u8],
    pos: usize,
}

impl<'a> Cursor<'a> {
    pub(crate) fn new(bytes: &'a [u8]) -> Self {
        Self { bytes, pos: 0 }
    }

    pub(crate) fn position(&self) -> u64 {
        self.pos as u64
    }

    pub(crate) fn remaining(&self) -> u64 {
        (self.bytes.len() - self.pos) as u64
    }

    /// The next `n` bytes, or a `Truncated` error naming `what`.
    pub(crate) fn take(&mut self, n: u64, what: &'static str) -> Result<&'a [u8], GgufError> {
        if n > self.remaining() {
            return Err(GgufError::Truncated {
                what,
                offset: self.position(),
                needed: n,
                len: self.bytes.len() as u64,
            });
        }
        // n <= remaining <= usize::MAX, so the cast is exact.
        let n = n as usize;
        let out = &self.bytes[self.pos..self.pos + n];
        self.pos += n;
        Ok(out)
    }

    fn array<const N: usize>(&mut self, what: &'static str) -> Result<[u8; N], GgufError> {
        let mut out = [0u8; N];
        out.copy_from_slice(self.take(N as u64, what)?);
        Ok(out)
    }

    pub(crate) fn u8(&mut self, what: &'static str) -> Result<u8, GgufError> {
        Ok(self.array::<1>(what)?[0])
    }
    pub(crate) fn u16(&mut self, what: &'static str) -> Result<u16, GgufError> {
        Ok(u16::from_le_bytes(self.array(what)?))
    }
    pub(crate) fn u32(&mut self, what: &'static str) -> Result<u32, GgufError> {
        Ok(u32::from_le_bytes(self.array(what)?))
    }
    pub(crate) fn u64(&mut self, what: &'static str) -> Result<u64, GgufError> {
        Ok(u64::from_le_bytes(self.array(what)?))
    }
    pub(crate) fn magic(&mut self) -> Result<[u8; 4], GgufError> {
        self.array("magic")
    }

    /// A GGUF string: `u64` byte length, then UTF-8 bytes. The length is
    /// checked against the remaining input before anything is allocated.
    pub(crate) fn string(&mut self, what: &'static str) -> Result<String, GgufError> {
        let len = self.u64(what)?;
        let offset = self.position();
        let bytes = self.take(len, what)?;
        String::from_utf8(bytes.to_vec()).map_err(|_| GgufError::InvalidUtf8 { offset })
    }

    /// Refuses `count` items if even at `min_item_size` bytes each they could
    /// not fit in the remaining input; on success, `count` fits in `usize`.
    pub(crate) fn check_count(
        &self,
        count: u64,
        min_item_size: u64,
        what: &'static str,
    ) -> Result<usize, GgufError> {
        let fits = count
            .checked_mul(min_item_size)
            .is_some_and(|total| total <= self.remaining());
        if !fits {
            return Err(GgufError::CountTooLarge {
                what,
                count,
                min_item_size,
                remaining: self.remaining(),
                offset: self.position(),
            });
        }
        usize::try_from(count).map_err(|_| GgufError::SizeOverflow {
            what: what.to_string(),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_little_endian_and_stops_at_the_end() {
        let bytes = [1, 0, 2, 0, 0, 0, 9];
        let mut c = Cursor::new(&bytes);
        assert_eq!(c.u16("a").unwrap(), 1);
        assert_eq!(c.u32("b").unwrap(), 2);
        assert!(matches!(
            c.u16("c"),
            Err(GgufError::Truncated {
                offset: 6,
                needed: 2,
                len: 7,
                ..
            })
        ));
        assert_eq!(c.u8("d").unwrap(), 9);
    }

    #[test]
    fn string_length_is_checked_before_allocating() {
        let mut bytes = u64::MAX.to_le_bytes().to_vec();
        bytes.extend_from_slice(b"abc");
        let mut c = Cursor::new(&bytes);
        assert!(matches!(c.string("key"), Err(GgufError::Truncated { .. })));
    }

    #[test]
    fn check_count_refuses_counts_that_cannot_fit() {
        let bytes = [0u8; 100];
        let c = Cursor::new(&bytes);
        assert_eq!(c.check_count(10, 10, "x").unwrap(), 10);
        assert!(c.check_count(11, 10, "x").is_err());
        assert!(c.check_count(u64::MAX, 2, "x").is_err());
    }
}
