//! Golden values from upstream test suites and independent high-precision
//! evaluations. Every number names its source; the scripts that produced the
//! non-upstream ones are in tests/golden/. Values are quoted with every digit
//! their source printed.
#![allow(clippy::excessive_precision)]
// Upstream's parameters 3.14159, 2.71828, 6.28319 are used as written.
#![allow(clippy::approx_constant)]

use privmix_accountant::{
    Orders, RdpCurve, gaussian, pmixed_query, pmixed_subsampled, poisson_subsampled_gaussian,
    poisson_subsampled_gaussian_at, without_replacement_gaussian,
};

fn close(got: f64, want: f64, rtol: f64, atol: f64) -> bool {
    (got - want).abs() <= atol + rtol * want.abs()
}

/// dp_accounting 0.4.4, `rdp_privacy_accountant_test.py`,
/// `test_compute_rdp_poisson_sampled_gaussian`: q = 0.01, σ = 2.5, 50 steps,
/// orders [1.5, 2.5, 5, 50, 100, ∞], rtol 1e-4.
///
/// At α = 1.5 dp_accounting's value (6.70579741e-4) is 3.1 % *above* the true
/// value: its fractional series sums absolute values of alternating terms. The
/// exact value by mpmath quadrature (tests/golden/poisson_gaussian.py) is
/// 50·6.5007089718803974e-6/0.5; we match that and stay below upstream.
#[test]
fn dp_accounting_poisson_sampled_gaussian() {
    let steps = 50.0;
    let upstream = [
        (1.5, 6.705_797_41e-4),
        (2.5, 1.085_487_10e-3),
        (5.0, 2.180_756_56e-3),
        (50.0, 2.384_603_75e-2),
        (100.0, 1.674_163_08e2),
    ];
    for (alpha, want) in upstream {
        let got = steps * poisson_subsampled_gaussian_at(0.01, 2.5, alpha).unwrap();
        if alpha == 1.5 {
            let exact = steps * 6.500_708_971_880_397_4e-6 / 0.5;
            assert!(got < want, "α = 1.5: {got} not below upstream {want}");
            assert!(
                close(got, exact, 1e-9, 0.0) && got >= exact,
                "α = 1.5: {got} vs {exact}"
            );
        } else {
            assert!(close(got, want, 1e-4, 0.0), "α = {alpha}: {got} vs {want}");
        }
    }
    assert_eq!(
        poisson_subsampled_gaussian_at(0.01, 2.5, f64::INFINITY),
        Ok(f64::INFINITY)
    );
    // The same through a curve, composed 50 times.
    let orders = Orders::new(vec![1.5, 2.5, 5.0, 50.0, 100.0]).unwrap();
    let curve = poisson_subsampled_gaussian(&orders, 0.01, 2.5)
        .unwrap()
        .self_compose(50);
    assert!(close(curve.epsilons()[4], 1.674_163_08e2, 1e-4, 0.0));
}

/// dp_accounting `test_compute_log_a_equals_mp`: ln A_α against mpmath
/// quadrature, upstream tolerance rtol 1e-4, atol 1e-8. Quadrature values from
/// tests/golden/poisson_gaussian.py (finer splitting than upstream's). We hold
/// them to rtol 1e-9 and check we are never below.
#[test]
fn dp_accounting_log_a_equals_mp() {
    let cases: [(f64, f64, f64, f64); 10] = [
        (1e-7, 0.1, 1.01, 4.003_412_322_526_398_6e-8),
        (1e-6, 0.1, 256.0, 3_260_463.229_297_160_8),
        (1e-5, 0.1, 256.1, 3_263_607.039_788_421_3),
        (1e-6, 1.0, 27.0, 8.769_511_304_848_498e-10),
        (1e-4, 1.0, 1.5, 6.442_686_953_836_649_7e-9),
        (1e-3, 1.0, 2.0, 1.718_280_352_214_515_4e-6),
        (0.01, 10.0, 20.0, 1.912_969_991_284_296_3e-4),
        (0.1, 100.0, 20.5, 1.999_181_845_806_829_6e-4),
        (0.99, 0.1, 256.0, 3_263_997.427_114_021_1),
        (0.999, 100.0, 256.1, 3.260_108_037_973_112_7),
    ];
    for (q, sigma, alpha, want) in cases {
        let got = poisson_subsampled_gaussian_at(q, sigma, alpha).unwrap() * (alpha - 1.0);
        assert!(
            close(got, want, 1e-9, 0.0),
            "{q} {sigma} {alpha}: {got} vs {want}"
        );
        assert!(
            got >= want * (1.0 - 1e-12),
            "{q} {sigma} {alpha}: {got} below {want}"
        );
    }
}

