//! Checkpoints of a [`DpSgdTrainer`]: the adapter in PEFT format, AdamW's
//! moments and the step count, so that an interrupted DP-SGD run continues
//! instead of starting again.
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
//! Layout: `dir/step-NNNNNNNN/{adapter/, optimizer.safetensors, dpsgd.json}`
//! and `dir/latest` naming the newest complete one (written last, by rename).

use std::path::{Path, PathBuf};

use burn::tensor::backend::AutodiffBackend;
use privmix_models::LanguageModel;
use rand::SeedableRng;
use rand_chacha::ChaCha20Rng;
use serde::{Deserialize, Serialize};
use serde_json::{Value, json};

use super::checkpoint::{commit, read_latest, read_moments, write_moments};
use super::dpsgd::{DpSgdConfig, DpSgdTrainer, NoiseSource};
use super::error::TrainError;
use super::host::HostTrainable;
use super::params::LoraParams;
use crate::lora::{LoraAdapter, LoraBase};
use privmix_models::ModelBackend;

const STATE: &str = "dpsgd.json";
const FORMAT: u32 = 1;

/// `dpsgd.json`.
#[derive(Serialize, Deserialize)]
struct State {
    format: u32,
    step: usize,
    adam_t: u64,
    config: Value,
}

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

impl<'m, B: AutodiffBackend + ModelBackend, M: LanguageModel<B> + LoraBase + HostTrainable<B>>
    DpSgdTrainer<'m, B, M>
{
    /// Writes a checkpoint of the current state into `dir` (layout in the
    /// module doc) and returns the checkpoint's own folder; older ones are removed.
    pub fn save_checkpoint(&self, dir: impl AsRef<Path>) -> Result<PathBuf, TrainError> {
        let dir = dir.as_ref();
        let name = format!("step-{:08}", self.step);
        let here = dir.join(&name);
        let io = |p: &Path, e: std::io::Error| TrainError::checkpoint(p, e);
        std::fs::create_dir_all(&here).map_err(|e| io(&here, e))?;
        let adapter: LoraAdapter<B::InnerBackend> =
            self.params.to_adapter(&self.base, &self.device)?;
        adapter.save_peft(here.join("adapter"))?;
        write_moments(&here, &self.opt.exp_avg, &self.opt.exp_avg_sq)?;
        let state = State {
            format: FORMAT,
            step: self.step,
            adam_t: self.opt.t,
            config: self.config.fingerprint(),
        };
        commit(dir, &here, STATE, &state)?;
        Ok(here)
    }

    /// A trainer restored from the checkpoint `dir/latest` names, for the same
    /// model, data and configuration (another configuration is a
    /// [`TrainError::Checkpoint`]), with fresh sampling and noise coins (see
    /// the module doc).
    pub fn resume(
        model: &'m M,
        data: Vec<Vec<u32>>,
        config: DpSgdConfig,
        dir: impl AsRef<Path>,
    ) -> Result<Self, TrainError> {
        let (here, state_path, state): (_, _, State) = read_latest(dir.as_ref(), STATE)?;
        let bad = |m: String| Err(TrainError::checkpoint(&state_path, m));
        if state.format != FORMAT {
            return bad(format!("format {} (expected {FORMAT})", state.format));
        }
        if state.config != config.fingerprint() {
            return bad("saved under another DP-SGD configuration".into());
        }
        if state.step > config.total_steps {
            return bad(format!(
                "step {} is past the run's {} steps",
                state.step, config.total_steps
            ));
        }
        let noise = config.noise;
        let mut t = Self::new(model, data, config)?;
        let adapter: LoraAdapter<B::InnerBackend> =
            LoraAdapter::load_peft(here.join("adapter"), &t.base, &t.device)?;
        t.params = LoraParams::from_adapter(&adapter, &t.base)?;
        if t.params.config() != &t.config.lora {
            return bad("the adapter's configuration differs from the run's".into());
        }
        (t.opt.exp_avg, t.opt.exp_avg_sq) = read_moments(&here, t.params.len())?;
        t.opt.t = state.adam_t;
        t.step = state.step;
        t.private_rng = match noise {
            NoiseSource::Os => noise.rng()?,
            NoiseSource::Seeded(seed) => {
                let mut rng = ChaCha20Rng::seed_from_u64(seed);
                rng.set_stream(state.step as u64);
                rng
            }
        };
        Ok(t)
    }
}

#[cfg(test)]
mod tests {
    use burn::backend::{Autodiff, Flex};
    use privmix_models::{LoadOptions, Model};

    use super::*;
    use crate::lora::LoraConfig;
    use crate::train::AdamWConfig;

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
}
