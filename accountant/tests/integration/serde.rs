//! The `serde` feature: values round-trip through JSON, and what is read back
//! passes the same checks as construction (run with `--features serde`).
#![cfg(feature = "serde")]

use privmix_accountant::{DpEvent, EpsilonDelta, Orders, RdpCurve};
use serde_json::{from_str, json, to_string, to_value};

fn curve() -> RdpCurve {
    RdpCurve::new(
        Orders::new(vec![1.5, 2.0, 64.0]).unwrap(),
        vec![0.0, 0.1 + 0.2, f64::INFINITY],
    )
    .unwrap()
}

fn every_event() -> DpEvent {
    DpEvent::Composed(vec![
        DpEvent::NoOp,
        DpEvent::gaussian(1.1)
            .unwrap()
            .poisson_sampled(0.01)
            .unwrap(),
        DpEvent::laplace(0.5)
            .unwrap()
            .sampled_without_replacement(1000, 10)
            .unwrap()
            .self_composed(100)
            .unwrap(),
        DpEvent::randomized_response(2.0, 4).unwrap(),
        DpEvent::PmixedQuery {
            beta: 0.01,
            members: 16,
        },
        DpEvent::PmixedSubsampled {
            beta: 0.01,
            sampling_probability: 0.25,
        },
        DpEvent::DpsMozoToken { beta: 0.1 },
        DpEvent::AdapmixedScreening {
            lambda: 1e-4,
            members: 80,
            sigma: 0.01,
        },
        DpEvent::Measured(curve()),
        DpEvent::DataDependent(curve()),
    ])
}

#[test]
fn values_round_trip_bit_exact() {
    let o: Orders = from_str(&to_string(&Orders::default()).unwrap()).unwrap();
    assert_eq!(o, Orders::default());
    let c: RdpCurve = from_str(&to_string(&curve()).unwrap()).unwrap();
    let bits = |c: &RdpCurve| c.epsilons().iter().map(|x| x.to_bits()).collect::<Vec<_>>();
    assert_eq!(bits(&c), bits(&curve()));
    let e = every_event();
    let back: DpEvent = from_str(&to_string(&e).unwrap()).unwrap();
    assert_eq!(back, e);
    let ed = curve().epsilon(1e-5).unwrap();
    let back: EpsilonDelta = from_str(&to_string(&ed).unwrap()).unwrap();
    assert_eq!(back, ed);
}

#[test]
fn the_json_shape_is_plain() {
    assert_eq!(
        to_value(DpEvent::gaussian(2.0).unwrap()).unwrap(),
        json!({"gaussian": {"noise_multiplier": 2.0}})
    );
    assert_eq!(to_value(DpEvent::NoOp).unwrap(), json!("no_op"));
    // +∞ (no guarantee) is null, and null reads back as +∞.
    assert_eq!(
        to_value(curve()).unwrap(),
        json!({"orders": [1.5, 2.0, 64.0], "epsilons": [0.0, 0.30000000000000004, null]})
    );
    let ed: EpsilonDelta = from_str(r#"{"epsilon": null, "delta": 1e-6, "order": 2.0}"#).unwrap();
    assert_eq!(ed.epsilon, f64::INFINITY);
}

#[test]
fn invalid_input_is_rejected() {
    let bad = |what: &str, text: &str, needle: &str| {
        let err = match what {
            "orders" => from_str::<Orders>(text).map(drop),
            "curve" => from_str::<RdpCurve>(text).map(drop),
            "ed" => from_str::<EpsilonDelta>(text).map(drop),
            _ => from_str::<DpEvent>(text).map(drop),
        }
        .expect_err(text)
        .to_string();
        assert!(err.contains(needle), "{text}: {err}");
    };
    bad("orders", "[]", "empty");
    bad("orders", "[2.0, 1.0]", "invalid");
    bad("orders", "[3.0, 2.0]", "ascending");
    bad("orders", "[2.0, 2.0]", "ascending");
    bad(
        "curve",
        r#"{"orders": [2.0], "epsilons": [-0.5]}"#,
        "invalid",
    );
    bad(
        "curve",
        r#"{"orders": [2.0, 3.0], "epsilons": [0.5]}"#,
        "1 RDP values given for 2 orders",
    );
    bad(
        "curve",
        r#"{"orders": [2.0], "epsilons": [0.5], "extra": 1}"#,
        "unknown field",
    );
    bad(
        "ed",
        r#"{"epsilon": -1.0, "delta": 1e-6, "order": 2.0}"#,
        "ε",
    );
    bad("ed", r#"{"epsilon": 1.0, "delta": 1.5, "order": 2.0}"#, "δ");
    bad(
        "ed",
        r#"{"epsilon": 1.0, "delta": 0.5, "order": 1.0}"#,
        "order",
    );
    bad(
        "event",
        r#"{"gaussian": {"noise_multiplier": -1.0}}"#,
        "sigma",
    );
    bad("event", r#"{"laplace": {"scale": 0.0}}"#, "scale");
    bad(
        "event",
        r#"{"randomized_response": {"epsilon": 1.0, "categories": 1}}"#,
        "categories",
    );
    bad(
        "event",
        r#"{"composed": [{"no_op": null}, {"dps_mozo_token": {"beta": -2.0}}]}"#,
        "",
    );
    bad(
        "event",
        r#"{"composed": ["no_op", {"dps_mozo_token": {"beta": -2.0}}]}"#,
        "beta",
    );
    bad(
        "event",
        r#"{"poisson_sampled": {"sampling_probability": 0.5, "event": {"randomized_response": {"epsilon": 1.0, "categories": 2}}}}"#,
        "add/remove",
    );
    bad(
        "event",
        r#"{"sampled_without_replacement": {"source_size": 3, "sample_size": 4, "event": "no_op"}}"#,
        "sample_size",
    );
    bad(
        "event",
        r#"{"measured": {"orders": [2.0], "epsilons": [-1.0]}}"#,
        "invalid",
    );
    bad("event", r#"{"gaussian": {"sigma": 1.0}}"#, "unknown field");
}
