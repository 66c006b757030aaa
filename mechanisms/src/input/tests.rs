use super::*;

#[test]
fn vocabularies_beyond_the_proven_length_are_refused() {
    let v = MAX_VOCAB + 1;
    let row = vec![1.0 / v as f64; v];
    assert!(matches!(
        Ensemble::from_probabilities(&row, &row),
        Err(MechanismError::VocabularyTooLarge { vocab, max }) if vocab == v && max == MAX_VOCAB
    ));
}

#[test]
fn log_rows_convert_to_normalised_f64() {
    let public = [0.5f64.ln(), 0.5f64.ln()];
    let members = [0.25f32.ln(), 0.75f32.ln(), f32::NEG_INFINITY, 0.0];
    let e = Ensemble::new(Rows::LogProbF64(&public), Rows::LogProbF32(&members)).unwrap();
    assert_eq!(e.len(), 2);
    assert_eq!(e.member(1), &[0.0, 1.0]);
    assert!((e.member(0).iter().sum::<f64>() - 1.0).abs() < 1e-15);
}

#[test]
fn bad_rows_are_typed_errors() {
    let p = [0.5, 0.5];
    assert!(matches!(
        Ensemble::from_probabilities(&p, &[0.5, 0.5, 1.0]),
        Err(MechanismError::LengthMismatch { .. })
    ));
    assert!(matches!(
        Ensemble::from_probabilities(&p, &[f64::NAN, 1.0]),
        Err(MechanismError::NonFinite {
            row: 1,
            index: 0,
            ..
        })
    ));
    assert!(matches!(
        Ensemble::from_probabilities(&p, &[-0.5, 1.5]),
        Err(MechanismError::Negative {
            row: 1,
            index: 0,
            ..
        })
    ));
    assert!(matches!(
        Ensemble::from_probabilities(&p, &[0.5, 0.6]),
        Err(MechanismError::NotNormalised { row: 1, .. })
    ));
    assert!(matches!(
        Ensemble::from_probabilities(&[], &[]),
        Err(MechanismError::EmptyVocabulary)
    ));
    let logs = [0.1f64, -3.0];
    assert!(matches!(
        Ensemble::new(Rows::LogProbF64(&logs), Rows::ProbF64(&p)),
        Err(MechanismError::Negative { row: 0, .. })
    ));
}

#[test]
fn renew_equals_new_and_checks_the_same() {
    let public = [0.5, 0.25, 0.25];
    let a = [0.2, 0.3, 0.5, 0.6, 0.2, 0.2];
    let b: Vec<f32> = vec![0.1, 0.1, 0.8];
    let first = Ensemble::from_probabilities(&public, &a).unwrap();
    // Fewer members and f32 rows this time: the buffers shrink and are refilled.
    let renewed = first
        .clone()
        .renew(Rows::ProbF64(&public), Rows::ProbF32(&b))
        .unwrap();
    assert_eq!(
        renewed,
        Ensemble::new(Rows::ProbF64(&public), Rows::ProbF32(&b)).unwrap()
    );
    assert_eq!(renewed.len(), 1);
    assert!(matches!(
        first.renew(
            Rows::ProbF64(&public),
            Rows::ProbF64(&[0.5, 0.5, -0.1, 0.1])
        ),
        Err(MechanismError::LengthMismatch { .. })
    ));
    let bad = [0.5, 0.5, 0.0, 0.7, f64::NAN, -0.2];
    assert!(matches!(
        renewed.renew(Rows::ProbF64(&public), Rows::ProbF64(&bad)),
        Err(MechanismError::NonFinite {
            row: 2,
            index: 1,
            ..
        })
    ));
}

#[test]
fn renew_or_new_equals_new_with_or_without_a_previous_ensemble() {
    let public = [0.5, 0.25, 0.25];
    let a = [0.2, 0.3, 0.5, 0.6, 0.2, 0.2];
    let want = Ensemble::new(Rows::ProbF64(&public), Rows::ProbF64(&a)).unwrap();
    let first = Ensemble::renew_or_new(None, Rows::ProbF64(&public), Rows::ProbF64(&a)).unwrap();
    assert_eq!(first, want);
    let b = [0.1, 0.1, 0.8];
    let second =
        Ensemble::renew_or_new(Some(first), Rows::ProbF64(&public), Rows::ProbF64(&b)).unwrap();
    assert_eq!(
        second,
        Ensemble::new(Rows::ProbF64(&public), Rows::ProbF64(&b)).unwrap()
    );
    assert!(matches!(
        Ensemble::renew_or_new(Some(second), Rows::ProbF64(&public), Rows::ProbF64(&[0.5])),
        Err(MechanismError::LengthMismatch { .. })
    ));
}

