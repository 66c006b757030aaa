//! Tests of [`DpEvent`]: each variant maps to the construction it names, and
//! bad parameters and inapplicable samplings are refused.

use super::*;
use crate::{gaussian, poisson_subsampled_gaussian, without_replacement_gaussian};

fn orders() -> Orders {
    Orders::new(vec![1.5, 2.0, 3.0, 8.0, 32.0]).unwrap()
}

#[test]
fn leaves_map_to_their_functions() {
    let o = orders();
    assert_eq!(
        DpEvent::gaussian(2.0).unwrap().rdp(&o).unwrap(),
        gaussian(&o, 2.0, 1.0).unwrap()
    );
    assert_eq!(
        DpEvent::laplace(3.0).unwrap().rdp(&o).unwrap(),
        laplace::laplace(&o, 3.0).unwrap()
    );
    assert_eq!(
        DpEvent::randomized_response(1.0, 4)
            .unwrap()
            .rdp(&o)
            .unwrap(),
        randomized_response::randomized_response(&o, 1.0, 4).unwrap()
    );
    assert_eq!(DpEvent::NoOp.rdp(&o).unwrap(), RdpCurve::zero(o.clone()));
    let screening = DpEvent::AdapmixedScreening {
        lambda: 1e-3,
        members: 10,
        sigma: 0.5,
    };
    assert_eq!(
        screening.rdp(&o).unwrap(),
        adapmixed_screening::adapmixed_screening(&o, 1e-3, 10, 0.5).unwrap()
    );
    let pq = DpEvent::PmixedQuery {
        beta: 0.01,
        members: 8,
    };
    assert_eq!(
        pq.rdp(&o).unwrap(),
        pmixed::pmixed_query(&o, 0.01, 8).unwrap()
    );
    let ps = DpEvent::PmixedSubsampled {
        beta: 0.01,
        sampling_probability: 0.3,
    };
    assert_eq!(
        ps.rdp(&o).unwrap(),
        pmixed::pmixed_subsampled(&o, 0.01, 0.3).unwrap()
    );
    let dm = DpEvent::DpsMozoToken { beta: 0.02 };
    assert_eq!(
        dm.rdp(&o).unwrap(),
        dps_mozo::dps_mozo_token(&o, 0.02).unwrap()
    );
}

#[test]
fn sampling_a_gaussian_uses_the_gaussian_bounds() {
    let o = orders();
    let g = DpEvent::gaussian(1.1).unwrap();
    let p = g.clone().poisson_sampled(0.01).unwrap();
    assert_eq!(
        p.rdp(&o).unwrap(),
        poisson_subsampled_gaussian(&o, 0.01, 1.1).unwrap()
    );
    // m/n = 1/4 exactly.
    let w = g.sampled_without_replacement(400, 100).unwrap();
    assert_eq!(
        w.rdp(&o).unwrap(),
        without_replacement_gaussian(&o, 0.25, 1.1).unwrap()
    );
}

#[test]
fn sampling_another_leaf_amplifies_and_never_exceeds_it() {
    let o = orders();
    let leaf = DpEvent::laplace(1.0).unwrap();
    let plain = leaf.rdp(&o).unwrap();
    let sampled = leaf.clone().poisson_sampled(0.05).unwrap().rdp(&o).unwrap();
    for (s, p) in sampled.epsilons().iter().zip(plain.epsilons()) {
        assert!(*s <= *p && *s < 0.5 * p, "{s} vs {p}");
    }
    // At integer orders the closed-form path equals amplifying the curve
    // measured at every integer order up to the top order.
    let ints = Orders::integers(32).unwrap();
    let via_curve = leaf.rdp(&ints).unwrap().poisson_subsampled(0.05).unwrap();
    let direct = leaf.poisson_sampled(0.05).unwrap().rdp(&ints).unwrap();
    assert_eq!(direct, via_curve);
    let rr = DpEvent::randomized_response(0.5, 2).unwrap();
    let w = rr
        .clone()
        .sampled_without_replacement(10, 1)
        .unwrap()
        .rdp(&o)
        .unwrap();
    let plain = rr.rdp(&o).unwrap();
    assert!(
        w.epsilons()
            .iter()
            .zip(plain.epsilons())
            .all(|(a, b)| a <= b)
    );
}

