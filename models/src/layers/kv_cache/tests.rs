//! Tests of [`super`].

use super::*;
use burn::backend::Flex;

#[test]
fn padding_slots_are_masked_and_do_not_advance_positions() {
    let mut cache = KvCache::<Flex>::with_storage(1, 2, KvPrecision::F32, true);
    let pos = cache
        .push_step(&[vec![true, true, true], vec![false, true, true]])
        .unwrap();
    assert_eq!(pos, vec![vec![0, 1, 2], vec![0, 0, 1]]);
    let m = cache
        .mask(3, None, &Default::default())
        .into_data()
        .to_vec::<bool>()
        .unwrap();
    // Row 1, query slot 2 sees slots 1 and 2 only.
    assert_eq!(&m[9 + 6..9 + 9], &[true, false, false]);
    // Row 0 is plain causal.
    assert_eq!(&m[0..3], &[false, true, true]);
    let w = cache
        .mask(1, Some(2), &Default::default())
        .into_data()
        .to_vec::<bool>()
        .unwrap();
    assert_eq!(&w[0..3], &[true, false, false]);
    assert!(cache.push_step(&[vec![true]]).is_err());
}
