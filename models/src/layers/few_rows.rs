//! `x Wᵀ` for a few rows of `x` on burn-flex, reading each row of the
//! `[out, in]` weight once from memory and forming all its dot products
//! while it sits in L1.
//!
//! Why: decoding multiplies 1 to ~32 rows (one per sequence or ensemble
//! member) by every weight of the model, so a step is bound by reading the
//! weights. burn-flex hands such products to `gemm`, which for one row uses
//! a single-threaded gemv and for two or more rows *packs the whole weight*
//! (a read and a write of it) before its microkernel runs: a 2-row step of
//! SmolLM2 cost 2.4× a 1-row step, nearly all in packing. Here each weight
//! row is read once, on all cores (rayon over output blocks), and the rows
//! of `x` (at most a few hundred KB) stay in cache.
//!
//! Precision: each output is an f32 dot product accumulated with fused
//! multiply-adds in one vector accumulator per output, a different order
//! from gemm's but within the same `γ_k Σ|w_j x_j|` bound of the exact sum
//! (Higham, *Accuracy and Stability*, Thm 3.1), which the tests check.
//!
//! SIMD: `pulp` dispatches at run time to AVX-512, AVX2+FMA or scalar code,
//! as `gemm` itself does; no `unsafe` here.

use std::any::Any;

use burn::tensor::{Tensor, TensorData, TensorPrimitive, backend::Backend};
use burn_flex::FlexTensor;
use pulp::{Simd, WithSimd};
use rayon::prelude::*;

/// Output columns per parallel task (a multiple of the SIMD width; 64 rows of
/// a 576-wide weight are 147 KB, enough to amortise rayon's scheduling).
const BLOCK: usize = 64;

/// `x Wᵀ` (`[rows, in]` → `[rows, out]`) where `weight_t` is the `[in, out]`
/// transposed view of a contiguous f32 `[out, in]` burn-flex tensor, or
/// `None` where that does not hold (another backend, autodiff, another
/// layout or dtype): the caller then uses burn's matmul.
pub(crate) fn few_rows_matmul<B: Backend>(
    x: &Tensor<B, 2>,
    weight_t: &Tensor<B, 2>,
) -> Option<Tensor<B, 2>> {
    let [rows, k] = x.dims();
    let [k_w, out] = weight_t.dims();
    if k != k_w || rows == 0 || k == 0 || out == 0 {
        return None;
    }
    let w_prim = match weight_t.clone().into_primitive() {
        TensorPrimitive::Float(p) => p,
        TensorPrimitive::QFloat(_) => return None,
    };
    let w_flex = (&w_prim as &dyn Any).downcast_ref::<FlexTensor>()?;
    let w = weight_rows(w_flex, k, out)?;
    let xs = crate::runtime::to_vec(x.clone()).ok()?;
    if xs.len() != rows * k {
        return None;
    }
    let y = few_rows_times_weight_rows(&xs, rows, w, k, out);
    Some(Tensor::from_data(
        TensorData::new(y, [rows, out]),
        &x.device(),
    ))
}

/// The `[out, in]` rows behind an `[in, out]` view with strides `[1, in]`.
fn weight_rows(t: &FlexTensor, k: usize, out: usize) -> Option<&[f32]> {
    if t.dtype() != burn::tensor::DType::F32 {
        return None;
    }
    let layout = t.layout();
    let strides = layout.strides();
    let in_stride = isize::try_from(k).ok()?;
    if strides.len() != 2 || strides[0] != 1 || strides[1] != in_stride {
        return None;
    }
    let start = layout.start_offset();
    t.storage::<f32>()
        .get(start..start.checked_add(out.checked_mul(k)?)?)
}

/// `y[r, o] = Σ_j x[r, j] · w[o, j]` for row-major `x: [rows, k]` and
/// `w: [out, k]`, as row-major `[rows, out]`.
pub(crate) fn few_rows_times_weight_rows(
    x: &[f32],
    rows: usize,
    w: &[f32],
    k: usize,
    out: usize,
) -> Vec<f32> {
    debug_assert_eq!(x.len(), rows * k);
    debug_assert_eq!(w.len(), out * k);
    // Computed as yᵀ ([out, rows]) so that each task owns a contiguous block.
    let mut yt = vec![0.0f32; out * rows];
    yt.par_chunks_mut(BLOCK * rows)
        .zip(w.par_chunks(BLOCK * k))
        .for_each(|(yt, w)| {
            pulp::Arch::new().dispatch(Block { w, k, x, rows, yt });
        });
    untranspose(&yt, rows, out)
}

