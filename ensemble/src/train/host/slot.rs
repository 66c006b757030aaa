//! A trainer's host copy of the model, built on first use where the model's
//! execution plan runs the host step.

use std::sync::{Arc, OnceLock};

use burn::tensor::backend::AutodiffBackend;
use privmix_models::LanguageModel;

use super::step::HostModel;
use super::{HostTrainable, StepPath};
use crate::train::error::TrainError;
use privmix_models::ModelBackend;

/// A trainer's host copy of the model, built on first use; clones share
/// one copy (members trained together read one set of weights).
#[derive(Debug, Default, Clone)]
pub(crate) struct HostSlot {
    path: StepPath,
    copy: Arc<OnceLock<Option<HostModel>>>,
}

impl HostSlot {
    /// A slot for `path`.
    pub fn new(path: StepPath) -> Self {
        Self {
            path,
            copy: Arc::new(OnceLock::new()),
        }
    }

    /// The path asked for.
    pub fn path(&self) -> StepPath {
        self.path
    }

    /// The host copy of `model` when its execution plan runs training steps
    /// on host vectors (built on the first call), `None` when burn autodiff
    /// must run.
    pub fn get<B: AutodiffBackend + ModelBackend, M: LanguageModel<B> + HostTrainable<B>>(
        &self,
        model: &M,
    ) -> Result<Option<&HostModel>, TrainError> {
        if self.path == StepPath::Autodiff || !model.plan().host_training {
            return Ok(None);
        }
        if let Some(c) = self.copy.get() {
            return Ok(c.as_ref());
        }
        let built = match model.host_training_decoder() {
            Some(decoder) => Some(HostModel::from_llama(decoder)?),
            None => None,
        };
        let _ = self.copy.set(built);
        Ok(self.copy.get().and_then(Option::as_ref))
    }
}
