//! One step's mechanisms, for every request at once: each request's mechanism runs
//! on its own rows in one parallel region, its charges recorded (not yet committed)
//! and its token drawn (not yet released).
//!
//! Each token is sealed with its charges (`privmix_mechanisms::step_loop::Drawn`):
//! the engine then commits the recorded charges to the ledger store in request
//! order through the step loop (`engine.rs`, `commit_step`), which unseals only the
//! tokens whose charges were accepted: a refused charge drops that request's token alone, and no
//! token leaves the process before the commit that covers it has returned. A
//! mechanism's own state may count a charge the store then refuses (the request
//! ends there): an over-count, never an under-count.

use privmix_accountant::Orders;
use privmix_mechanisms::step_loop::Drawn;
use privmix_mechanisms::{Ensemble, EnsembleMechanism, MechanismError, PrivacyRng, Rows};
use rayon::prelude::*;

use crate::ledger_store::StepAccount;
use crate::temper::temper_log_probs;

/// A request's mechanism and the buffers its steps reuse.
pub struct MechanismState {
    mechanism: Box<dyn EnsembleMechanism + Send>,
    rng: PrivacyRng,
    /// The rows as probabilities (tempered first where asked).
    probs: Vec<f32>,
    /// The tempered log-probabilities.
    tempered: Vec<f32>,
    ensemble: Option<Ensemble>,
    /// The step's outcome: the token drawn, sealed with what the mechanism charged,
    /// collected (the store's step commit decides); idle when it did not step.
    pub drawn: Drawn<usize, StepAccount>,
}

impl MechanismState {
    /// A request's mechanism with its own generator (seeded by the OS).
    pub fn new(mechanism: Box<dyn EnsembleMechanism + Send>) -> Result<Self, MechanismError> {
        Ok(Self {
            mechanism,
            rng: PrivacyRng::from_os()?,
            probs: Vec::new(),
            tempered: Vec::new(),
            ensemble: None,
            drawn: Drawn::idle(),
        })
    }

    /// One mechanism step on `log_probs` (the request's public row, then its
    /// member rows, `vocab` natural-log probabilities each) at `temperature`:
    /// the rows turned into probabilities, validated into the reused ensemble,
    /// the mechanism's output computed and a token drawn, sealed in `self.drawn` with
    /// the charges it collected.
    fn step(&mut self, log_probs: &[f32], vocab: usize, temperature: f64, orders: &Orders) {
        self.drawn = Drawn::idle();
        let rows = if temperature == 1.0 {
            log_probs
        } else {
            temper_log_probs(log_probs, vocab, temperature, &mut self.tempered);
            &self.tempered[..]
        };
        self.probs.clear();
        self.probs.extend_from_slice(rows);
        // e^{log p} in f32 lanes: every entry ≤ 0, so each result lies in [0, 1].
        privmix_models::cpu::vexp::exp_shifted_in_place(&mut self.probs, 0.0);
        let ensemble = match Ensemble::renew_or_new(
            self.ensemble.take(),
            Rows::ProbF32(&self.probs[..vocab]),
            Rows::ProbF32(&self.probs[vocab..]),
        ) {
            Ok(e) => e,
            Err(e) => {
                // A row failed the checks (a non-finite entry, …): this request fails
                // (the engine publishes the kind of problem only).
                self.drawn = Drawn::from_step(Err(e), None);
                return;
            }
        };
        let mut account = StepAccount::new(orders.clone());
        let stepped = self.mechanism.step(&ensemble, &mut self.rng, &mut account);
        self.drawn = Drawn::from_step(stepped.map(|outcome| outcome.token), Some(account));
        self.ensemble = Some(ensemble);
    }
}

/// A request's part of a step: its state, its rows and its temperature.
pub struct StepInput<'a> {
    /// The request's mechanism.
    pub state: &'a mut MechanismState,
    /// Its rows' log-probabilities.
    pub log_probs: &'a [f32],
    /// Its temperature.
    pub temperature: f64,
}

/// Every request's mechanism step, in one parallel region.
pub fn step_all(inputs: Vec<StepInput<'_>>, vocab: usize, orders: &Orders) {
    inputs.into_par_iter().for_each(|i| {
        i.state.step(i.log_probs, vocab, i.temperature, orders);
    });
}

#[cfg(test)]
mod tests {
    use super::*;
    use privmix_accountant::Orders;
    use privmix_mechanisms::step_loop::{ChargeSink, Settled, Verdict, commit_one};
    use privmix_mechanisms::{Pmixed, PmixedConfig};

    use crate::ledger_store::PendingCharge;

    fn log_rows(rows: &[[f64; 3]]) -> Vec<f32> {
        rows.iter()
            .flat_map(|r| r.iter().map(|&p| p.ln() as f32))
            .collect()
    }

    /// A sink that accepts every charge and keeps them.
    struct Keep(Vec<PendingCharge>);

    impl ChargeSink<PendingCharge> for Keep {
        type Error = std::convert::Infallible;

        fn commit(
            &mut self,
            charges: &[PendingCharge],
        ) -> Result<Vec<Verdict>, std::convert::Infallible> {
            self.0.extend_from_slice(charges);
            Ok(vec![Verdict::Accepted; charges.len()])
        }
    }

    #[test]
    fn a_step_records_its_charge_and_draws_a_token() {
        let orders = Orders::default();
        let pmixed = Pmixed::new(PmixedConfig::new(36.0, 0.5, 1.0).unwrap());
        let mut state = MechanismState::new(Box::new(pmixed)).unwrap();
        let rows = log_rows(&[[0.5, 0.3, 0.2], [0.4, 0.4, 0.2], [0.6, 0.2, 0.2]]);
        step_all(
            vec![StepInput {
                state: &mut state,
                log_probs: &rows,
                temperature: 1.0,
            }],
            3,
            &orders,
        );
        let drawn = std::mem::replace(&mut state.drawn, Drawn::idle());
        let mut sink = Keep(Vec::new());
        let (settled, _) = commit_one(drawn.map_charge(|a| a.into_charge(None)), &mut sink);
        let Settled::Released {
            output,
            charge: Some(charge),
        } = settled
        else {
            panic!("not released: {settled:?}");
        };
        assert!(output < 3);
        // The token was sealed with its charge: the one the mechanism charges an
        // account itself, committed before the token came back.
        assert_eq!(sink.0.len(), 1);
        let mut direct = Pmixed::new(PmixedConfig::new(36.0, 0.5, 1.0).unwrap());
        assert_eq!(
            &charge.cost.curve(&orders).unwrap(),
            direct.charge_curve(&orders, 2).unwrap()
        );
    }

    #[test]
    fn a_bad_row_fails_the_request_without_a_charge() {
        let orders = Orders::default();
        let pmixed = Pmixed::new(PmixedConfig::new(36.0, 0.5, 1.0).unwrap());
        let mut state = MechanismState::new(Box::new(pmixed)).unwrap();
        let mut rows = log_rows(&[[0.5, 0.3, 0.2], [0.4, 0.4, 0.2]]);
        rows[4] = f32::NAN;
        step_all(
            vec![StepInput {
                state: &mut state,
                log_probs: &rows,
                temperature: 1.0,
            }],
            3,
            &orders,
        );
        let drawn = std::mem::replace(&mut state.drawn, Drawn::idle());
        let mut sink = Keep(Vec::new());
        let (settled, _) = commit_one(drawn.map_charge(|a| a.into_charge(None)), &mut sink);
        assert!(matches!(settled, Settled::Failed(_)), "{settled:?}");
        assert!(sink.0.is_empty());
    }
}
