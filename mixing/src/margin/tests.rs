use super::*;

#[test]
fn the_margin_has_the_documented_size_and_rounds_the_safe_way() {
    let alpha = Order::new(18.0).unwrap();
    let err = evaluator_error(alpha, 50_257).unwrap();
    let want = UNIT_ROUNDOFF * (18.0 / 17.0) * (128.0 * 745.0 + 16.0 * 50_257.0 + 1024.0);
    assert!(err.absolute >= want && err.absolute <= want * (1.0 + 1e-14));
    assert!((0.9e-10..1.1e-10).contains(&err.absolute), "{err:?}");
    let b = enforced_radius(3.6, alpha, 50_257).unwrap();
    assert!(b < 3.6 * (1.0 - RELATIVE_ERROR) - err.absolute + 1e-15);
    assert!(b > 3.6 - 1e-9);
    // Tiny radii are swallowed; +∞ stays.
    assert_eq!(enforced_radius(1e-12, alpha, 50_257), Ok(0.0));
    assert_eq!(enforced_radius(0.0, alpha, 3), Ok(0.0));
    assert_eq!(enforced_radius(f64::INFINITY, alpha, 3), Ok(f64::INFINITY));
    // α near 1: the 1/(α − 1) of the sums shows.
    let near = evaluator_error(Order::new(1.001).unwrap(), 3).unwrap();
    assert!(near.absolute > 900.0 * evaluator_error(Order::Infinite, 3).unwrap().absolute);
}

#[test]
fn bad_inputs_are_typed_errors() {
    let alpha = Order::new(2.0).unwrap();
    assert_eq!(
        enforced_radius(-1.0, alpha, 3),
        Err(MixingError::InvalidBound(-1.0))
    );
    assert!(matches!(
        enforced_radius(f64::NAN, alpha, 3),
        Err(MixingError::InvalidBound(_))
    ));
    assert_eq!(enforced_radius(1.0, alpha, 0), Err(MixingError::Empty));
}