/// Where dp_accounting's absolute-value series is far off (q near ½, α near 1,
/// large σ): its ln A is 0.0425 instead of 9.77e-5 at (0.5, 20, 1.25) and
/// 1.93e-4 instead of 1.39e-4 at (0.5, 1, 1.001). The signed series with the
/// Leibniz remainder bound matches mpmath quadrature
/// (tests/golden/poisson_gaussian.py, output in poisson_gaussian.out).
#[test]
fn fractional_series_where_absolute_sums_fail() {
    let cases: [(f64, f64, f64, f64); 3] = [
        (0.5, 20.0, 1.25, 9.770_201_921_928_059_2e-5),
        (0.5, 1.0, 1.001, 1.387_500_535_006_656_7e-4),
        (0.3, 5.0, 7.5, 9.382_410_998_784_508_7e-2),
    ];
    for (q, sigma, alpha, want) in cases {
        let got = poisson_subsampled_gaussian_at(q, sigma, alpha).unwrap() * (alpha - 1.0);
        assert!(
            close(got, want, 1e-9, 0.0),
            "{q} {sigma} {alpha}: {got} vs {want}"
        );
        assert!(
            got >= want * (1.0 - 1e-12),
            "{q} {sigma} {alpha}: {got} below {want}"
        );
    }
}

/// dp_accounting `test_compute_epsilon_delta_pure_dp`: orders 2..=32, RDP 1.1
/// everywhere, δ = 1e-5 → ε = 1.32783806176 at order 32, and back.
#[test]
fn dp_accounting_pure_dp_round_trip() {
    let orders = Orders::new((2..=32).map(f64::from).collect()).unwrap();
    let curve = RdpCurve::new(orders, vec![1.1; 31]).unwrap();
    let e = curve.epsilon(1e-5).unwrap();
    assert!(close(e.epsilon, 1.327_838_061_76, 0.0, 5e-8), "{e:?}");
    assert_eq!(e.order, 32.0);
    let d = curve.delta_with_order(1.327_838_061_76).unwrap();
    assert!(close(d.delta, 1e-5, 0.0, 5e-8), "{d:?}");
    assert_eq!(d.order, 32.0);
}

/// dp_accounting `test_compute_epsilon_delta_gaussian`: orders 1.001..99.999 in
/// steps of 0.001 (upstream starts at 1.0, which is not an RDP order here),
/// Gaussian σ = 4.530877117 chosen to give exactly (1, 1e-6)-DP.
#[test]
fn dp_accounting_gaussian_epsilon_one() {
    let orders = Orders::new((1001..100_000).map(|i| 0.001 * f64::from(i)).collect()).unwrap();
    let curve = gaussian(&orders, 4.530_877_117, 1.0).unwrap();
    let e = curve.epsilon(1e-6).unwrap();
    assert!(close(e.epsilon, 1.0, 0.0, 5e-8), "{e:?}");
    let d = curve.delta(1.0).unwrap();
    assert!(close(d, 1e-6, 0.0, 5e-8), "{d}");
}

