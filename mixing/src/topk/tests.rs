use super::*;

/// Reference: full stable sort by (value desc, index asc).
fn reference(values: &[f64], k: usize) -> Vec<usize> {
    let mut order: Vec<usize> = (0..values.len()).collect();
    order.sort_by(|&i, &j| values[j].partial_cmp(&values[i]).unwrap());
    order.truncate(k);
    order
}

#[test]
fn matches_a_full_stable_sort_with_ties() {
    let values = [0.1, 0.3, 0.3, 0.05, 0.3, 0.25, 0.0, 0.25];
    for k in 1..=values.len() {
        assert_eq!(
            top_k_indices(&values, k).unwrap(),
            reference(&values, k),
            "k = {k}"
        );
    }
    assert_eq!(top_k_indices(&values, 3).unwrap(), vec![1, 2, 4]);
    assert_eq!(top_k_indices(&values, 5).unwrap(), vec![1, 2, 4, 5, 7]);
}

#[test]
fn pseudo_random_rows_agree_with_reference() {
    let mut state = 0x9e37_79b9_7f4a_7c15_u64;
    for len in [1usize, 2, 7, 64, 1000] {
        // Few distinct values, so ties are common.
        let values: Vec<f64> = (0..len)
            .map(|_| {
                state = state
                    .wrapping_mul(6_364_136_223_846_793_005)
                    .wrapping_add(1_442_695_040_888_963_407);
                ((state >> 59) as f64) / 8.0
            })
            .collect();
        for k in [1, len / 2 + 1, len] {
            assert_eq!(top_k_indices(&values, k).unwrap(), reference(&values, k));
        }
    }
}

#[test]
fn one_pass_path_agrees_with_the_reference_on_both_sides_of_its_limit() {
    let mut state = 0x2545_f491_4f6c_dd1d_u64;
    // Ties common (32 distinct values), with signed zeros and infinities mixed in.
    let values: Vec<f64> = (0..3000)
        .map(|i| {
            state = state
                .wrapping_mul(6_364_136_223_846_793_005)
                .wrapping_add(1_442_695_040_888_963_407);
            match i % 97 {
                0 => -0.0,
                1 => f64::INFINITY,
                2 => f64::NEG_INFINITY,
                _ => ((state >> 59) as f64) / 8.0 - 1.0,
            }
        })
        .collect();
    for k in [1, 2, 5, 60, SMALL_K - 1, SMALL_K, SMALL_K + 1, 2999] {
        assert_eq!(
            top_k_indices(&values, k).unwrap(),
            reference(&values, k),
            "k = {k}"
        );
    }
}

#[test]
fn signed_zeros_tie_and_infinities_rank() {
    assert_eq!(top_k_indices(&[-0.0, 0.0, -0.0], 2).unwrap(), vec![0, 1]);
    let logits = [f64::NEG_INFINITY, 2.0, f64::INFINITY, -1.0];
    assert_eq!(top_k_indices(&logits, 4).unwrap(), vec![2, 1, 3, 0]);
    assert_eq!(
        top_k_indices(&[0.5_f32, 0.25, 0.25], 2).unwrap(),
        vec![0, 1]
    );
}

#[test]
fn rejects_bad_k_nan_and_empty() {
    assert_eq!(
        top_k_indices(&[0.5, 0.5], 0),
        Err(MixingError::InvalidK { k: 0, len: 2 })
    );
    assert_eq!(
        top_k_indices(&[0.5, 0.5], 3),
        Err(MixingError::InvalidK { k: 3, len: 2 })
    );
    assert_eq!(
        top_k_indices(&[0.5, f64::NAN], 1),
        Err(MixingError::NotANumber { index: 1 })
    );
    assert_eq!(top_k_indices::<f64>(&[], 1), Err(MixingError::Empty));
}

#[test]
fn gather_and_renormalise() {
    let row = [0.1_f32, 0.2, 0.3, 0.4];
    let kept = truncate_renormalised(&row, &[3, 1]).unwrap();
    let (a, b) = (f64::from(0.4_f32), f64::from(0.2_f32));
    assert_eq!(kept, vec![a / (a + b), b / (a + b)]);
    assert_eq!(
        gather(&row, &[4]),
        Err(MixingError::IndexOutOfRange { index: 4, len: 4 })
    );
    assert_eq!(
        renormalise(&mut [0.0, 0.0]),
        Err(MixingError::CannotRenormalise { sum: 0.0 })
    );
    assert!(renormalise(&mut [0.5, -0.1]).is_err());
    assert!(renormalise(&mut [f64::INFINITY, 1.0]).is_err());
    assert!(matches!(
        renormalise(&mut [f64::NAN]),
        Err(MixingError::CannotRenormalise { .. })
    ));
}
