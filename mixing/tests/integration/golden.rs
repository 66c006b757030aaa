//! λ values computed independently with mpmath at 60 digits by `tests/fixtures/golden.py`
//! (textbook definitions of the divergences, 200-step bisection): every solver's λ must lie
//! within the tolerance below the exact supremum, and never above it beyond rounding.

use privmix_mixing::{LAMBDA_TOLERANCE, LogitMixing, PmixedProjection, SubmixPairProjection};
use privmix_renyi::Order;
use serde_json::Value;

fn floats(v: &Value) -> Vec<f64> {
    v.as_array()
        .unwrap()
        .iter()
        .map(|x| x.as_f64().unwrap())
        .collect()
}

fn order(v: &Value) -> Order {
    match v {
        Value::String(s) if s == "inf" => Order::Infinite,
        v => Order::new(v.as_f64().unwrap()).unwrap(),
    }
}

#[test]
fn solvers_match_mpmath() {
    let cases: Vec<Value> = serde_json::from_str(include_str!("../fixtures/golden.json")).unwrap();
    assert_eq!(cases.len(), 13);
    for case in &cases {
        let (alpha, bound) = (order(&case["alpha"]), case["bound"].as_f64().unwrap());
        let exact: f64 = case["lambda"].as_str().unwrap().parse().unwrap();
        let sol = match case["kind"].as_str().unwrap() {
            "pmixed" => {
                let (p, q) = (floats(&case["private"]), floats(&case["public"]));
                PmixedProjection::new(&p, &q, alpha, bound)
                    .unwrap()
                    .solve()
                    .unwrap()
            }
            "submix" => {
                let (h, hp, q) = (
                    floats(&case["h"]),
                    floats(&case["h_prime"]),
                    floats(&case["public"]),
                );
                SubmixPairProjection::new(&h, &hp, &q, alpha, bound)
                    .unwrap()
                    .solve()
                    .unwrap()
            }
            "logit" => {
                let (l1, l0) = (floats(&case["one_shot"]), floats(&case["zero_shot"]));
                LogitMixing::new(&l1, &l0, alpha, bound)
                    .unwrap()
                    .solve()
                    .unwrap()
            }
            other => panic!("unknown kind {other}"),
        };
        assert!(sol.value <= bound, "{case}: {sol:?}");
        // Rounding of the f64 evaluator moves the boundary by ~1e-16/slope.
        assert!(
            sol.lambda <= exact + 1e-12,
            "{case}: {sol:?} above the supremum {exact}"
        );
        assert!(
            exact - sol.lambda <= LAMBDA_TOLERANCE + 1e-12,
            "{case}: {sol:?} vs {exact}"
        );
        assert!(sol.evaluations <= 9, "{case}: {sol:?}");
    }
}