#[test]
fn compositions_add_up() {
    let o = orders();
    let g = DpEvent::gaussian(3.0).unwrap();
    let l = DpEvent::laplace(2.0).unwrap();
    let both = DpEvent::Composed(vec![g.clone(), l.clone(), g.clone()]);
    let want = g
        .rdp(&o)
        .unwrap()
        .self_compose(2)
        .compose(&l.rdp(&o).unwrap())
        .unwrap();
    let got = both.rdp(&o).unwrap();
    for (a, b) in got.epsilons().iter().zip(want.epsilons()) {
        assert!((a - b).abs() <= 1e-15 * b);
    }
    assert_eq!(
        g.clone().self_composed(5).unwrap().rdp(&o).unwrap(),
        g.rdp(&o).unwrap().self_compose(5)
    );
    assert_eq!(
        DpEvent::Composed(vec![]).rdp(&o).unwrap(),
        RdpCurve::zero(o)
    );
}

#[test]
fn measured_curves_are_read_at_other_orders_from_above() {
    let measured = RdpCurve::new(Orders::new(vec![2.0, 8.0]).unwrap(), vec![0.1, 0.4]).unwrap();
    let at = DpEvent::Measured(measured.clone()).rdp(&orders()).unwrap();
    assert_eq!(at.epsilons(), &[0.1, 0.1, 0.4, 0.4, f64::INFINITY]);
    let dd = DpEvent::DataDependent(measured.clone())
        .rdp(&orders())
        .unwrap();
    assert_eq!(dd, at);
    // Sampling a measured data-independent curve is allowed, a data-dependent one is not.
    assert!(
        DpEvent::Measured(measured.clone())
            .poisson_sampled(0.1)
            .is_ok()
    );
    assert!(matches!(
        DpEvent::DataDependent(measured).poisson_sampled(0.1),
        Err(AccountantError::UnsupportedEvent {
            event: "data_dependent",
            ..
        })
    ));
}

#[test]
fn samplings_that_do_not_apply_are_refused() {
    let rr = DpEvent::randomized_response(1.0, 2).unwrap();
    assert!(matches!(
        rr.poisson_sampled(0.1),
        Err(AccountantError::UnsupportedEvent { .. })
    ));
    let pq = DpEvent::PmixedQuery {
        beta: 0.01,
        members: 4,
    };
    assert!(pq.clone().poisson_sampled(0.5).is_err());
    // Hidden inside a composition, still refused.
    let nested = DpEvent::Composed(vec![DpEvent::gaussian(1.0).unwrap(), pq]);
    assert!(nested.poisson_sampled(0.5).is_err());
    // A Poisson-sampled event holds for add/remove only: not sampled again without replacement.
    let p = DpEvent::gaussian(1.0)
        .unwrap()
        .poisson_sampled(0.1)
        .unwrap();
    assert!(p.clone().sampled_without_replacement(10, 5).is_err());
    assert!(p.poisson_sampled(0.5).is_ok());
    let ps = DpEvent::PmixedSubsampled {
        beta: 0.01,
        sampling_probability: 0.5,
    };
    assert!(ps.sampled_without_replacement(10, 2).is_err());
}

#[test]
fn bad_parameters_are_typed_errors() {
    let bad = |e: DpEvent, name: &str| match e.validate() {
        Err(AccountantError::InvalidParameter { name: n, .. }) => assert_eq!(n, name),
        other => panic!("{e:?}: expected InvalidParameter({name}), got {other:?}"),
    };
    bad(
        DpEvent::Gaussian {
            noise_multiplier: 0.0,
        },
        "sigma",
    );
    bad(DpEvent::Laplace { scale: f64::NAN }, "scale");
    bad(
        DpEvent::RandomizedResponse {
            epsilon: 1.0,
            categories: 1,
        },
        "categories",
    );
    bad(
        DpEvent::PoissonSampled {
            sampling_probability: 1.5,
            event: Box::new(DpEvent::NoOp),
        },
        "q",
    );
    bad(
        DpEvent::SampledWithoutReplacement {
            source_size: 3,
            sample_size: 4,
            event: Box::new(DpEvent::NoOp),
        },
        "sample_size",
    );
    bad(
        DpEvent::SampledWithoutReplacement {
            source_size: 0,
            sample_size: 0,
            event: Box::new(DpEvent::NoOp),
        },
        "source_size",
    );
    bad(
        DpEvent::Composed(vec![DpEvent::NoOp, DpEvent::DpsMozoToken { beta: -1.0 }]),
        "beta",
    );
    // `rdp` validates too.
    assert!(
        DpEvent::Gaussian {
            noise_multiplier: -1.0
        }
        .rdp(&orders())
        .is_err()
    );
    let mut deep = DpEvent::NoOp;
    for _ in 0..MAX_EVENT_DEPTH {
        deep = DpEvent::SelfComposed {
            event: Box::new(deep),
            count: 2,
        };
    }
    assert!(matches!(
        deep.validate(),
        Err(AccountantError::UnsupportedEvent { .. })
    ));
}
