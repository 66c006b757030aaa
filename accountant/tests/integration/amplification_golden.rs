//! Golden values for amplification by subsampling and the mechanisms' events:
//! dp_accounting's sampling-without-replacement Gaussian, and mpmath
//! evaluations of the closed forms (tests/golden/amplification.py).
//! Values are quoted with every digit their source printed.
#![allow(clippy::excessive_precision)]

use privmix_accountant::{
    Orders, RdpCurve, dps_mozo_total, pmixed_query, pmixed_subsampled, without_replacement_gaussian,
};

fn close(got: f64, want: f64, rtol: f64, atol: f64) -> bool {
    (got - want).abs() <= atol + rtol * want.abs()
}

/// Sampling without replacement, Gaussian (WBK (arXiv:1808.00087) Thm 27): dp_accounting
/// `_compute_rdp_sample_wor_gaussian` (tests/golden/amplification.py).
#[test]
fn dp_accounting_without_replacement_gaussian() {
    let orders = Orders::new(vec![2.0, 3.0, 4.5, 8.0, 16.0, 64.0, 255.0, 256.0, 300.0]).unwrap();
    let cases: [(f64, f64, [f64; 9]); 2] = [
        (
            0.01,
            1.5,
            [
                0.000_223_824_348_504_282_23,
                0.000_339_191_665_262_167_4,
                0.000_525_465_012_421_322_6,
                0.000_951_119_448_543_267_4,
                0.002_055_641_289_565_426_3,
                9.554_956_433_043_609,
                52.046_094_815_302_88,
                52.268_377_436_212_84,
                62.048_412_791_697_2,
            ],
        ),
        (
            0.2,
            0.8,
            [
                0.323_284_701_029_530_4,
                0.678_211_066_891_741_6,
                1.742_000_385_116_593,
                4.509_765_120_315_15,
                10.829_476_039_127_652,
                48.376_017_790_234_556,
                197.605_704_643_739_59,
                198.386_968_790_578_12,
                232.762_497_570_067_95,
            ],
        ),
    ];
    for (q, sigma, want) in cases {
        let got = without_replacement_gaussian(&orders, q, sigma).unwrap();
        for ((&a, &g), &w) in orders.as_slice().iter().zip(got.epsilons()).zip(&want) {
            assert!(close(g, w, 1e-9, 0.0), "q {q} σ {sigma} α {a}: {g} vs {w}");
        }
    }
}

/// Zhu & Wang (ICML 2019) (Poisson) and WBK (arXiv:1808.00087) Thm 9 (without replacement) for a
/// non-Gaussian base: the Laplace mechanism, scale 2 (Mironov, arXiv:1702.07476, Prop. 6),
/// q = 0.05; mpmath values from tests/golden/amplification.py.
#[test]
fn general_curve_amplification_matches_mpmath() {
    let alphas = [2.0, 3.0, 5.0, 10.0, 32.0];
    let base_values = [
        0.200_303_896_173_615_962_23,
        0.271_226_432_307_256_763_76,
        0.355_265_318_404_910_277_08,
        0.428_690_386_467_274_833_49,
        0.478_148_425_045_426_260_85,
    ];
    let poisson = [
        0.000_554_281_343_187_006_045_1,
        0.000_834_387_087_633_320_115_85,
        0.001_399_856_287_106_239_475_7,
        0.002_837_437_838_038_500_749_9,
        0.009_122_660_913_301_180_827,
    ];
    let wor = [
        0.002_215_284_386_532_683_553_2,
        0.003_529_153_279_792_025_169,
        0.006_573_862_606_619_077_414_2,
        0.016_393_162_045_816_323_034,
        0.058_834_141_925_838_516_695,
    ];
    // The base curve at every integer 2..=32 (the tight bounds need them all).
    let laplace = |a: f64| {
        let b = 2.0;
        ((a / (2.0 * a - 1.0)) * ((a - 1.0) / b).exp()
            + ((a - 1.0) / (2.0 * a - 1.0)) * (-a / b).exp())
        .ln()
            / (a - 1.0)
    };
    let orders = Orders::integers(32).unwrap();
    // Round the f64 base up a hair so it bounds the exact curve.
    let base = RdpCurve::from_fn(orders.clone(), |a| laplace(a) * (1.0 + 1e-14)).unwrap();
    for (a, want) in alphas.iter().zip(base_values) {
        assert!(close(base.at(*a).unwrap(), want, 1e-13, 0.0));
    }
    let p = base.poisson_subsampled(0.05).unwrap();
    let w = base.sampled_without_replacement(0.05).unwrap();
    for (i, a) in alphas.iter().enumerate() {
        assert!(
            close(p.at(*a).unwrap(), poisson[i], 1e-11, 0.0),
            "Poisson α {a}"
        );
        assert!(p.at(*a).unwrap() >= poisson[i] * (1.0 - 1e-15));
        assert!(close(w.at(*a).unwrap(), wor[i], 1e-11, 0.0), "WOR α {a}");
    }
}

/// PMixED Thm 3.1 (arXiv:2410.02016, eq. 2) at α = 18, β = 0.001 with m = max(m, 2),
/// and its Poisson amplification (Thm A.4) at q = 0.1, β = 0.01; mpmath values
/// from tests/golden/amplification.py.
#[test]
fn pmixed_matches_mpmath() {
    let orders = Orders::new(vec![18.0]).unwrap();
    for (m, want) in [
        (1u64, 0.046_390_052_641_330_047_271),
        (2, 0.046_390_052_641_330_047_271),
        (10, 0.012_657_232_931_510_091_528),
        (100, 0.001_395_528_458_748_734_424_7),
    ] {
        let got = pmixed_query(&orders, 0.001, m).unwrap().epsilons()[0];
        assert!(
            close(got, want, 1e-13, 0.0) && got >= want,
            "m = {m}: {got}"
        );
    }
    let orders = Orders::new(vec![2.0, 4.0, 18.0]).unwrap();
    let sub = pmixed_subsampled(&orders, 0.01, 0.1).unwrap();
    let want = [
        0.000_416_348_653_244_268_634_72,
        0.000_846_566_721_593_857_258_66,
        0.004_450_966_761_048_980_381_7,
    ];
    for (g, w) in sub.epsilons().iter().zip(want) {
        assert!(
            close(*g, w, 1e-12, 0.0) && *g >= w * (1.0 - 1e-15),
            "{g} vs {w}"
        );
    }
}

/// DPS-MOZO per-token `4βα` (β = 0.05) amplified by sampling 4 of 1000
/// demonstrations without replacement (WBK (arXiv:1808.00087) Thm 9); mpmath values from
/// tests/golden/amplification.py.
#[test]
fn dps_mozo_token_matches_mpmath() {
    let orders = Orders::new(vec![2.0, 4.0, 8.0, 32.0]).unwrap();
    let total = dps_mozo_total(&orders, 0.05, 4.0 / 1000.0, 1).unwrap();
    let want = [
        3.147_628_526_557_664_357_9e-5,
        6.351_602_406_264_855_544_2e-5,
        1.293_057_313_488_772_324_4e-4,
        0.723_857_817_369_563_308_91,
    ];
    for (g, w) in total.epsilons().iter().zip(want) {
        assert!(
            close(*g, w, 1e-11, 0.0) && *g >= w * (1.0 - 1e-15),
            "{g} vs {w}"
        );
    }
}