/// dp_accounting `test_epsilon_delta_consistency`: orders 2..50, Poisson-sampled
/// Gaussians; ε(δ) then δ(ε) gives δ back (7 places), or δ = 1 when ε = ∞,
/// or ≤ δ when ε = 0. Upstream's σ = 0 case is a typed error here.
#[test]
fn dp_accounting_epsilon_delta_consistency() {
    let orders = Orders::new((2..50).map(f64::from).collect()).unwrap();
    for q in [0.0, 0.01, 0.1, 0.8, 1.0] {
        for sigma in [0.1, 1.0, 10.0, 100.0] {
            let curve = poisson_subsampled_gaussian(&orders, q, sigma).unwrap();
            for delta in [0.99, 0.9, 0.1, 0.01, 1e-3, 1e-5, 1e-9, 1e-12] {
                let eps = curve.epsilon(delta).unwrap().epsilon;
                let back = curve.delta(eps).unwrap();
                if eps == f64::INFINITY {
                    assert_eq!(back, 0.0);
                } else if eps == 0.0 {
                    assert!(back <= delta * (1.0 + 1e-12), "{q} {sigma} {delta}: {back}");
                } else {
                    assert!(close(back, delta, 0.0, 5e-8), "{q} {sigma} {delta}: {back}");
                }
            }
        }
    }
    assert!(poisson_subsampled_gaussian(&orders, 0.1, 0.0).is_err());
}

/// dp_accounting `test_delta_bounds_gaussian`: σ = 1, q = 1, orders 1.1..50.4;
/// for ε in 0..50 the RDP δ lies between the optimal Gaussian δ (Balle & Wang
/// 2018, Thm 8) and the "standard" bound exp(−(ε − ½)²/2).
#[test]
fn dp_accounting_delta_bounds_gaussian() {
    let orders = Orders::new((11..505).map(|x| 0.1 * f64::from(x)).collect()).unwrap();
    let curve = gaussian(&orders, 1.0, 1.0).unwrap();
    for x in 0..500 {
        let eps = 0.1 * f64::from(x);
        let delta = curve.delta(eps).unwrap();
        let erfc = libm::erfc;
        let optimal = erfc((eps - 0.5) / 2f64.sqrt()) / 2.0
            - eps.exp() * erfc((eps + 0.5) / 2f64.sqrt()) / 2.0;
        assert!(
            optimal <= delta + 1e-300,
            "ε = {eps}: {delta} < optimal {optimal}"
        );
        let standard = if eps >= 0.5 {
            (-0.5 * (eps - 0.5).powi(2)).exp()
        } else {
            1.0
        };
        assert!(
            delta <= standard + 1e-300,
            "ε = {eps}: {delta} > {standard}"
        );
    }
}

/// dp_accounting `test_zero_poisson_sample`, `test_compute_rdp_gaussian`,
/// `test_compute_rdp_multi_gaussian`, `test_rdp_composition`.
#[test]
fn dp_accounting_small_cases() {
    let orders = Orders::new(vec![3.14159]).unwrap();
    let zero = poisson_subsampled_gaussian(&orders, 0.0, 1.0).unwrap();
    assert_eq!(zero.epsilon(1e-10).unwrap().epsilon, 0.0);
    assert_eq!(zero.delta(1e-10).unwrap(), 0.0);

    let (alpha, s1, s2) = (3.14159f64, 2.71828f64, 6.28319f64);
    let g = gaussian(&orders, s1, 1.0).unwrap();
    assert!(close(g.epsilons()[0], alpha / (2.0 * s1 * s1), 1e-15, 0.0));
    let both = g.compose(&gaussian(&orders, s2, 1.0).unwrap()).unwrap();
    let want = alpha / (2.0 * s1 * s1) + alpha / (2.0 * s2 * s2);
    assert!(close(both.epsilons()[0], want, 1e-15, 0.0));

    let base = gaussian(&orders, 3.14159, 1.0).unwrap();
    let six = base.self_compose(6).epsilons()[0];
    let composed = (0..6).fold(RdpCurve::zero(orders.clone()), |acc, _| {
        acc.compose(&base).unwrap()
    });
    assert!(close(six, 6.0 * base.epsilons()[0], 1e-15, 0.0));
    assert!(close(composed.epsilons()[0], six, 1e-14, 0.0));
}

