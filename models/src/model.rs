//! Any supported model behind one type, loaded from a path.

use std::path::Path;

use burn::tensor::{Tensor, backend::Backend};

use crate::config::ModelConfig;
use crate::error::ModelError;
use crate::gemma::Gemma;
use crate::gguf::GgufFile;
use crate::gpt2::Gpt2;
use crate::layers::{KvCache, KvPrecision, LinearDelta};
use crate::llama::Llama;
use crate::plan::{ExecutionPlan, Route};
use crate::runtime::{Batch, LanguageModel};
use crate::weights::{DecodeProducts, WeightSource};

/// A loaded model of any supported architecture.
#[derive(Debug, Clone)]
#[non_exhaustive]
pub enum Model<B: Backend> {
    /// A GPT-2 model.
    Gpt2(Gpt2<B>),
    /// A Llama-family model.
    Llama(Llama<B>),
    /// A Gemma 1/2/3 model.
    Gemma(Gemma<B>),
}

impl<B: Backend> Model<B> {
    /// Loads a GGUF file, or an HF folder (`config.json` + safetensors).
    pub fn load(path: impl AsRef<Path>, device: &B::Device) -> Result<Self, ModelError> {
        let path = path.as_ref();
        if path.is_dir() {
            let config = ModelConfig::from_hf_file(path.join("config.json"))?;
            let weights = WeightSource::from_hf_dir(path)?;
            Self::from_weights(&config, &weights, device)
        } else {
            Self::load_gguf(path, device)
        }
    }

    /// Loads a GGUF file.
    pub fn load_gguf(path: impl AsRef<Path>, device: &B::Device) -> Result<Self, ModelError> {
        Self::load_gguf_with(path, DecodeProducts::default(), device)
    }

    /// Loads a GGUF file whose products multiply by its quantised blocks as
    /// `products` says (on plain burn-flex; elsewhere it has no effect).
    pub fn load_gguf_with(
        path: impl AsRef<Path>,
        products: DecodeProducts,
        device: &B::Device,
    ) -> Result<Self, ModelError> {
        Self::load_gguf_routed(path, products, Route::Fastest, device)
    }

    /// [`Model::load_gguf_with`] with the execution plan `route` allows (a
    /// test picks the tensor block operations, or burn's ops only, on
    /// burn-flex this way).
    pub fn load_gguf_routed(
        path: impl AsRef<Path>,
        products: DecodeProducts,
        route: Route,
        device: &B::Device,
    ) -> Result<Self, ModelError> {
        let file = GgufFile::open(path)?;
        let config = ModelConfig::from_gguf(&file)?;
        let weights = WeightSource::from_gguf(file)?.with_decode_products(products);
        Self::from_weights_routed(&config, &weights, route, device)
    }

    /// Builds the model `config` describes from `weights`.
    pub fn from_weights(
        config: &ModelConfig,
        weights: &WeightSource,
        device: &B::Device,
    ) -> Result<Self, ModelError> {
        Self::from_weights_routed(config, weights, Route::Fastest, device)
    }

    /// [`Model::from_weights`] with the execution plan `route` allows.
    pub fn from_weights_routed(
        config: &ModelConfig,
        weights: &WeightSource,
        route: Route,
        device: &B::Device,
    ) -> Result<Self, ModelError> {
        Ok(match config {
            ModelConfig::Gpt2(c) => Self::Gpt2(Gpt2::load_routed(c, weights, route, device)?),
            ModelConfig::Llama(c) => Self::Llama(Llama::load_routed(c, weights, route, device)?),
            ModelConfig::Gemma(c) => Self::Gemma(Gemma::load_routed(c, weights, route, device)?),
        })
    }
}

impl<B: Backend> Model<B> {
    /// The model inside, whatever its architecture.
    fn inner(&self) -> &(dyn LanguageModel<B> + Sync) {
        match self {
            Self::Gpt2(m) => m,
            Self::Llama(m) => m,
            Self::Gemma(m) => m,
        }
    }

    /// Which implementations run the forward pass.
    pub fn plan(&self) -> &ExecutionPlan {
        match self {
            Self::Gpt2(m) => m.plan(),
            Self::Llama(m) => m.plan(),
            Self::Gemma(m) => m.plan(),
        }
    }

    /// Runs `f` as the plan says (on rayon's hot pool where the CPU kernels
    /// split products over its threads).
    fn run<T: Send>(&self, f: impl FnOnce() -> T + Send) -> T {
        self.plan().run(f)
    }
}

impl<B: Backend> LanguageModel<B> for Model<B> {
    fn vocab_size(&self) -> usize {
        self.inner().vocab_size()
    }

    fn num_layers(&self) -> usize {
        self.inner().num_layers()
    }

    fn device(&self) -> B::Device {
        self.inner().device()
    }

    fn new_cache_with(&self, rows: usize, precision: KvPrecision) -> KvCache<B> {
        self.inner().new_cache_with(rows, precision)
    }

    fn forward_hidden(
        &self,
        batch: &Batch,
        cache: &mut KvCache<B>,
        delta: Option<&dyn LinearDelta<B>>,
    ) -> Result<Tensor<B, 3>, ModelError> {
        self.run(|| self.inner().forward_hidden(batch, cache, delta))
    }

    fn head(&self, hidden: Tensor<B, 3>) -> Tensor<B, 3> {
        self.run(|| self.inner().head(hidden))
    }

    // Each whole pass on the hot pool at once, not its two halves one by one.
    fn forward(
        &self,
        batch: &Batch,
        cache: &mut KvCache<B>,
        delta: Option<&dyn LinearDelta<B>>,
    ) -> Result<Tensor<B, 3>, ModelError> {
        self.run(|| self.inner().forward(batch, cache, delta))
    }

    fn logits_last(
        &self,
        batch: &Batch,
        cache: &mut KvCache<B>,
        delta: Option<&dyn LinearDelta<B>>,
    ) -> Result<Tensor<B, 2>, ModelError> {
        self.run(|| self.inner().logits_last(batch, cache, delta))
    }
}
