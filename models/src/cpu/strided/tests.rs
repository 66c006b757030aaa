//! The product's bits against the naive product and one `gemm` call per
//! half, at every thread count; the partition's cover and classes.

use super::*;

fn naive(a: &[f32], b: &[f32], m: usize, n: usize, k: usize) -> Vec<f32> {
    let mut out = vec![0.0; m * n];
    for i in 0..m {
        for j in 0..n {
            out[i * n + j] = (0..k).map(|l| a[i * k + l] * b[l * n + j]).sum();
        }
    }
    out
}

fn values(n: usize, seed: u32) -> Vec<f32> {
    (0..n)
        .map(|i| {
            ((i as u32).wrapping_mul(2654435761).wrapping_add(seed) % 1000) as f32 / 500.0 - 1.0
        })
        .collect()
}

/// A product's operands `a` (`[m, k]`) and `b` (`[k, n]`), and `b`'s
/// transpose `bt` (`[n, k]`), so each test reads the right-hand operand in
/// both layouts.
fn operands(m: usize, n: usize, k: usize) -> (Vec<f32>, Vec<f32>, Vec<f32>) {
    let a = values(m * k, 3);
    let b = values(k * n, 4);
    let mut bt = vec![0.0; k * n];
    for l in 0..k {
        for j in 0..n {
            bt[j * k + l] = b[l * n + j];
        }
    }
    (a, b, bt)
}

#[test]
fn matmul_matches_the_naive_product_in_every_layout() {
    let (m, n, k) = (37, 13, 21);
    let a = values(m * k, 1);
    let b = values(k * n, 2);
    let want = naive(&a, &b, m, n, k);
    let mut bt = vec![0.0; k * n];
    for l in 0..k {
        for j in 0..n {
            bt[j * k + l] = b[l * n + j];
        }
    }
    for (rhs, name) in [
        (Mat::rows(&b, n), "rows"),
        (Mat::transposed(&bt, k), "transposed"),
    ] {
        let mut got = vec![1.0; m * n];
        matmul(&mut got, m, n, k, true, 2.0, Mat::rows(&a, k), rhs);
        for (g, w) in got.iter().zip(&want) {
            assert!((g - (1.0 + 2.0 * w)).abs() < 1e-4, "{name}: {g} vs {w}");
        }
    }
}

/// A split product has the bits of one unsplit `gemm` call, whichever
/// way (columns or rows) and into however many parts it is split, on
/// shapes whose parts all run `gemm`'s packed kernels (a part of a few
/// rows and columns takes its small-product paths, which sum in
/// another order).
#[test]
fn a_split_product_keeps_the_unsplit_bits() {
    // (m, n, k): column splits with one or more blocks of the sum
    // (k > 512), row splits (n too narrow), and an uneven last part.
    for (m, n, k) in [
        (48, 300, 600),
        (512, 192, 70),
        (16, 130, 1500),
        (100, 40, 300),
        (24, 128, 9),
        (200, 150, 40),
    ] {
        let (a, b, bt) = operands(m, n, k);
        for rhs in [Mat::rows(&b, n), Mat::transposed(&bt, k)] {
            let mut want = values(m * n, 5);
            gemm_into(&mut want, n, m, n, k, true, 0.5, Mat::rows(&a, k), rhs);
            for threads in 1..=3 {
                let pool = rayon::ThreadPoolBuilder::new()
                    .num_threads(threads)
                    .build()
                    .unwrap();
                let mut got = values(m * n, 5);
                pool.install(|| {
                    matmul(&mut got, m, n, k, true, 0.5, Mat::rows(&a, k), rhs);
                });
                let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
                assert_eq!(bits(&got), bits(&want), "{m}×{n}×{k} on {threads} threads");
            }
        }
    }
}

#[test]
fn columns_split_only_into_wide_halves() {
    assert_eq!(cols_per_half(576), Some(288));
    assert_eq!(cols_per_half(49_152), Some(24_576));
    assert_eq!(cols_per_half(300), Some(160));
    assert_eq!(cols_per_half(150), Some(80));
    // A half of 64 columns or fewer: rows instead.
    assert_eq!(cols_per_half(128), None);
    assert_eq!(cols_per_half(140), None);
    assert_eq!(cols_per_half(16), None);
}

/// The class of a `gemm` call of `rows × cols` (see the module docs):
/// which blocking of the sum, or which small-product path, it takes.
fn class(rows: usize, cols: usize, k: usize) -> &'static str {
    if k <= 2 || rows <= 1 || cols <= 1 || rows * cols <= HORIZONTAL_MAX {
        "small path"
    } else if rows <= SMALL_SIDE && cols <= SMALL_SIDE {
        "512 then the rest"
    } else {
        "even"
    }
}