/// `y` (`[rows, out]`, row-major) from `yt` (`[out, rows]`), the layout in which
/// each parallel task owns a contiguous block of outputs.
fn untranspose(yt: &[f32], rows: usize, out: usize) -> Vec<f32> {
    let mut y = vec![0.0f32; rows * out];
    for (o, col) in yt.chunks_exact(rows).enumerate() {
        for (r, v) in col.iter().enumerate() {
            y[r * out + o] = *v;
        }
    }
    y
}

/// One block of output columns: `yt[o, r] = w[o] · x[r]`.
struct Block<'a> {
    w: &'a [f32],
    k: usize,
    x: &'a [f32],
    rows: usize,
    yt: &'a mut [f32],
}

impl WithSimd for Block<'_> {
    type Output = ();

    /// Tiles of [`OUT_TILE`] weight rows × [`ROW_TILE`] rows of `x`: per
    /// vector of `k`, 4 + 2 loads feed 8 independent FMA chains, so the FMA
    /// units, not the loads, set the pace (a 1 × 4 tile needs 5 loads for 4
    /// FMAs). The weight rows come from memory once; the tile's other rows
    /// of `x` find them in L1.
    #[inline(always)]
    fn with_simd<S: Simd>(self, simd: S) {
        let Block { w, k, x, rows, yt } = self;
        let n_out = w.len() / k;
        let mut o = 0;
        while o < n_out {
            let width = if n_out - o >= OUT_TILE { OUT_TILE } else { 1 };
            let wo = &w[o * k..(o + width) * k];
            let mut r = 0;
            while r < rows {
                let height = (rows - r).min(ROW_TILE);
                let xr = &x[r * k..(r + height) * k];
                match (width, height) {
                    (OUT_TILE, ROW_TILE) => put(
                        yt,
                        rows,
                        o,
                        r,
                        tile::<S, OUT_TILE, ROW_TILE>(simd, wo, xr, k),
                    ),
                    (OUT_TILE, _) => put(yt, rows, o, r, tile::<S, OUT_TILE, 1>(simd, wo, xr, k)),
                    (_, ROW_TILE) => put(yt, rows, o, r, tile::<S, 1, ROW_TILE>(simd, wo, xr, k)),
                    _ => put(yt, rows, o, r, tile::<S, 1, 1>(simd, wo, xr, k)),
                }
                r += height;
            }
            o += width;
        }
    }
}

/// Weight rows per tile.
const OUT_TILE: usize = 4;
/// Rows of `x` per tile.
const ROW_TILE: usize = 2;

/// Stores a tile's dot products at `yt[o + i, r + j]`.
#[inline(always)]
fn put<const O: usize, const R: usize>(
    yt: &mut [f32],
    rows: usize,
    o: usize,
    r: usize,
    t: [[f32; R]; O],
) {
    for (i, ti) in t.iter().enumerate() {
        yt[(o + i) * rows + r..][..R].copy_from_slice(ti);
    }
}

