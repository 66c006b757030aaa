//! ggml tensor types: ids, block sizes and block byte sizes.
//!
//! The table is ggml's `type_traits` (`ggml/src/ggml.c`), as mirrored by
//! `GGML_QUANT_SIZES` in the Python `gguf` package (`gguf/constants.py`). Every
//! type ggml defines is known here so that the reader can check the data range
//! of any tensor; only some of them can be dequantised (see
//! [`GgmlType::is_dequantisable`]).

/// Elements in one super-block of the k-quants (`QK_K` in ggml).
pub const QK_K: usize = 256;

macro_rules! ggml_types {
    ($( $variant:ident = $id:literal, $name:literal, $block:expr, $bytes:expr; )*) => {
        /// A ggml tensor element type, as stored in a GGUF tensor info.
        #[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
        #[non_exhaustive]
        #[allow(non_camel_case_types)]
        pub enum GgmlType {
            $(
                #[doc = concat!("ggml `GGML_TYPE_", $name, "` (id ", stringify!($id), ").")]
                $variant,
            )*
        }

        impl GgmlType {
            /// The type with ggml id `id`, or `None` if ggml defines no such id.
            pub fn from_id(id: u32) -> Option<Self> {
                match id {
                    $( $id => Some(Self::$variant), )*
                    _ => None,
                }
            }

            /// ggml's numeric id of this type.
            pub fn id(self) -> u32 {
                match self { $( Self::$variant => $id, )* }
            }

            /// ggml's name of this type.
            pub fn name(self) -> &'static str {
                match self { $( Self::$variant => $name, )* }
            }

            /// Elements per block.
            pub fn block_size(self) -> usize {
                match self { $( Self::$variant => $block, )* }
            }

            /// Bytes per block.
            pub fn type_size(self) -> usize {
                match self { $( Self::$variant => $bytes, )* }
            }
        }
    };
}

ggml_types! {
    F32 = 0, "F32", 1, 4;
    F16 = 1, "F16", 1, 2;
    Q4_0 = 2, "Q4_0", 32, 2 + 16;
    Q4_1 = 3, "Q4_1", 32, 2 + 2 + 16;
    Q5_0 = 6, "Q5_0", 32, 2 + 4 + 16;
    Q5_1 = 7, "Q5_1", 32, 2 + 2 + 4 + 16;
    Q8_0 = 8, "Q8_0", 32, 2 + 32;
    Q8_1 = 9, "Q8_1", 32, 4 + 4 + 32;
    Q2_K = 10, "Q2_K", QK_K, 2 + 2 + QK_K / 16 + QK_K / 4;
    Q3_K = 11, "Q3_K", QK_K, 2 + QK_K / 4 + QK_K / 8 + 12;
    Q4_K = 12, "Q4_K", QK_K, 2 + 2 + QK_K / 2 + 12;
    Q5_K = 13, "Q5_K", QK_K, 2 + 2 + QK_K / 2 + QK_K / 8 + 12;
    Q6_K = 14, "Q6_K", QK_K, 2 + QK_K / 2 + QK_K / 4 + QK_K / 16;
    Q8_K = 15, "Q8_K", QK_K, 4 + QK_K + QK_K / 8;
    IQ2_XXS = 16, "IQ2_XXS", QK_K, 2 + QK_K / 4;
    IQ2_XS = 17, "IQ2_XS", QK_K, 2 + QK_K / 4 + QK_K / 32;
    IQ3_XXS = 18, "IQ3_XXS", QK_K, 2 + QK_K / 4 + QK_K / 8;
    IQ1_S = 19, "IQ1_S", QK_K, 2 + QK_K / 8 + QK_K / 16;
    IQ4_NL = 20, "IQ4_NL", 32, 2 + 16;
    IQ3_S = 21, "IQ3_S", QK_K, 2 + QK_K / 4 + QK_K / 8 + QK_K / 32 + 4;
    IQ2_S = 22, "IQ2_S", QK_K, 2 + QK_K / 4 + QK_K / 16;
    IQ4_XS = 23, "IQ4_XS", QK_K, 2 + 2 + QK_K / 2 + QK_K / 64;
    I8 = 24, "I8", 1, 1;
    I16 = 25, "I16", 1, 2;
    I32 = 26, "I32", 1, 4;
    I64 = 27, "I64", 1, 8;
    F64 = 28, "F64", 1, 8;
    IQ1_M = 29, "IQ1_M", QK_K, QK_K / 8 + QK_K / 16 + QK_K / 32;
    BF16 = 30, "BF16", 1, 2;
    TQ1_0 = 34, "TQ1_0", QK_K, 2 + 4 * 13;
    TQ2_0 = 35, "TQ2_0", QK_K, 2 + 64;
    MXFP4 = 39, "MXFP4", 32, 1 + 16;
}

impl GgmlType {
    /// Whether [`crate::gguf::dequantize`] can turn this type into `f32`.
    pub fn is_dequantisable(self) -> bool {
        matches!(
            self,
            Self::F32
                | Self::F16
                | Self::BF16
                | Self::Q8_0
                | Self::Q4_0
                | Self::Q4_1
                | Self::Q5_0
                | Self::Q4_K
                | Self::Q6_K
        )
    }

    /// Bytes taken by `n_elements` elements of this type: `None` if the count
    /// is not a whole number of blocks or the product overflows.
    pub fn byte_size(self, n_elements: u64) -> Option<u64> {
        let block = self.block_size() as u64;
        if !n_elements.is_multiple_of(block) {
            return None;
        }
        (n_elements / block).checked_mul(self.type_size() as u64)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ids_round_trip_and_unknown_ids_are_none() {
        for id in 0..64 {
            if let Some(t) = GgmlType::from_id(id) {
                assert_eq!(t.id(), id);
            }
        }
        assert_eq!(GgmlType::from_id(4), None); // removed Q4_2
        assert_eq!(GgmlType::from_id(1000), None);
    }

    #[test]
    fn block_sizes_match_ggml() {
        assert_eq!(GgmlType::Q4_K.type_size(), 144);
        assert_eq!(GgmlType::Q6_K.type_size(), 210);
        assert_eq!(GgmlType::Q8_0.type_size(), 34);
        assert_eq!(GgmlType::Q4_0.byte_size(64), Some(36));
        assert_eq!(GgmlType::Q4_0.byte_size(33), None);
        assert_eq!(GgmlType::F32.byte_size(u64::MAX), None);
    }
}
