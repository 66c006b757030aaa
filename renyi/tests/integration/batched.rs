//! The batched kernel validates each row inside its own pass when it can; these tests
//! check that it accepts and rejects exactly what the scalar functions do, and falls
//! back to the log-space kernels exactly when they do.

use privmix_renyi::{
    Direction, Order, RenyiError, batched_divergence, divergence, symmetric_divergence,
};
use proptest::prelude::*;

fn scalar(row: &[f64], reference: &[f64], alpha: Order, dir: Direction) -> Result<f64, RenyiError> {
    match dir {
        Direction::Forward => divergence(row, reference, alpha),
        Direction::Reverse => divergence(reference, row, alpha),
        Direction::Symmetric => symmetric_divergence(row, reference, alpha),
    }
}

fn check_rows(rows: &[Vec<f64>], reference: &[f64], alpha: Order) -> Result<(), TestCaseError> {
    let flat = rows.concat();
    for dir in [Direction::Forward, Direction::Reverse, Direction::Symmetric] {
        let batch = batched_divergence(&flat, reference, alpha, dir);
        let each: Vec<_> = rows
            .iter()
            .map(|r| scalar(r, reference, alpha, dir))
            .collect();
        match each.iter().position(Result::is_err) {
            Some(bad) => {
                let want = RenyiError::Row {
                    row: bad,
                    source: Box::new(each[bad].clone().unwrap_err()),
                };
                // Compared as text: a NaN in the error is not equal to itself.
                let want: Result<Vec<f64>, _> = Err(want);
                prop_assert_eq!(format!("{batch:?}"), format!("{want:?}"), "{:?}", dir);
            }
            None => {
                let want: Vec<f64> = each.into_iter().map(Result::unwrap).collect();
                prop_assert_eq!(batch, Ok(want), "{:?}", dir);
            }
        }
    }
    Ok(())
}

/// Rows that are sometimes invalid or unusual: scaled so their sum lands on either side
/// of the tolerance, with tiny (log-space) entries, zeros, a negative or a NaN.
fn row(len: usize) -> impl Strategy<Value = Vec<f64>> {
    (
        prop::collection::vec(0.01..1.0_f64, len),
        prop_oneof![Just(0.0), -1.2e-4..1.2e-4_f64, Just(1e-4), Just(-1e-4)],
        0..8u8,
        0..len,
    )
        .prop_map(|(mut v, offset, kind, at)| {
            let s: f64 = v.iter().sum();
            v.iter_mut().for_each(|x| *x *= (1.0 + offset) / s);
            match kind {
                0 => v[at] = 1e-200,
                1 => v[at] = 0.0,
                2 => v[at] = -v[at],
                3 => v[at] = f64::NAN,
                4 => v[at] = f64::INFINITY,
                _ => {}
            }
            v
        })
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(200))]

    #[test]
    fn batched_accepts_and_rejects_like_scalar(
        (rows, reference) in (1..500usize).prop_flat_map(|len| {
            (prop::collection::vec(row(len), 1..5), prop::collection::vec(0.01..1.0_f64, len))
        }),
        alpha in prop_oneof![Just(2.0), Just(18.0), Just(7.5), Just(1.05), Just(f64::INFINITY)],
    ) {
        let s: f64 = reference.iter().sum();
        let reference: Vec<f64> = reference.iter().map(|x| x / s).collect();
        check_rows(&rows, &reference, Order::new(alpha).unwrap())?;
    }
}

#[test]
fn reference_with_zeros_and_tiny_entries() {
    let reference = [0.5, 0.5 - 1e-200, 1e-200, 0.0];
    let rows = [
        vec![0.25, 0.25, 0.25, 0.25],
        vec![0.5, 0.5, 0.0, 0.0],
        vec![0.1, 0.2, 0.7, 0.0],
    ];
    for alpha in [2.0, 18.0, 2.5, f64::INFINITY] {
        check_rows(&rows, &reference, Order::new(alpha).unwrap()).unwrap();
    }
    let d = batched_divergence(
        &rows.concat(),
        &reference,
        Order::new(2.0).unwrap(),
        Direction::Forward,
    );
    assert_eq!(d.unwrap()[0], f64::INFINITY);
}
