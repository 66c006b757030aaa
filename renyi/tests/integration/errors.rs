//! Every kind of bad input gets its own typed error, from every entry point.

use privmix_renyi::{
    Direction, MixturePath, Order, RenyiError, SymmetricMixture, batched_divergence, divergence,
    divergence_log, kl_divergence, kl_divergence_log, symmetric_divergence,
    symmetric_divergence_log,
};

const P: [f64; 2] = [0.5, 0.5];

fn two() -> Order {
    Order::new(2.0).unwrap()
}

#[test]
fn order_out_of_range() {
    for bad in [1.0, 0.0, -1.0, f64::NEG_INFINITY] {
        assert_eq!(Order::new(bad), Err(RenyiError::InvalidOrder(bad)));
        // An Order built by hand is checked at the entry point.
        let e = Some(RenyiError::InvalidOrder(bad));
        assert_eq!(divergence(&P, &P, Order::Finite(bad)).err(), e);
        assert_eq!(divergence_log(&[0.0], &[0.0], Order::Finite(bad)).err(), e);
        let batch = batched_divergence(&P, &P, Order::Finite(bad), Direction::Forward);
        assert_eq!(batch.err(), e);
        assert_eq!(MixturePath::forward(&P, &P, Order::Finite(bad)).err(), e);
        assert_eq!(SymmetricMixture::new(&P, &P, Order::Finite(bad)).err(), e);
    }
    assert!(matches!(Order::new(f64::NAN), Err(RenyiError::InvalidOrder(a)) if a.is_nan()));
}

#[test]
fn empty_and_mismatched() {
    let empty: [f64; 0] = [];
    assert_eq!(divergence(&empty, &empty, two()), Err(RenyiError::Empty));
    assert_eq!(kl_divergence(&P, &empty), Err(RenyiError::Empty));
    assert_eq!(divergence_log(&[], &[0.0], two()), Err(RenyiError::Empty));
    assert_eq!(
        divergence(&P, &[0.25, 0.25, 0.5], two()),
        Err(RenyiError::LengthMismatch { left: 2, right: 3 })
    );
    assert_eq!(
        kl_divergence_log(&[0.0], &[0.5_f64.ln(), 0.5_f64.ln()]),
        Err(RenyiError::LengthMismatch { left: 1, right: 2 })
    );
    assert_eq!(
        MixturePath::new(&P, &P, &[1.0], two()).err(),
        Some(RenyiError::LengthMismatch { left: 2, right: 1 })
    );
    assert_eq!(
        batched_divergence(&[0.5, 0.5, 1.0], &P, two(), Direction::Forward),
        Err(RenyiError::RaggedBatch { len: 3, row_len: 2 })
    );
    assert_eq!(
        batched_divergence(&[], &P, two(), Direction::Forward),
        Ok(vec![])
    );
}

#[test]
fn bad_entries() {
    assert_eq!(
        divergence(&[0.5, f64::INFINITY], &P, two()),
        Err(RenyiError::NonFinite {
            index: 1,
            value: f64::INFINITY
        })
    );
    assert_eq!(
        symmetric_divergence(&[0.5_f32, 0.5], &[1.5_f32, -0.5], two()),
        Err(RenyiError::Negative {
            index: 1,
            value: -0.5
        })
    );
    assert!(matches!(
        kl_divergence(&[f64::NAN, 1.0], &P),
        Err(RenyiError::NonFinite { index: 0, value }) if value.is_nan()
    ));
    assert_eq!(
        divergence_log(&[0.0, f64::INFINITY], &[0.0, f64::NEG_INFINITY], two()),
        Err(RenyiError::NonFinite {
            index: 1,
            value: f64::INFINITY
        })
    );
    assert!(matches!(
        symmetric_divergence_log(&[0.0], &[f64::NAN], two()),
        Err(RenyiError::NonFinite { index: 0, .. })
    ));
}

#[test]
fn not_normalised_beyond_tolerance() {
    assert_eq!(
        divergence(&[0.5, 0.6], &P, two()),
        Err(RenyiError::NotNormalised { sum: 1.1 })
    );
    // Within NORMALISATION_TOLERANCE (1e-4) is accepted, beyond is not.
    assert!(divergence(&[0.5, 0.50009], &P, two()).is_ok());
    assert!(divergence(&[0.5, 0.50011], &P, two()).is_err());
    assert!(matches!(
        divergence_log(&[0.0, 0.0], &[0.0, f64::NEG_INFINITY], two()),
        Err(RenyiError::NotNormalised { sum }) if (sum - 2.0).abs() < 1e-15
    ));
}

#[test]
fn bad_rows_are_named() {
    let rows = [0.5, 0.5, 0.25, 0.25, 0.7, -0.7];
    assert_eq!(
        batched_divergence(&rows, &P, two(), Direction::Symmetric),
        Err(RenyiError::Row {
            row: 1,
            source: Box::new(RenyiError::NotNormalised { sum: 0.5 })
        })
    );
    let msg = batched_divergence(
        &rows[..2]
            .iter()
            .chain(&rows[4..])
            .copied()
            .collect::<Vec<_>>(),
        &P,
        two(),
        Direction::Forward,
    )
    .unwrap_err()
    .to_string();
    assert_eq!(msg, "row 1: entry 1 is negative: -0.7");
}

#[test]
fn lambda_out_of_range() {
    let path = MixturePath::forward(&P, &[0.25, 0.75], two()).unwrap();
    let sym = SymmetricMixture::new(&P, &[0.25, 0.75], two()).unwrap();
    for bad in [-1e-9, 1.0 + 1e-9, f64::INFINITY] {
        assert_eq!(path.evaluate(bad), Err(RenyiError::InvalidLambda(bad)));
        assert_eq!(sym.evaluate(bad), Err(RenyiError::InvalidLambda(bad)));
    }
    assert!(matches!(path.evaluate(f64::NAN), Err(RenyiError::InvalidLambda(l)) if l.is_nan()));
}