#[test]
fn long_rows_are_checked_entry_by_entry() {
    // Past the vector blocks: the first bad entry is named wherever it is.
    let v = 37;
    let public = vec![1.0 / v as f64; v];
    for bad in [0, 7, 8, 35, 36] {
        let mut row = public.clone();
        row[bad] = -1e-3;
        row[(bad + 1) % v] += 1e-3;
        match Ensemble::from_probabilities(&public, &row) {
            Err(MechanismError::Negative { row: 1, index, .. }) => assert_eq!(index, bad),
            other => panic!("entry {bad}: {other:?}"),
        }
    }
    let e = Ensemble::from_probabilities(&public, &public).unwrap();
    assert!((e.member(0).iter().sum::<f64>() - 1.0).abs() < 1e-15);
}

#[test]
fn without_member_drops_one_row() {
    let e = Ensemble::from_probabilities(&[0.5, 0.5], &[1.0, 0.0, 0.0, 1.0, 0.5, 0.5]).unwrap();
    let d = e.without_member(1);
    assert_eq!(d.len(), 2);
    assert_eq!(d.member(1), &[0.5, 0.5]);
}

/// Softmax computed independently, the textbook way: `exp(x)/Σ exp(x)` with no
/// shift (safe for logits in [−30, 30]).
fn naive_softmax(logits: &[f64]) -> Vec<f64> {
    let w: Vec<f64> = logits.iter().map(|&x| x.exp()).collect();
    let s: f64 = w.iter().sum();
    w.into_iter().map(|x| x / s).collect()
}

fn from_logits(public: &[f64], members: &[f64]) -> Result<Ensemble, MechanismError> {
    Ensemble::new(Rows::LogitsF64(public), Rows::LogitsF64(members))
}

#[test]
fn logits_give_the_softmax() {
    let public = [0.5, -1.25, 3.0, 0.0];
    let members = [1.0, 2.0, 3.0, 4.0, -7.5, 0.25, 0.25, 12.0];
    let e = from_logits(&public, &members).unwrap();
    for (got, want) in [
        (e.public(), naive_softmax(&public)),
        (e.member(0), naive_softmax(&members[..4])),
        (e.member(1), naive_softmax(&members[4..])),
    ] {
        for (g, w) in got.iter().zip(&want) {
            assert!((g - w).abs() <= 2e-14 * w, "{g} vs {w}");
        }
    }
    // −∞ masks a token; the others share the mass as without it.
    let masked = from_logits(&[f64::NEG_INFINITY, 0.0, 0.0], &[0.0, 0.0, 0.0]).unwrap();
    assert_eq!(masked.public(), &[0.0, 0.5, 0.5]);
    // Logits whose exponentials overflow: the closed form 1/(1 + e), e/(1 + e).
    let huge = from_logits(&[1000.0, 1001.0], &[-1e300, 1e300]).unwrap();
    let e1 = 1f64.exp();
    assert!((huge.public()[0] - 1.0 / (1.0 + e1)).abs() < 1e-15);
    assert!((huge.public()[1] - e1 / (1.0 + e1)).abs() < 1e-15);
    assert_eq!(huge.member(0), &[0.0, 1.0]);
    // f32 logits are widened exactly: the same distribution as their f64 values.
    let l32 = [0.1f32, -2.5, 7.0];
    let l64: Vec<f64> = l32.iter().map(|&x| f64::from(x)).collect();
    assert_eq!(
        Ensemble::new(Rows::LogitsF32(&l32), Rows::LogitsF32(&l32)).unwrap(),
        from_logits(&l64, &l64).unwrap()
    );
}

#[test]
fn bad_logits_are_typed_errors_naming_the_row() {
    let ok = [0.0, 1.0];
    for (bad, index) in [([f64::NAN, 1.0], 0), ([0.0, f64::INFINITY], 1)] {
        match from_logits(&ok, &[0.0, 0.0, bad[0], bad[1]]) {
            Err(MechanismError::NonFinite {
                row: 2, index: i, ..
            }) => assert_eq!(i, index),
            other => panic!("{bad:?}: {other:?}"),
        }
    }
    let masked = [f64::NEG_INFINITY; 2];
    assert!(matches!(
        from_logits(&masked, &ok),
        Err(MechanismError::NoFiniteLogit { row: 0 })
    ));
    assert!(matches!(
        Ensemble::new(
            Rows::LogitsF64(&ok),
            Rows::LogitsF32(&[0.0, 1.0, f32::NEG_INFINITY, f32::NEG_INFINITY])
        ),
        Err(MechanismError::NoFiniteLogit { row: 2 })
    ));
    assert!(from_logits(&[], &[]).is_err());
}

