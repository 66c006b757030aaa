//! AdamW over a flat host parameter vector, and the linear warmup/decay
//! learning-rate schedule.

use super::error::TrainError;

/// AdamW hyper-parameters (PyTorch's `torch.optim.AdamW` names and update).
#[derive(Debug, Clone, Copy, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct AdamWConfig {
    /// β₁ (in `[0, 1)`).
    pub beta1: f64,
    /// β₂ (in `[0, 1)`).
    pub beta2: f64,
    /// ε added to `√v̂` (> 0).
    pub eps: f64,
    /// Decoupled weight decay λ (≥ 0).
    pub weight_decay: f64,
}

impl Default for AdamWConfig {
    /// PyTorch's defaults except weight decay 0 (the HF Trainer default).
    fn default() -> Self {
        Self {
            beta1: 0.9,
            beta2: 0.999,
            eps: 1e-8,
            weight_decay: 0.0,
        }
    }
}

impl AdamWConfig {
    /// Checks the ranges.
    pub fn validate(&self) -> Result<(), TrainError> {
        for (name, v) in [("beta1", self.beta1), ("beta2", self.beta2)] {
            if !(0.0..1.0).contains(&v) {
                return Err(TrainError::bad(name, format!("{v} is not in [0, 1)")));
            }
        }
        if !(self.eps > 0.0 && self.eps.is_finite()) {
            return Err(TrainError::bad(
                "eps",
                format!("{} is not positive", self.eps),
            ));
        }
        if !(self.weight_decay >= 0.0 && self.weight_decay.is_finite()) {
            return Err(TrainError::bad(
                "weight_decay",
                format!("{} is negative", self.weight_decay),
            ));
        }
        Ok(())
    }
}

/// AdamW state (Loshchilov & Hutter 2019, "Decoupled Weight Decay
/// Regularization"): first and second moments and the update count.
#[derive(Debug, Clone, PartialEq)]
pub struct AdamW {
    /// Hyper-parameters.
    pub config: AdamWConfig,
    /// First moments.
    pub exp_avg: Vec<f32>,
    /// Second moments.
    pub exp_avg_sq: Vec<f32>,
    /// Updates done.
    pub t: u64,
}

impl AdamW {
    /// Zero state for `len` parameters.
    pub fn new(config: AdamWConfig, len: usize) -> Result<Self, TrainError> {
        config.validate()?;
        Ok(Self {
            config,
            exp_avg: vec![0.0; len],
            exp_avg_sq: vec![0.0; len],
            t: 0,
        })
    }

    /// One update at learning rate `lr` with gradient `grad`, as PyTorch's
    /// AdamW: `p ← p(1 − lr·λ)`; `m ← β₁m + (1−β₁)g`; `v ← β₂v + (1−β₂)g²`;
    /// `p ← p − lr·m̂/(√v̂ + ε)` with bias-corrected `m̂`, `v̂`. Arithmetic
    /// per element in f64, stored in f32.
    pub fn step(&mut self, params: &mut [f32], grad: &[f32], lr: f64) -> Result<(), TrainError> {
        if params.len() != self.exp_avg.len() || grad.len() != params.len() {
            return Err(TrainError::bad(
                "grad",
                format!("{} gradients for {} parameters", grad.len(), params.len()),
            ));
        }
        let c = self.config;
        self.t += 1;
        let bc1 = 1.0 - c.beta1.powf(self.t as f64);
        let bc2 = 1.0 - c.beta2.powf(self.t as f64);
        for i in 0..params.len() {
            let g = f64::from(grad[i]);
            let mut p = f64::from(params[i]) * (1.0 - lr * c.weight_decay);
            let m = c.beta1 * f64::from(self.exp_avg[i]) + (1.0 - c.beta1) * g;
            let v = c.beta2 * f64::from(self.exp_avg_sq[i]) + (1.0 - c.beta2) * g * g;
            p -= lr * (m / bc1) / ((v / bc2).sqrt() + c.eps);
            self.exp_avg[i] = m as f32;
            self.exp_avg_sq[i] = v as f32;
            params[i] = p as f32;
        }
        Ok(())
    }
}

/// Learning rate at optimizer step `step` (from 0) of `total`: linear warmup
/// from 0 over `warmup` steps, then linear decay to 0 at `total` (the
/// Hugging Face `get_linear_schedule_with_warmup`).
pub fn linear_schedule(peak: f64, step: usize, warmup: usize, total: usize) -> f64 {
    if step < warmup {
        return peak * step as f64 / warmup.max(1) as f64;
    }
    let left = total.saturating_sub(step) as f64;
    peak * (left / total.saturating_sub(warmup).max(1) as f64).max(0.0)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn schedule_rises_then_falls() {
        let lr: Vec<f64> = (0..6).map(|s| linear_schedule(1.0, s, 2, 6)).collect();
        assert_eq!(lr, vec![0.0, 0.5, 1.0, 0.75, 0.5, 0.25]);
        assert_eq!(linear_schedule(1.0, 7, 2, 6), 0.0);
    }

    /// First step of Adam moves every parameter by `lr` against the sign of
    /// its gradient (m̂ = g, v̂ = g², so m̂/√v̂ = ±1 up to ε).
    #[test]
    fn first_step_is_signed_lr() {
        let mut opt = AdamW::new(AdamWConfig::default(), 3).unwrap();
        let mut p = vec![1.0f32, 1.0, 1.0];
        opt.step(&mut p, &[0.5, -2.0, 1e-3], 0.1).unwrap();
        for (x, want) in p.iter().zip([0.9f32, 1.1, 0.9]) {
            assert!((x - want).abs() < 1e-5, "{x} vs {want}");
        }
        assert!(opt.step(&mut p, &[0.0], 0.1).is_err());
        let bad = AdamWConfig {
            beta1: 1.0,
            ..AdamWConfig::default()
        };
        assert!(AdamW::new(bad, 1).is_err());
    }
}
