use super::*;
use half::f16;

/// GGUF bytes of `out × in/32` blocks from a seed (scales in f16).
pub(crate) fn blocks(ty: GgmlType, out: usize, inp: usize, bytes: &[u8]) -> Vec<u8> {
    let mut v = Vec::new();
    let mut next = bytes.iter().cycle();
    for i in 0..out * (inp / QK) {
        let d = f16::from_f32(0.01 + (i % 7) as f32 * 0.003);
        v.extend(d.to_le_bytes());
        if ty == GgmlType::Q4_1 {
            v.extend(f16::from_f32(-0.05 + (i % 5) as f32 * 0.01).to_le_bytes());
            v.extend((0..16).map(|_| *next.next().unwrap()));
        } else {
            v.extend((0..32).map(|_| *next.next().unwrap()));
        }
    }
    v
}

/// Whether every output of `y: [rows, out]` is within `γ_{k+1}
/// Σ|w_j x_j|` of the exact f64 dot product of its row of `x: [rows,
/// k]` with its row of the dequantised weights `dense: [out, k]`: the
/// bound of any order of f32 sums of the products of exactly those
/// weights.
pub(crate) fn within_gamma(
    x: &[f32],
    rows: usize,
    dense: &[f32],
    out: usize,
    y: &[f32],
) -> Result<(), String> {
    let inp = x.len() / rows.max(1);
    let u = f64::from(f32::EPSILON) / 2.0;
    let gamma = (inp + 1) as f64 * u / (1.0 - (inp + 1) as f64 * u);
    for r in 0..rows {
        for o in 0..out {
            let (mut s, mut a) = (0.0f64, 0.0f64);
            for j in 0..inp {
                let p = f64::from(x[r * inp + j]) * f64::from(dense[o * inp + j]);
                s += p;
                a += p.abs();
            }
            let got = f64::from(y[r * out + o]);
            if (got - s).abs() > gamma * a + f64::from(f32::MIN_POSITIVE) {
                return Err(format!("row {r} out {o}: {got} vs {s}"));
            }
        }
    }
    Ok(())
}

#[test]
fn other_types_and_widths_are_declined_and_short_data_is_an_error() {
    assert!(
        BlockWeight::from_ggml(GgmlType::F32, &[0; 128], 1, 32)
            .unwrap()
            .is_none()
    );
    assert!(
        BlockWeight::from_ggml(GgmlType::Q8_0, &[0; 34], 1, 16)
            .unwrap()
            .is_none()
    );
    assert!(BlockWeight::from_ggml(GgmlType::Q8_0, &[0; 33], 1, 32).is_err());
}

#[test]
fn permuted_rows_follow_the_map() {
    let raw = blocks(GgmlType::Q4_1, 3, 64, &[1, 2, 3, 250, 17]);
    let w = BlockWeight::from_ggml(GgmlType::Q4_1, &raw, 3, 64)
        .unwrap()
        .unwrap();
    let p = w.permute_rows(&[2, 0, 1]);
    assert_eq!(p.row(0), w.row(2));
    assert_eq!(p.row(1), w.row(0));
    assert_eq!(p.row(2), w.row(1));
}