proptest::proptest! {
    /// Adding a constant to every logit leaves the distribution as it was, up to
    /// the rounding of the additions (a few ulps of |x| + |c|, relative).
    #[test]
    fn shifted_logits_give_the_same_distribution(
        logits in proptest::collection::vec(-60.0f64..60.0, 1..40),
        c in -1e3f64..1e3,
    ) {
        let shifted: Vec<f64> = logits.iter().map(|&x| x + c).collect();
        let a = from_logits(&logits, &logits).unwrap();
        let b = from_logits(&shifted, &shifted).unwrap();
        for (x, y) in a.public().iter().zip(b.public()) {
            proptest::prop_assert!((x - y).abs() <= 1e-11 * x.max(*y), "{} vs {}", x, y);
        }
        let want = naive_softmax(&logits);
        for (x, w) in a.member(0).iter().zip(&want) {
            proptest::prop_assert!((x - w).abs() <= 1e-13 * w, "{} vs {}", x, w);
        }
    }

    /// Integer logits shifted by an integer: every subtraction is exact, so the
    /// distributions are equal bit for bit.
    #[test]
    fn integer_shifts_are_exact(
        logits in proptest::collection::vec(-500i32..500, 1..40),
        c in -100_000i32..100_000,
    ) {
        let a: Vec<f64> = logits.iter().map(|&x| f64::from(x)).collect();
        let b: Vec<f64> = logits.iter().map(|&x| f64::from(x + c)).collect();
        proptest::prop_assert_eq!(from_logits(&a, &a).unwrap(), from_logits(&b, &b).unwrap());
    }
}

/// Log rows longer than a vector block, through the vectorised pass and through the
/// entry-by-entry one (−∞, arguments below the served range, bad entries): each
/// probability within 2 ulp of libm's before the division by the sum, the first bad
/// entry named wherever it is.
#[test]
fn log_rows_take_the_fast_and_the_careful_pass_alike() {
    let v = 37;
    let mut logs: Vec<f64> = (0..v).map(|i| -0.5 - 0.1 * i as f64).collect();
    let norm = logs.iter().map(|&l| l.exp()).sum::<f64>().ln();
    logs.iter_mut().for_each(|l| *l -= norm);
    let check = |row: &[f64]| {
        let e = Ensemble::new(Rows::LogProbF64(row), Rows::LogProbF64(row)).unwrap();
        let want: Vec<f64> = row.iter().map(|&l| l.exp()).collect();
        let sum: f64 = want.iter().sum();
        for (got, w) in e.member(0).iter().zip(&want) {
            // A few ulp, or the absolute error of a subnormal quotient.
            let w = w / sum;
            assert!((got - w).abs() <= 1e-15 * w + 1e-320, "{got} vs {w}");
        }
        assert_eq!(e.public(), e.member(0));
    };
    check(&logs);
    // −∞ and a subnormal probability, in the body and in the tail of the row.
    for (at, value) in [(3, f64::NEG_INFINITY), (9, -720.0), (36, f64::NEG_INFINITY)] {
        let mut row = logs.clone();
        row[at] = value;
        let norm = row.iter().map(|&l| l.exp()).sum::<f64>().ln();
        row.iter_mut().for_each(|l| *l -= norm);
        check(&row);
        let e = Ensemble::new(Rows::LogProbF64(&row), Rows::LogProbF64(&row)).unwrap();
        assert!(e.public()[at] < 1e-300, "{at}");
    }
    // f32 rows as their f64 values.
    let l32: Vec<f32> = logs.iter().map(|&l| l as f32).collect();
    let l64: Vec<f64> = l32.iter().map(|&l| f64::from(l)).collect();
    assert_eq!(
        Ensemble::new(Rows::LogProbF32(&l32), Rows::LogProbF32(&l32)).unwrap(),
        Ensemble::new(Rows::LogProbF64(&l64), Rows::LogProbF64(&l64)).unwrap()
    );
    // The first bad entry, in order, whatever its kind (a positive one follows it).
    for (bad, value) in [(0, f64::NAN), (8, f64::INFINITY), (20, 0.5), (35, f64::NAN)] {
        let mut row = logs.clone();
        row[bad] = value;
        row[bad + 1] = 0.25;
        match Ensemble::new(Rows::LogProbF64(&logs), Rows::LogProbF64(&row)) {
            Err(MechanismError::NonFinite { row: 1, index, .. }) if value != 0.5 => {
                assert_eq!(index, bad)
            }
            Err(MechanismError::Negative {
                row: 1,
                index,
                value: v,
            }) if value == 0.5 => assert_eq!((index, v), (bad, -0.5)),
            other => panic!("entry {bad}: {other:?}"),
        }
    }
}
