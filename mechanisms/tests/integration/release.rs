//! `EnsembleMechanism::release` and `step`: for every ensemble mechanism, the
//! released distribution is a probability vector, the charge is the one the
//! account received, and `step` draws its token from exactly that distribution
//! (same seed: release, then one draw, gives step's token and charge).

use privmix_accountant::Orders;
use privmix_mechanisms::baselines::{
    Gnmax, NonPrivateEnsemble, PublicOnly, SubsampleAggregateLaplace,
};
use privmix_mechanisms::{
    Adapmixed, AdapmixedConfig, Ensemble, EnsembleMechanism, Pmixed, PmixedConfig, PrivacyRng,
    SubMix, SubmixConfig, Unbudgeted, sample_index,
};
use proptest::prelude::*;

fn distribution(v: usize) -> impl Strategy<Value = Vec<f64>> {
    (prop::collection::vec(0.0f64..1.0, v), 1u32..6).prop_map(|(w, p)| {
        let mut w: Vec<f64> = w.into_iter().map(|x| x.powi(p as i32)).collect();
        if w.iter().all(|&x| x == 0.0) {
            w[0] = 1.0;
        }
        let s: f64 = w.iter().sum();
        w.into_iter().map(|x| x / s).collect()
    })
}

/// An ensemble of an even number (2..=8) of members over V in 2..=16.
fn ensemble() -> impl Strategy<Value = Ensemble> {
    (2usize..=16, 1usize..=4).prop_flat_map(|(v, half)| {
        (
            distribution(v),
            prop::collection::vec(distribution(v), 2 * half),
        )
            .prop_map(|(p0, rows)| Ensemble::from_probabilities(&p0, &rows.concat()).unwrap())
    })
}

fn mechanisms(n: usize) -> Vec<Box<dyn EnsembleMechanism>> {
    vec![
        Box::new(PublicOnly),
        Box::new(NonPrivateEnsemble),
        Box::new(Pmixed::new(PmixedConfig::new(8.0, 0.5, 0.6).unwrap())),
        Box::new(
            Adapmixed::new(AdapmixedConfig {
                top_k: 4,
                tracked_orders: Some(vec![2.0, 4.0]),
                ..AdapmixedConfig::default()
            })
            .unwrap(),
        ),
        Box::new(SubMix::new(
            SubmixConfig::new(n / 2, 2.0, 0.1, 8.0, 0.5).unwrap(),
        )),
        Box::new(SubsampleAggregateLaplace::new(0.5).unwrap()),
        Box::new(Gnmax::new(1.0).unwrap()),
    ]
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(64))]

    #[test]
    fn step_samples_the_released_distribution(e in ensemble(), seed in any::<u64>()) {
        let orders = Orders::new(vec![2.0, 4.0, 8.0]).unwrap();
        for (mut a, mut b) in mechanisms(e.len()).into_iter().zip(mechanisms(e.len())) {
            let mut account = Unbudgeted::new(orders.clone());
            let mut rng = PrivacyRng::from_seed(seed);
            let release = a.release(&e, &mut rng, &mut account).unwrap();
            let sum: f64 = release.distribution.iter().sum();
            prop_assert_eq!(release.distribution.len(), e.vocab());
            prop_assert!(release.distribution.iter().all(|&p| p >= 0.0 && p.is_finite()));
            prop_assert!((sum - 1.0).abs() < 1e-9, "{} sums to {}", a.name(), sum);
            prop_assert_eq!(account.spent(), &release.charge, "{}", a.name());
            let token = sample_index(&release.distribution, &mut rng).unwrap();

            let mut account = Unbudgeted::new(orders.clone());
            let mut rng = PrivacyRng::from_seed(seed);
            let step = b.step(&e, &mut rng, &mut account).unwrap();
            prop_assert_eq!(step.token, token, "{}", b.name());
            prop_assert_eq!(&step.charge, &release.charge);
            prop_assert_eq!(&step.diagnostics, &release.diagnostics);
        }
    }
}
