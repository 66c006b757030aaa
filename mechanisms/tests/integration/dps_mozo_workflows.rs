//! DPS-MOZO's +On/+Off workflows and the ICL baselines: what each charges.

use privmix_accountant::{Budget, Orders};
use privmix_mechanisms::{
    DpDemonstration, DpFewShot, DpsMozo, DpsMozoConfig, FewShotProduct, FewShotSource,
    IclMechanism, IclSource, MechanismError, PrivacyRng, PublicReason, Unbudgeted, ZeroShot,
    generate_dp_demonstrations, generate_icl,
};

struct Table {
    zero: Vec<f64>,
    demos: Vec<Vec<f64>>,
}

impl IclSource for Table {
    fn demonstrations(&self) -> usize {
        self.demos.len()
    }
    fn zero_shot_logits(&mut self, context: &[u32]) -> Result<Vec<f64>, MechanismError> {
        let mut z = self.zero.clone();
        let i = context.len() % z.len();
        z[i] += 1.0;
        Ok(z)
    }
    fn one_shot_logits(&mut self, demo: usize, _: &[u32]) -> Result<Vec<f64>, MechanismError> {
        Ok(self.demos[demo].clone())
    }
}

fn table() -> Table {
    Table {
        zero: vec![0.5, 0.4, 0.3, 0.2, -5.0],
        demos: vec![
            vec![3.0, 0.0, 0.0, 0.0, 0.0],
            vec![0.0, 3.0, 0.0, 0.0, 0.0],
            vec![0.0, 0.0, 3.0, 0.0, 0.0],
        ],
    }
}

/// Few-shot logits that only look at the DP demonstrations' outputs.
struct FromDemos;

impl FewShotSource for FromDemos {
    fn few_shot_logits(
        &mut self,
        demos: &[DpDemonstration],
        _: &[u32],
    ) -> Result<Vec<f64>, MechanismError> {
        let mut l = vec![0.0; 5];
        for d in demos {
            for &t in &d.output {
                l[t as usize] += 1.0;
            }
        }
        Ok(l)
    }
}

#[test]
fn offline_demonstrations_cost_once_and_their_use_costs_nothing() {
    let orders = Orders::integers(32).unwrap();
    let config = DpsMozoConfig::new(2, 4, 0.1).unwrap();
    let mut m = DpsMozo::new(config);
    let mut account = Budget::new(orders.clone(), 50.0, 1e-5).unwrap();
    let mut rng = PrivacyRng::from_seed(2);
    let inputs = vec![vec![1, 2], vec![3]];
    let demos = generate_dp_demonstrations(
        &mut m,
        &mut table(),
        &inputs,
        4,
        None,
        &mut rng,
        &mut account,
    )
    .unwrap();
    assert_eq!(demos.demonstrations().len(), 2);
    assert!(demos.demonstrations().iter().all(|d| d.output.len() == 4));
    let per_token = config.token_charge(&orders, 3).unwrap();
    for (c, one) in demos.cost().epsilons().iter().zip(per_token.epsilons()) {
        assert!((c - 8.0 * one).abs() <= 1e-12 * c);
    }
    let spent = account.spent().clone();
    assert_eq!(&spent, demos.cost());
    // Online phase: any number of queries, nothing more spent.
    let online = DpFewShot::new(&demos, 3).unwrap();
    for _ in 0..100 {
        let out = online
            .step(&mut FromDemos, &[9], &mut rng, &mut account)
            .unwrap();
        assert!(out.charge.epsilons().iter().all(|&e| e == 0.0));
        assert_eq!(
            out.diagnostics.public_reason,
            Some(PublicReason::PublicOnly)
        );
    }
    assert_eq!(account.spent(), &spent);
}

#[test]
fn baselines_charge_infinity_and_zero_honestly() {
    let orders = Orders::integers(16).unwrap();
    let config = DpsMozoConfig::new(2, 4, 0.1).unwrap();
    let mut rng = PrivacyRng::from_seed(3);
    let mut unbudgeted = Unbudgeted::new(orders.clone());
    let mut few = FewShotProduct::new(config);
    let out = few
        .step(&mut table(), &[], &mut rng, &mut unbudgeted)
        .unwrap();
    assert!(out.charge.epsilons().iter().all(|&e| e == f64::INFINITY));
    assert!(out.diagnostics.lambdas.iter().all(|&l| l == 1.0));
    // A real budget refuses the non-private baseline outright.
    let mut budget = Budget::new(orders.clone(), 1e3, 1e-5).unwrap();
    assert!(matches!(
        few.step(&mut table(), &[], &mut rng, &mut budget),
        Err(MechanismError::ChargeRefused(_))
    ));
    let mut zero = ZeroShot::new(4).unwrap();
    let g = generate_icl(
        &mut zero,
        &mut table(),
        &[],
        50,
        None,
        &mut rng,
        &mut budget,
    )
    .unwrap();
    assert!(budget.spent().epsilons().iter().all(|&e| e == 0.0));
    // Token 4 is outside the zero-shot top-4 and never produced.
    assert!(g.tokens.iter().all(|&t| t < 4));
    assert!(ZeroShot::new(0).is_err());
}
