//! SubMix's released outputs, for the transcript engine.
//!
//! SubMix has no coin before the token. Its release on k parts must be the verifier's
//! average of each part's mixture, and each part's mixture is the released output of a
//! one-part SubMix on that part's two halves (a part's λ depends on its halves and p₀
//! only), checked to lie on the segment from p₀ to the verifier's own half-average
//! `h̄ = (a + b)/2` and inside the anchoring ball `Dsym_{α_c}(·, p₀) ≤ b` with the
//! verifier's own divergence. The law is built from the released distribution; the
//! reported λs are checked against the released outputs, never used.

use std::collections::HashMap;

use privmix_accountant::Orders;
use privmix_mechanisms::{
    Ensemble, EnsembleMechanism, PrivacyRng, SubMix, SubmixConfig, Unbudgeted,
};

use super::pmixed::{assert_close, assert_proportional, average, check_in_ball};
use super::{Acct, Branch, mix};

/// Each part's released mixture, cached by the bits of p₀ and its halves.
#[derive(Default)]
pub struct Parts {
    cache: HashMap<Vec<u64>, Vec<f64>>,
}

/// The verifier's half-average of a part.
pub fn hbar(a: &[f64], b: &[f64]) -> Vec<f64> {
    a.iter().zip(b).map(|(x, y)| 0.5 * (x + y)).collect()
}

impl Parts {
    pub fn get(&mut self, c: &SubmixConfig, public: &[f64], a: &[f64], b: &[f64]) -> Vec<f64> {
        let key: Vec<u64> = public
            .iter()
            .chain(a)
            .chain(b)
            .map(|x| x.to_bits())
            .collect();
        if let Some(m) = self.cache.get(&key) {
            return m.clone();
        }
        let one = SubmixConfig::new(1, c.alpha(), c.beta(), c.alpha_c(), c.radius()).unwrap();
        let e = Ensemble::from_probabilities(public, &[a, b].concat()).unwrap();
        let mut account = Unbudgeted::new(Orders::new(vec![2.0]).unwrap());
        let released = SubMix::new(one)
            .release(&e, &mut PrivacyRng::from_seed(0), &mut account)
            .unwrap()
            .distribution;
        check_in_ball(
            &released,
            &hbar(a, b),
            public,
            c.alpha_c(),
            c.radius(),
            "a part's mixture",
        );
        self.cache.insert(key, released.clone());
        released
    }
}

/// The one branch of a SubMix step of `mech` (any mechanism claiming to be SubMix with
/// `config`): its release, checked against the verifier's recomputation, and its
/// reports against the release.
pub fn branches<M: EnsembleMechanism + Clone>(
    config: &SubmixConfig,
    parts: &mut Parts,
    mech: &M,
    account: &Acct,
    public: &[f64],
    members: &[Vec<f64>],
) -> Vec<Branch<M>> {
    let k = members.len() / 2;
    let own: Vec<Vec<f64>> = (0..k)
        .map(|i| parts.get(config, public, &members[2 * i], &members[2 * i + 1]))
        .collect();
    let e = Ensemble::from_probabilities(public, &members.concat()).unwrap();
    let mut m = mech.clone();
    let mut a = account.clone();
    let result = m.release(&e, &mut PrivacyRng::from_seed(1), &mut a);
    if let Ok(r) = &result {
        assert_proportional(
            &r.distribution,
            &average(&own, public.len()),
            "SubMix's release",
        );
        assert_eq!(r.diagnostics.lambdas.len(), k, "reported λs");
        for (i, &lambda) in r.diagnostics.lambdas.iter().enumerate() {
            let h = hbar(&members[2 * i], &members[2 * i + 1]);
            assert_close(
                &mix(lambda, &h, public),
                &own[i],
                &format!("part {i}'s reported λ {lambda}"),
            );
        }
    }
    vec![Branch {
        weight: 1.0,
        mech: m,
        account: a,
        result,
    }]
}