/// Shapes of every kind: the DP-SGD step's per-example LoRA products
/// (128 tokens, rank 8, SmolLM2's widths 576 and 1536), the frozen
/// ones, halves of either class side by side, and the small paths.
fn shapes() -> Vec<(usize, usize, usize)> {
    let mut out = vec![
        (128, 8, 576),
        (128, 8, 1536),
        (127, 8, 576),
        (8, 576, 128),
        (576, 8, 128),
        (128, 576, 8),
        (300, 700, 600),
        (136, 40, 600),
        (48, 300, 600),
        (16, 130, 1500),
        (100, 40, 300),
        (24, 128, 9),
        (200, 150, 40),
        (1, 600, 700),
        (600, 1, 700),
        (2, 300, 3),
        (9, 70, 2),
        (70, 3, 800),
        (530, 6, 520),
    ];
    // And a spread of others, from a fixed generator.
    let mut x: u32 = 7;
    let mut next = |below: u32| {
        x = x.wrapping_mul(1_103_515_245).wrapping_add(12_345);
        ((x >> 8) % below) as usize
    };
    for _ in 0..24 {
        let k = [1, 3, 100, 513, 700][next(5)];
        out.push((1 + next(400), 1 + next(400), k));
    }
    out
}

#[test]
fn the_tiles_cover_the_output_once_and_keep_their_halfs_class() {
    for (m, n, k) in shapes() {
        let mut seen = vec![0u8; m * n];
        let halves = halves(m, n);
        for tile in tiles(m, n, k) {
            let half = halves
                .iter()
                .find(|h| h.rows.contains(&tile.rows.start) && h.cols.contains(&tile.cols.start))
                .expect("a tile inside a half");
            assert!(
                tile.rows.end <= half.rows.end && tile.cols.end <= half.cols.end,
                "{m}×{n}×{k}: {tile:?} inside {half:?}"
            );
            assert_eq!(
                class(tile.rows.len(), tile.cols.len(), k),
                class(half.rows.len(), half.cols.len(), k),
                "{m}×{n}×{k}: {tile:?} of {half:?}"
            );
            if class(half.rows.len(), half.cols.len(), k) == "small path" {
                assert_eq!(&tile, half, "{m}×{n}×{k}: a small path's half is not cut");
            }
            for i in tile.rows.clone() {
                for j in tile.cols.clone() {
                    seen[i * n + j] += 1;
                }
            }
        }
        assert!(seen.iter().all(|&c| c == 1), "{m}×{n}×{k}: covered once");
    }
}

#[test]
fn large_products_get_many_tiles() {
    assert_eq!(tiles(512, 576, 576).len(), 8);
    assert_eq!(tiles(512, 1536, 576).len(), 24);
    assert_eq!(tiles(8, 576, 128).len(), 4);
    assert_eq!(tiles(128, 8, 576).len(), 2);
}

/// The product has the same bits in pools of 1, 2, 3, 4 and 7 threads
/// (and run to run): the bits of one `gemm` call per half of the
/// output. Among the shapes are the DP-SGD step's per-example products
/// (128 rows of rank 8 with sums over 576 and 1536 terms), whose bits
/// followed the thread count when the split did.
#[test]
fn every_thread_count_gives_the_same_bits() {
    let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
    let pools: Vec<_> = [1, 2, 3, 4, 7]
        .into_iter()
        .map(|t| {
            rayon::ThreadPoolBuilder::new()
                .num_threads(t)
                .build()
                .unwrap()
        })
        .collect();
    for (m, n, k) in shapes() {
        let (a, b, bt) = operands(m, n, k);
        for rhs in [Mat::rows(&b, n), Mat::transposed(&bt, k)] {
            let mut want = values(m * n, 5);
            for h in halves(m, n) {
                let first = h.rows.start * n + h.cols.start;
                gemm_into(
                    &mut want[first..],
                    n,
                    h.rows.len(),
                    h.cols.len(),
                    k,
                    true,
                    0.5,
                    Mat::rows(&a, k).skip_rows(h.rows.start),
                    rhs.skip_cols(h.cols.start),
                );
            }
            for pool in &pools {
                for _ in 0..2 {
                    let mut got = values(m * n, 5);
                    pool.install(|| {
                        matmul(&mut got, m, n, k, true, 0.5, Mat::rows(&a, k), rhs);
                    });
                    assert_eq!(
                        bits(&got),
                        bits(&want),
                        "{m}×{n}×{k} on {} threads",
                        pool.current_num_threads()
                    );
                }
            }
        }
    }
}

#[test]
#[should_panic(expected = "rhs out of range")]
fn an_operand_too_short_is_refused_before_the_kernel_runs() {
    let a = values(4 * 3, 1);
    let b = values(3 * 2, 2);
    let mut dst = vec![0.0; 4 * 3];
    gemm_into(
        &mut dst,
        3,
        4,
        3,
        3,
        false,
        1.0,
        Mat::rows(&a, 3),
        Mat::rows(&b, 3),
    );
}