/// Opacus `tests/accountants_test.py::test_rdp_accountant`: σ = 1.5, q = 0.04,
/// 2250 steps, Opacus's default orders, δ = 1e-5 → ε = 7.32911117143
/// (assertAlmostEqual: 7 places). Opacus sums the fractional series with
/// signs, as the exact value requires; dp_accounting's absolute series gives
/// 7.32933 here.
#[test]
fn opacus_rdp_accountant() {
    let mut v: Vec<f64> = (1..100).map(|x| 1.0 + f64::from(x) / 10.0).collect();
    v.extend((12..64).map(f64::from));
    let orders = Orders::new(v).unwrap();
    let curve = poisson_subsampled_gaussian(&orders, 0.04, 1.5)
        .unwrap()
        .self_compose(2250);
    let e = curve.epsilon(1e-5).unwrap();
    assert!(close(e.epsilon, 7.329_111_171_43, 0.0, 5e-8), "{e:?}");
    assert!(e.epsilon >= 7.329_111_171_43 - 1e-9);
}

/// Opacus `accountants/analysis/rdp.py` module doctest: (q, σ, steps) =
/// (1e-5, 1.0, 10) and (1e-4, 3.0, 4), orders 2..=32, δ = 1e-5 → (0.336, 23).
#[test]
fn opacus_doctest() {
    let orders = Orders::new((2..=32).map(f64::from).collect()).unwrap();
    let a = poisson_subsampled_gaussian(&orders, 1e-5, 1.0)
        .unwrap()
        .self_compose(10);
    let b = poisson_subsampled_gaussian(&orders, 1e-4, 3.0)
        .unwrap()
        .self_compose(4);
    let e = a.compose(&b).unwrap().epsilon(1e-5).unwrap();
    assert!(close(e.epsilon, 0.336, 0.0, 5e-4), "{e:?}");
    assert_eq!(e.order, 23.0);
}

/// Sampling without replacement, Gaussian (WBK 2019 Thm 27): dp_accounting
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

/// Zhu & Wang 2019 (Poisson) and WBK 2019 Thm 9 (without replacement) for a
/// non-Gaussian base: the Laplace mechanism, scale 2 (Mironov 2017 Prop. 6),
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

/// PMixED Thm 3.1 (adapmixed.txt eq. 2) at α = 18, β = 0.001 with m = max(m, 2),
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
/// demonstrations without replacement (WBK 2019 Thm 9); mpmath values from
/// tests/golden/amplification.py.
#[test]
fn dps_mozo_token_matches_mpmath() {
    let orders = Orders::new(vec![2.0, 4.0, 8.0, 32.0]).unwrap();
    let total = privmix_accountant::dps_mozo_total(&orders, 0.05, 4.0 / 1000.0, 1).unwrap();
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

/// Opacus `tests/accountants_test.py::test_get_noise_multiplier_rdp_steps` and
/// `_rdp_epochs`: ε = 8, δ = 1e-5, q = 0.04, Opacus's default orders, 2000 steps
/// → σ = 1.3562; 90 epochs (2250 steps) → σ = 1.416 (4 places). Opacus bisects
/// until ε is within 0.01 *below* the target and returns that σ, so its value
/// sits slightly above the smallest feasible σ that we return: ours must be
/// feasible, no larger than Opacus's (up to its 4 places) and within the σ
/// change that 0.01 of ε allows.
#[test]
fn opacus_get_noise_multiplier() {
    let mut v: Vec<f64> = (1..100).map(|x| 1.0 + f64::from(x) / 10.0).collect();
    v.extend((12..64).map(f64::from));
    let orders = Orders::new(v).unwrap();
    for (steps, opacus) in [(2000u64, 1.3562), (2250, 1.416)] {
        let sigma =
            privmix_accountant::poisson_gaussian_sigma(&orders, 0.04, steps, 8.0, 1e-5).unwrap();
        let eps = |s: f64| {
            poisson_subsampled_gaussian(&orders, 0.04, s)
                .unwrap()
                .self_compose(steps)
                .epsilon(1e-5)
                .unwrap()
                .epsilon
        };
        assert!(eps(sigma) <= 8.0);
        assert!(sigma <= opacus + 5e-5, "{steps}: {sigma} vs {opacus}");
        assert!(
            eps(opacus + 5e-5) >= 8.0 - 0.01 - 1e-3,
            "{steps}: Opacus's σ is not within 0.01"
        );
        assert!(opacus - sigma < 5e-4, "{steps}: {sigma} vs {opacus}");
    }
}
