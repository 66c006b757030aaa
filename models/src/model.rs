//! Any supported model behind one type, loaded as [`LoadOptions`] say.

use std::path::{Path, PathBuf};

use burn::tensor::{Tensor, backend::Backend};

use crate::backend::ModelBackend;
use crate::config::ModelConfig;
use crate::decoder;
use crate::error::ModelError;
use crate::gemma::Gemma;
use crate::gguf::GgufFile;
use crate::gpt2::Gpt2;
use crate::layers::{KvCache, LinearDelta};
use crate::llama::Llama;
use crate::plan::{DecodeProducts, ExecutionPlan, Route};
use crate::runtime::{Batch, LanguageModel};
use crate::weights::WeightSource;

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

/// Where a model's configuration and weights come from.
#[derive(Debug, Clone)]
pub enum ModelSource<'a> {
    /// A GGUF file, or a Hugging Face folder (`config.json` plus
    /// safetensors).
    Path(PathBuf),
    /// A configuration and weights already opened (the weights' tensors
    /// are checked against the configuration's shapes).
    Weights(&'a ModelConfig, &'a WeightSource),
}

/// Everything [`Model::load`] is told: where the model comes from, which
/// execution plan its route allows, how products read weights kept in
/// GGUF blocks, and the device of backend `B` the weights go to. The one way
/// to load a model, whatever its architecture and format.
///
/// ```no_run
/// use privmix_models::{CpuBackend, DecodeProducts, LoadOptions, Model, Route};
///
/// let device = Default::default();
/// let model = Model::<CpuBackend>::load(
///     LoadOptions::path("models-cache/smollm2.gguf", &device)
///         .decode_products(DecodeProducts::Int8Activations)
///         .route(Route::Fastest),
/// )?;
/// println!("{}", model.plan());
/// # Ok::<(), privmix_models::ModelError>(())
/// ```
#[derive(Debug, Clone)]
pub struct LoadOptions<'a, B: Backend> {
    /// Where the configuration and weights come from.
    pub source: ModelSource<'a>,
    /// Which implementations the execution plan may use (default: the
    /// fastest the backend allows).
    pub route: Route,
    /// How products read weights kept in GGUF Q4_1/Q8_0 blocks, where the
    /// plan uses the CPU kernels (elsewhere it has no effect).
    pub decode_products: DecodeProducts,
    /// The device the weights are loaded to.
    pub device: B::Device,
}

impl<'a, B: ModelBackend> LoadOptions<'a, B> {
    /// A GGUF file, or an HF folder (`config.json` + safetensors), loaded to
    /// `device` with the default route and decode products.
    pub fn path(path: impl AsRef<Path>, device: &B::Device) -> Self {
        Self::from_source(ModelSource::Path(path.as_ref().to_path_buf()), device)
    }

    /// The model `config` describes, built from `weights`, loaded to `device`
    /// with the default route and decode products.
    pub fn weights(config: &'a ModelConfig, weights: &'a WeightSource, device: &B::Device) -> Self {
        Self::from_source(ModelSource::Weights(config, weights), device)
    }

    fn from_source(source: ModelSource<'a>, device: &B::Device) -> Self {
        Self {
            source,
            route: Route::default(),
            decode_products: DecodeProducts::default(),
            device: device.clone(),
        }
    }

    /// The options with the execution plan `route` allows (a test picks the
    /// tensor block operations, or burn's ops only, on burn-flex this way).
    pub fn route(mut self, route: Route) -> Self {
        self.route = route;
        self
    }

    /// The options with GGUF blocks read as `products` says.
    pub fn decode_products(mut self, products: DecodeProducts) -> Self {
        self.decode_products = products;
        self
    }

    /// The execution plan's load-time part: what the route allows on `B`
    /// and the decode products. A model completes it from its projections.
    pub fn plan(&self) -> ExecutionPlan {
        ExecutionPlan::for_backend::<B>(self.route).with_decode_products(self.decode_products)
    }
}

impl<B: ModelBackend> Model<B> {
    /// Loads the model `options` describe: its configuration (`config.json`
    /// or the GGUF metadata) picks the architecture, and every weight's
    /// shape is checked against it.
    pub fn load(options: LoadOptions<'_, B>) -> Result<Self, ModelError> {
        match &options.source {
            ModelSource::Weights(config, weights) => Self::build(config, weights, &options),
            ModelSource::Path(path) if path.is_dir() => {
                let config = ModelConfig::from_hf_file(path.join("config.json"))?;
                let weights = WeightSource::from_hf_dir(path)?;
                Self::build(&config, &weights, &options)
            }
            ModelSource::Path(path) => {
                let file = GgufFile::open(path)?;
                let config = ModelConfig::from_gguf(&file)?;
                let weights = WeightSource::from_gguf(file)?;
                Self::build(&config, &weights, &options)
            }
        }
    }

    /// The model `config` describes from `weights`, as `options` say.
    fn build(
        config: &ModelConfig,
        weights: &WeightSource,
        options: &LoadOptions<'_, B>,
    ) -> Result<Self, ModelError> {
        let (plan, device) = (options.plan(), &options.device);
        Ok(match config {
            ModelConfig::Gpt2(c) => Self::Gpt2(Gpt2::load_gpt2(c, weights, plan, device)?),
            ModelConfig::Llama(c) => Self::Llama(decoder::load(c, weights, plan, device)?),
            ModelConfig::Gemma(c) => Self::Gemma(decoder::load(c, weights, plan, device)?),
        })
    }
}

impl<B: ModelBackend> Model<B> {
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

impl<B: ModelBackend> LanguageModel<B> for Model<B> {
    fn vocab_size(&self) -> usize {
        self.inner().vocab_size()
    }

    fn num_layers(&self) -> usize {
        self.inner().num_layers()
    }

    fn device(&self) -> B::Device {
        self.inner().device()
    }

    fn plan(&self) -> &ExecutionPlan {
        Model::plan(self)
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

    fn head_host(&self, hidden: &[f32], rows: usize) -> Option<Vec<f32>> {
        self.run(|| self.inner().head_host(hidden, rows))
    }

    fn log_probs_last_rows(
        &self,
        batch: &Batch,
        cache: &mut KvCache<B>,
        delta: Option<&dyn LinearDelta<B>>,
    ) -> Result<Vec<f32>, ModelError> {
        self.run(|| self.inner().log_probs_last_rows(batch, cache, delta))
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
