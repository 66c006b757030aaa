//! The sharpened zero-shot control: the zero-shot law on its top k at
//! temperature 1/n_shots. DPS-MOZO+On (arXiv:2501.19287, Alg. 1) mixes each of
//! its `n_shots` one-shot laws with the zero-shot law by λ and releases their
//! normalised product; at λ = 0 every factor is the zero-shot law on its top k,
//! and the product of n copies of softmax(l) is softmax(n·l). So +On's gain over
//! the plain zero-shot row (temperature 1) holds a part that needs no private
//! demonstration at all; this control measures that part. It is DPS-MOZO's own
//! product step ([`dps_mozo_output`]) at radius 0 (so λ = 0) with the zero-shot
//! row in place of every one-shot row: it reads no demonstration, so each token
//! is charged zero.

use privmix_mechanisms::{
    Account, DpsMozoConfig, IclMechanism, IclOutput, IclSource, MechanismError, PrivacyRng,
    StepOutcome, dps_mozo_output, zero_shot_step,
};

/// Zero-shot on the top k at temperature 1/`n_shots`.
#[derive(Debug, Clone)]
pub struct SharpenedZeroShot {
    /// DPS-MOZO's configuration at radius 0: every λ is 0.
    at_lambda_zero: DpsMozoConfig,
}

impl SharpenedZeroShot {
    /// The control for DPS-MOZO with `n_shots` ≥ 1 demonstrations per token and
    /// a top-k of `top_k` ≥ 1.
    pub fn new(top_k: usize, n_shots: usize) -> Result<Self, MechanismError> {
        if n_shots == 0 {
            return Err(MechanismError::InvalidParameter {
                name: "n_shots",
                value: 0.0,
                reason: "at least one factor in the product",
            });
        }
        Ok(Self {
            at_lambda_zero: DpsMozoConfig::new(n_shots, top_k, 0.0)?,
        })
    }

    /// Log-probabilities on the zero-shot top-k support of `zero_shot` logits,
    /// with the support: DPS-MOZO's product at λ = 0, which is
    /// log softmax(n · log softmax(l)) = log softmax(n · l).
    pub fn output(&self, zero_shot: &[f64]) -> Result<(Vec<f64>, Vec<usize>), MechanismError> {
        let out = self.product(zero_shot)?;
        Ok((out.log_probs, out.support))
    }

    /// DPS-MOZO's product step at λ = 0 on `zero_shot` logits.
    fn product(&self, zero_shot: &[f64]) -> Result<IclOutput, MechanismError> {
        let rows = vec![zero_shot; self.at_lambda_zero.n_shots()];
        dps_mozo_output(&self.at_lambda_zero, zero_shot, &rows)
    }
}

impl IclMechanism for SharpenedZeroShot {
    fn step(
        &mut self,
        source: &mut dyn IclSource,
        context: &[u32],
        rng: &mut PrivacyRng,
        account: &mut dyn Account,
    ) -> Result<StepOutcome, MechanismError> {
        zero_shot_step(
            |z| self.product(z),
            "zero-shot at temperature 1/n_shots",
            source,
            context,
            rng,
            account,
        )
    }

    fn name(&self) -> &'static str {
        "zero-shot (T = 1/n)"
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use privmix_mechanisms::ZeroShot;

    /// At radius 0 (λ = 0) DPS-MOZO's released law, whatever the one-shot
    /// rows, is the zero-shot law on its top k at temperature 1/n, computed
    /// here directly: softmax(n · l) over the k largest logits.
    #[test]
    fn equals_dps_mozo_at_lambda_zero_and_the_tempered_zero_shot() {
        let zero = [2.0, 0.5, -1.0, 1.5, -3.0, 0.0];
        let rows: Vec<Vec<f64>> = vec![
            vec![0.0, 3.0, 1.0, -2.0, 0.5, 1.0],
            vec![1.0, -1.0, 2.0, 0.0, 0.0, 0.5],
            vec![-0.5, 0.0, 0.0, 2.5, 1.0, -1.0],
        ];
        let control = SharpenedZeroShot::new(4, rows.len()).unwrap();
        let (log_probs, support) = control.output(&zero).unwrap();
        let refs: Vec<&[f64]> = rows.iter().map(Vec::as_slice).collect();
        let mozo = dps_mozo_output(
            &DpsMozoConfig::new(rows.len(), 4, 0.0).unwrap(),
            &zero,
            &refs,
        )
        .unwrap();
        assert_eq!(support, mozo.support);
        for (a, b) in log_probs.iter().zip(&mozo.log_probs) {
            assert!((a - b).abs() < 1e-12, "{a} vs {b}");
        }
        // The top 4 logits 2, 1.5, 0.5, 0 at temperature 1/3.
        let top = [2.0f64, 1.5, 0.5, 0.0];
        let norm: f64 = top.iter().map(|l| (3.0 * l).exp()).sum();
        let mut got: Vec<(usize, f64)> = support.iter().copied().zip(log_probs.clone()).collect();
        got.sort_by_key(|&(i, _)| i);
        let want_index = [0usize, 1, 3, 5];
        for ((i, lp), (&w, l)) in got.iter().zip(want_index.iter().zip([2.0, 0.5, 1.5, 0.0])) {
            assert_eq!(*i, w);
            let want = 3.0 * l - norm.ln();
            assert!((lp - want).abs() < 1e-12, "{lp} vs {want}");
        }
        // Sharper than the zero-shot row: its mode (logit 2, index 0) gains mass.
        let plain = ZeroShot::new(4).unwrap().output(&zero).unwrap();
        let at = |support: &[usize]| support.iter().position(|&i| i == 0).unwrap();
        assert!(got[0].1 > plain.log_probs[at(&plain.support)]);
        assert!(SharpenedZeroShot::new(4, 0).is_err());
    }
}