/// `[w_i · x_j]` for the `O` rows of `w` and `R` rows of `x` (each `k` long).
///
/// Plain loops over const-sized arrays, no closures: a closure that is not
/// inlined into pulp's `#[target_feature]` frame compiles its intrinsics as
/// out-of-line calls (measured: a quarter of the time in the reductions).
#[inline(always)]
fn tile<S: Simd, const O: usize, const R: usize>(
    simd: S,
    w: &[f32],
    x: &[f32],
    k: usize,
) -> [[f32; R]; O] {
    let empty: (&[S::f32s], &[f32]) = (&[], &[]);
    let mut ws = [empty; O];
    for i in 0..O {
        ws[i] = S::as_simd_f32s(&w[i * k..][..k]);
    }
    let mut xs = [empty; R];
    for j in 0..R {
        xs[j] = S::as_simd_f32s(&x[j * k..][..k]);
    }
    let n = ws[0].0.len();
    let zero = simd.splat_f32s(0.0);
    let mut acc = [[zero; R]; O];
    for v in 0..n {
        let mut xl = [zero; R];
        for j in 0..R {
            xl[j] = xs[j].0[v];
        }
        for i in 0..O {
            let wl = ws[i].0[v];
            for j in 0..R {
                acc[i][j] = simd.mul_add_e_f32s(wl, xl[j], acc[i][j]);
            }
        }
    }
    let mut out = [[0.0f32; R]; O];
    for i in 0..O {
        for j in 0..R {
            let mut s = simd.reduce_sum_f32s(acc[i][j]);
            for (a, b) in ws[i].1.iter().zip(xs[j].1) {
                s = a.mul_add(*b, s);
            }
            out[i][j] = s;
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use burn::backend::Flex;
    use proptest::prelude::*;

    /// The exact dot products, in f64.
    fn reference(x: &[f32], rows: usize, w: &[f32], k: usize, out: usize) -> Vec<(f64, f64)> {
        let mut y = Vec::with_capacity(rows * out);
        for r in 0..rows {
            for o in 0..out {
                let (mut s, mut abs) = (0.0f64, 0.0f64);
                for j in 0..k {
                    let p = f64::from(x[r * k + j]) * f64::from(w[o * k + j]);
                    s += p;
                    abs += p.abs();
                }
                y.push((s, abs));
            }
        }
        y
    }

    /// Each output within `γ_k Σ|w_j x_j|` of the exact sum (Higham Thm 3.1;
    /// FMA only tightens it), `γ_k = k·u/(1 − k·u)`, `u = 2⁻²⁴`, plus the
    /// final rounding to f32.
    fn check(x: &[f32], rows: usize, w: &[f32], k: usize, out: usize, got: &[f32]) {
        let u = f64::from(f32::EPSILON) / 2.0;
        let gamma = (k + 1) as f64 * u / (1.0 - (k + 1) as f64 * u);
        for (i, ((exact, abs), g)) in reference(x, rows, w, k, out).iter().zip(got).enumerate() {
            let diff = (f64::from(*g) - exact).abs();
            assert!(
                diff <= gamma * abs + f64::from(f32::MIN_POSITIVE),
                "output {i}: {g} vs exact {exact} (bound {})",
                gamma * abs
            );
        }
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(48))]
        #[test]
        fn matches_exact_dot_products(
            rows in 1usize..=11,
            k in 1usize..=70,
            out in 1usize..=140,
            seed in any::<u64>(),
        ) {
            let fill = |n: usize, s: u64| -> Vec<f32> {
                (0..n)
                    .map(|j| {
                        let h = (j as u64 + 1).wrapping_mul(0x9E37_79B9_7F4A_7C15) ^ s;
                        ((h >> 40) as f32 / (1u64 << 24) as f32) * 4.0 - 2.0
                    })
                    .collect()
            };
            let (x, w) = (fill(rows * k, seed), fill(out * k, seed.rotate_left(17)));
            let y = few_rows_times_weight_rows(&x, rows, &w, k, out);
            prop_assert_eq!(y.len(), rows * out);
            check(&x, rows, &w, k, out, &y);
        }
    }

    #[test]
    fn tensor_path_takes_flex_views_and_declines_other_layouts() {
        let dev = Default::default();
        let (o, i, rows) = (130, 37, 5);
        let w: Vec<f32> = (0..o * i)
            .map(|j| ((j * 31 % 97) as f32 - 48.0) / 53.0)
            .collect();
        let xs: Vec<f32> = (0..rows * i).map(|j| (j % 13) as f32 / 4.0 - 1.5).collect();
        let weight = Tensor::<Flex, 2>::from_data(TensorData::new(w.clone(), [o, i]), &dev);
        let x = Tensor::<Flex, 2>::from_data(TensorData::new(xs.clone(), [rows, i]), &dev);
        let y = few_rows_matmul(&x, &weight.clone().transpose()).expect("flex [out, in] view");
        assert_eq!(y.dims(), [rows, o]);
        check(&xs, rows, &w, i, o, &y.into_data().to_vec::<f32>().unwrap());
        // A contiguous [in, out] weight (GPT-2's Conv1D layout) is not rows of W.
        let in_out = weight.clone().transpose().into_data();
        let in_out = Tensor::<Flex, 2>::from_data(in_out, &dev);
        assert!(few_rows_matmul(&x, &in_out).is_none());
        // A column slice of the view is a block of W's rows, mid-buffer.
        let part = weight.clone().transpose().narrow(1, 64, 40);
        let y = few_rows_matmul(&x, &part).expect("narrowed view");
        check(
            &xs,
            rows,
            &w[64 * i..104 * i],
            i,
            40,
            &y.into_data().to_vec::<f32>().unwrap(),
        );
    }
}
