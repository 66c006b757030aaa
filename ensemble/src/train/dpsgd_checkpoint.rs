//! What the checkpoints of a [`DpSgdTrainer`] hold (the one format of
//! `checkpoint.rs`): the adapter in PEFT format, AdamW's moments, the step
//! count and the configuration's fingerprint, so that an interrupted DP-SGD
//! run continues instead of starting again; no loss (those are not
//! privatised).
//!
//! The Poisson-sampling and noise generator is not saved. A resumed run draws
//! the remaining steps' coins from a fresh generator ([`NoiseSource::Os`]:
//! seeded by the operating system again), which is all the DP-SGD analysis
//! asks of them: each step's sampling and noise independent of everything
//! else. The accounting is unchanged — the steps taken before and after the
//! interruption are composed as one run of `total_steps` — and what a
//! checkpoint holds is a function of the privatised steps alone, so it is
//! covered by the same guarantee. Steps computed after the last checkpoint and
//! lost in the interruption were never released and cost nothing. With
//! [`NoiseSource::Seeded`] the resumed steps draw from stream `step` of the
//! seeded generator: reproducible, but not the trajectory of an uninterrupted
//! run.
//!
//! Layout: `dir/step-NNNNNNNN/{adapter/, optimizer.safetensors, trainer.json}`
//! and `dir/latest` naming the newest complete one (written last, by rename);
//! checkpoints written before the trainers were merged hold `dpsgd.json`
//! (the same fields) instead of `trainer.json`, and resume as they are.

use serde_json::{Value, json};

#[cfg(doc)]
use super::dpsgd::DpSgdTrainer;
use super::dpsgd::{DpSgdConfig, NoiseSource};

impl DpSgdConfig {
    /// Everything that decides the run and its guarantee, as JSON (a
    /// checkpoint refuses to resume under another one); the noise source by
    /// kind only (`os` or `seeded`).
    pub fn fingerprint(&self) -> Value {
        json!({
            "lora": self.lora.to_json(),
            "learning_rate": self.learning_rate,
            "warmup_steps": self.warmup_steps,
            "total_steps": self.total_steps,
            "sampling_rate": self.sampling_rate,
            "clip_norm": self.clip_norm,
            "noise_multiplier": self.noise_multiplier,
            "delta": self.delta,
            "adamw": serde_json::to_value(self.adamw).unwrap_or(Value::Null),
            "seed": self.seed,
            "noise": match self.noise {
                NoiseSource::Os => "os",
                NoiseSource::Seeded(_) => "seeded",
            },
        })
    }
}

#[cfg(test)]
mod tests {
    use burn::backend::{Autodiff, Flex};
    use privmix_models::{LoadOptions, Model};

    use std::path::Path;

    use super::*;
    use crate::lora::LoraConfig;
    use crate::train::{AdamWConfig, DpSgdTrainer, TrainError};

    type AB = Autodiff<Flex>;

    fn model() -> Model<AB> {
        let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("../models/tests/fixtures/hf/llama");
        Model::load(LoadOptions::path(dir, &Default::default())).unwrap()
    }

    fn config(noise: NoiseSource) -> DpSgdConfig {
        DpSgdConfig {
            lora: LoraConfig::new(2, 4.0, &["q_proj", "v_proj"]).unwrap(),
            learning_rate: 1e-2,
            warmup_steps: 0,
            total_steps: 4,
            sampling_rate: 0.5,
            clip_norm: 1.0,
            noise_multiplier: 1.0,
            delta: 1e-5,
            adamw: AdamWConfig::default(),
            seed: 4,
            noise,
        }
    }

    fn data() -> Vec<Vec<u32>> {
        (0..6u32)
            .map(|k| (0..8u32).map(|i| 10 + (k * 7 + i * 5) % 64).collect())
            .collect()
    }

    /// A checkpoint restores the parameters, moments and step exactly; the
    /// resumed run finishes the planned steps and reports the ε of the whole
    /// run; another configuration is refused.
    #[test]
    fn resumes_the_state_and_the_accounting() {
        let model = model();
        let dir = std::env::temp_dir().join(format!("privmix-dpsgd-ckpt-{}", std::process::id()));
        std::fs::remove_dir_all(&dir).ok();
        let mut first =
            DpSgdTrainer::<AB, _>::new(&model, data(), config(NoiseSource::Os)).unwrap();
        first.step().unwrap();
        first.step().unwrap();
        first.save_checkpoint(&dir).unwrap();
        let mut resumed =
            DpSgdTrainer::<AB, _>::resume(&model, data(), config(NoiseSource::Os), &dir).unwrap();
        assert_eq!(resumed.step_count(), 2);
        assert_eq!(resumed.params().values(), first.params().values());
        assert_eq!(resumed.opt, first.opt);
        resumed.run().unwrap();
        assert_eq!(resumed.step_count(), 4);
        let mut whole =
            DpSgdTrainer::<AB, _>::new(&model, data(), config(NoiseSource::Os)).unwrap();
        whole.run().unwrap();
        assert_eq!(resumed.epsilon().unwrap(), whole.epsilon().unwrap());

        let mut other = config(NoiseSource::Os);
        other.noise_multiplier = 2.0;
        assert!(matches!(
            DpSgdTrainer::<AB, _>::resume(&model, data(), other, &dir),
            Err(TrainError::Checkpoint { .. })
        ));
        assert!(matches!(
            DpSgdTrainer::<AB, _>::resume(&model, data(), config(NoiseSource::Seeded(1)), &dir),
            Err(TrainError::Checkpoint { .. })
        ));
        std::fs::remove_dir_all(&dir).ok();
    }

    /// A DP-SGD checkpoint holds neither the sampling and noise generator nor
    /// any loss; one written before the trainers were merged (`dpsgd.json`
    /// with format, step, AdamW's step count and the fingerprint) resumes to
    /// the same state as the current format, from the seeded stream `step`.
    #[test]
    fn holds_no_coins_and_reads_the_earlier_format() {
        let model = model();
        let dir = std::env::temp_dir().join(format!("privmix-dpsgd-legacy-{}", std::process::id()));
        std::fs::remove_dir_all(&dir).ok();
        let config = || config(NoiseSource::Seeded(7));
        let mut first = DpSgdTrainer::<AB, _>::new(&model, data(), config()).unwrap();
        first.step().unwrap();
        let here = first.save_checkpoint(&dir).unwrap();
        let text = std::fs::read_to_string(here.join("trainer.json")).unwrap();
        let state: Value = serde_json::from_str(&text).unwrap();
        for key in ["rng_seed", "rng_stream", "rng_word_pos"] {
            assert!(state.get(key).is_none(), "{key} in {text}");
        }
        assert_eq!(state["history"]["train_loss"], json!([]), "{text}");
        let mut current = DpSgdTrainer::<AB, _>::resume(&model, data(), config(), &dir).unwrap();

        let legacy = json!({
            "format": 1,
            "step": state["step"],
            "adam_t": state["adam_t"],
            "config": state["config"],
        });
        std::fs::remove_file(here.join("trainer.json")).unwrap();
        std::fs::write(here.join("dpsgd.json"), legacy.to_string()).unwrap();
        let mut earlier = DpSgdTrainer::<AB, _>::resume(&model, data(), config(), &dir).unwrap();
        assert_eq!(earlier.step_count(), 1);
        assert_eq!(earlier.params().values(), first.params().values());
        assert_eq!(earlier.opt, first.opt);
        current.run().unwrap();
        earlier.run().unwrap();
        assert_eq!(earlier.params().values(), current.params().values());
        std::fs::remove_dir_all(&dir).ok();
    }
}
