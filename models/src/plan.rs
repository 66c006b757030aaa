//! The execution plan: which implementation runs each part of a forward
//! pass, chosen once when a model is loaded and stored in it.
//!
//! A forward step is written once per architecture, against the block
//! operations of [`crate::ops`] (projections with their LoRA deltas,
//! attention with the cache, the gated MLP, residual + norm). Two
//! implementations carry them out:
//!
//! - [`BlockOpsKind::Host`]: the activations stay in host memory from the
//!   embedding to the final norm and each block is a few parallel passes
//!   over the rows, every product read from the weight's quantised copy.
//!   Only where tensors live in host memory ([`BackendKind::HostMemory`])
//!   and every projection of the model has a quantised copy.
//! - [`BlockOpsKind::Tensor`]: burn's tensor ops. Where tensors live in host
//!   memory, products of a few rows and attention of a few queries still read
//!   host memory through the CPU kernels ([`ProductPlan`], the KV cache's
//!   host storage); elsewhere (wgpu, cuda, autodiff) burn's ops only.
//!
//! The plan is printable (`privmix … --verbose`, the speed report) and can be
//! chosen in tests through [`Route`] without changing the backend type.
//! The backend's kind is read here only, from its [`ModelBackend`] impl.

use std::fmt;

pub use crate::backend::BackendKind;
use crate::backend::ModelBackend;

/// Steps of at most this many new tokens per row are attended in host
/// memory where the KV cache keeps its keys and values there (decoding);
/// longer ones (prefill) use gemm through burn's ops.
pub const HOST_QUERIES_MAX: usize = 8;

/// Which implementations a plan may use: the default takes the fastest the
/// backend allows; tests pick the others to compare paths on one backend.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Route {
    /// Host block operations for decode steps where the model allows them,
    /// tensor block operations with CPU kernels for the rest.
    #[default]
    Fastest,
    /// Tensor block operations for every step; the CPU kernels still serve
    /// products and attention where tensors live in host memory.
    TensorBlocks,
    /// burn's ops only, as on a device backend: no quantised copies, no CPU
    /// kernels, the KV cache held in tensors.
    BurnOpsOnly,
}

/// How the block operations of one step run.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BlockOpsKind {
    /// In host memory, fused per-row passes ([`crate::ops::host`]).
    Host,
    /// burn's tensor ops ([`crate::ops::tensor`]).
    Tensor,
}

/// How plain burn-flex multiplies by a GGUF Q4_1/Q8_0 weight that it keeps
/// in its blocks. Other backends multiply by the f32 dequantised weight
/// either way.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
#[non_exhaustive]
pub enum DecodeProducts {
    /// Products of a few rows (decode steps) read the blocks with f32
    /// activations, multiplying exactly the dequantised weights (see
    /// [`crate::cpu::blocks_f32`]); longer ones (prefill) multiply the f32
    /// dequantised weight. Both agree with the f32 forward (transformers) to
    /// summation order. Products of 8 rows or more (batch rows × new
    /// tokens: an ensemble step of 7 members or more, or a decode-path
    /// prefill of 8 tokens) on an AVX-512 CPU read a second copy of the
    /// blocks in 16-row tiles, made at the first such product: as much
    /// memory again as the quantised projections (see
    /// [`crate::cpu::tiles_f32`]).
    #[default]
    F32Activations,
    /// Every product, whatever its number of rows (so a row's logits do
    /// not depend on its batch), rounds each row of activations to 8 bits
    /// per block of 32 first, as llama.cpp's CPU kernels do, and takes the
    /// blocks' dot products as integer sums (see
    /// [`crate::cpu::tiles_q8`]): about 3×
    /// the multiply-adds per second, so a step with many rows (an ensemble)
    /// costs much less. The logits move by about as much as llama.cpp's
    /// differ from an f32 forward (see `tests/integration/llama_cpp_agreement.rs`).
    /// Weights whose output width is not a multiple of 16 keep f32
    /// activations.
    Int8Activations,
}

/// How a [`crate::layers::Linear`] computes its products: stored in every
/// projection when the model is loaded.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ProductPlan {
    /// Products may read the weight's quantised copy and the f32 weight in
    /// host memory through the CPU kernels.
    pub cpu_kernels: bool,
    /// Products of at most this many rows read an f32 weight row by row
    /// (`few_rows`), or its quantised copy with f32 activations; from there
    /// on burn's matmul (gemm's packed kernels) is faster. Products whose
    /// quantised copy takes 8-bit activations take it for any number of rows.
    pub few_rows_max: usize,
    /// How products read a weight kept in GGUF blocks (with the CPU
    /// kernels only).
    pub decode_products: DecodeProducts,
}

impl ProductPlan {
    /// Products of plain burn-flex read host memory; others use burn's matmul.
    pub fn for_backend<B: ModelBackend>() -> Self {
        Self::with_cpu_kernels(B::KIND.is_host_memory())
    }

    /// The thresholds with or without the CPU kernels.
    pub fn with_cpu_kernels(cpu_kernels: bool) -> Self {
        Self {
            cpu_kernels,
            few_rows_max: 24,
            decode_products: DecodeProducts::default(),
        }
    }
}

/// When a step's block operations run in host memory.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct HostSteps {
    /// Steps of at most this many new tokens per row (decoding; the host
    /// attention answers at most this many queries at once).
    pub max_new_tokens: usize,
    /// Steps of at most this many rows × new tokens, or any number (`None`)
    /// when every product takes 8-bit activations: f32 activations read the
    /// quantised copies only up to [`ProductPlan::few_rows_max`] rows.
    pub max_rows: Option<usize>,
}

/// What the CPU kernels run at on this CPU: decided once per process by the
/// kernel table (`cpu::dispatch`, from the instruction set it detects), and
/// read from there by every kernel, so that a plan can state it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CpuChoices {
    /// The instruction set every CPU kernel runs at (`amx-int8`,
    /// `avx512-vnni`, `avx512`, `avx2` or `fallback`: portable code, or
    /// pulp's widest level on other architectures than x86-64).
    pub isa: &'static str,
    /// Why a wider instruction set the CPU may have is not used (AMX int8
    /// on a CPU without it, or in a process Linux refused its tile state).
    pub isa_declined: Option<&'static str>,
    /// The host attention widens f16 keys and values in AVX-512 registers;
    /// otherwise it widens them into f32 scratch first (exactly either way).
    pub f16_kv_in_registers: bool,
    /// Q4_1 × f32 products dequantise each block through a 16-entry lookup
    /// table (AVX-512 lane permutes); otherwise entry by entry (the same
    /// weights bit for bit).
    pub q4_1_lookup_table: bool,
}

impl CpuChoices {
    /// The choices the kernel table made on this CPU (`None` without the
    /// CPU kernels, feature `flex`).
    pub fn detected() -> Option<Self> {
        #[cfg(feature = "flex")]
        {
            use crate::cpu::{ActivationFormat, Isa, WeightFormat, kernel_for};
            let isa = Isa::detected();
            Some(Self {
                isa: isa.name(),
                isa_declined: Isa::AmxInt8.declined(),
                f16_kv_in_registers: crate::cpu::dispatch::f16_kv_in_registers(),
                q4_1_lookup_table: kernel_for(WeightFormat::Q4_1, ActivationFormat::F32)
                    .is_some_and(|e| e.isa.has_avx512()),
            })
        }
        #[cfg(not(feature = "flex"))]
        None
    }
}

/// Products of the model, counted by the kernel that computes them (for
/// printing the plan).
pub type KernelCounts = Vec<(String, usize)>;

/// Which implementation runs each part of a model's forward pass.
#[derive(Debug, Clone, PartialEq)]
pub struct ExecutionPlan {
    /// The backend's kind.
    pub backend: BackendKind,
    /// What the plan was asked for.
    pub route: Route,
    /// When steps run the host block operations (`None`: never).
    pub host_steps: Option<HostSteps>,
    /// Why steps never run the host block operations, where they do not.
    pub host_steps_declined: Option<String>,
    /// How the projections compute their products.
    pub products: ProductPlan,
    /// Whether the host block operations quantise the products' inputs to
    /// 8 bits (some projection's quantised copy takes them).
    pub host_int8: bool,
    /// Whether a forward pass runs on rayon's pool with its threads kept
    /// spinning between parallel regions ([`crate::threads::on_hot_pool`]).
    pub hot_pool: bool,
    /// Whether the KV cache keeps keys and values in host memory, where
    /// the host attention answers steps of at most [`HOST_QUERIES_MAX`]
    /// queries.
    pub host_kv: bool,
    /// The decoder blocks' projections by product kernel.
    pub kernels: KernelCounts,
    /// What the CPU kernels run at, where the plan uses them (`None`:
    /// burn's ops only).
    pub cpu: Option<CpuChoices>,
    /// Whether a LoRA training step runs on host vectors (the forward
    /// through the models' host kernels, with their backward passes)
    /// rather than through burn autodiff: where
    /// the backend is burn autodiff over burn-flex and the architecture has
    /// that step ([`ExecutionPlan::with_host_training`]).
    pub host_training: bool,
    /// Why training steps run burn autodiff, where they do.
    pub host_training_declined: Option<String>,
}

impl ExecutionPlan {
    /// The plan's parts that do not depend on the weights: which
    /// implementations `route` allows on backend `B`. A model completes it
    /// with [`ExecutionPlan::with_projections`].
    pub fn for_backend<B: ModelBackend>(route: Route) -> Self {
        let backend = B::KIND;
        let host = backend.is_host_memory() && route != Route::BurnOpsOnly;
        Self {
            backend,
            route,
            host_steps: None,
            host_steps_declined: Some(if host {
                "not decided yet".into()
            } else {
                "tensors do not live in host memory on this route".into()
            }),
            products: ProductPlan::with_cpu_kernels(host),
            host_int8: false,
            hot_pool: host,
            host_kv: host,
            kernels: Vec::new(),
            cpu: if host { CpuChoices::detected() } else { None },
            host_training: false,
            host_training_declined: Some(if B::AUTODIFF_OVER_HOST_MEMORY {
                "the architecture has no host training step".into()
            } else {
                "the backend is not burn autodiff over burn-flex".into()
            }),
        }
    }

    /// Decides the host training step for backend `B`: allowed where `B`
    /// is burn autodiff over burn-flex, unless `declined` names a part of
    /// the architecture the host training step lacks.
    pub fn with_host_training<B: ModelBackend>(mut self, declined: Option<&str>) -> Self {
        let reason = if !B::AUTODIFF_OVER_HOST_MEMORY {
            Some("the backend is not burn autodiff over burn-flex".to_string())
        } else {
            declined.map(|part| format!("the host training step lacks {part}"))
        };
        self.host_training = reason.is_none();
        self.host_training_declined = reason;
        self
    }

    /// The plan with weights kept in GGUF blocks read as `products` says.
    pub fn with_decode_products(mut self, products: DecodeProducts) -> Self {
        self.products.decode_products = products;
        self
    }

    /// Decides the host steps from the decoder blocks' projections:
    /// `projections` gives, for each, whether it has a quantised copy the
    /// host products read, whether that copy takes 8-bit activations, and
    /// the kernel's name.
    pub fn with_projections(
        mut self,
        projections: impl IntoIterator<Item = ProjectionKernel>,
    ) -> Self {
        let mut all_host = true;
        let mut all_int8 = true;
        let mut any_int8 = false;
        let mut counts: KernelCounts = Vec::new();
        for p in projections {
            all_host &= p.host;
            all_int8 &= p.int8_activations;
            any_int8 |= p.int8_activations;
            match counts.iter_mut().find(|(name, _)| *name == p.kernel) {
                Some((_, n)) => *n += 1,
                None => counts.push((p.kernel, 1)),
            }
        }
        self.kernels = counts;
        self.host_int8 = any_int8;
        let reason = if !self.products.cpu_kernels {
            Some("tensors do not live in host memory on this route".to_string())
        } else if self.route == Route::TensorBlocks {
            Some("tensor block operations were asked for".to_string())
        } else if !all_host {
            Some("a projection has no quantised copy".to_string())
        } else {
            None
        };
        self.host_steps = reason.is_none().then_some(HostSteps {
            max_new_tokens: HOST_QUERIES_MAX,
            max_rows: (!all_int8).then_some(self.products.few_rows_max),
        });
        self.host_steps_declined = reason;
        self
    }

    /// Whether the LoRA factors a forward applies (an ensemble's adapters,
    /// stacked per site) are held in host memory, where the CPU kernels add
    /// each row's update to its product directly, rather than in tensors:
    /// exactly where the products use the CPU kernels.
    pub fn lora_factors_in_host_memory(&self) -> bool {
        self.products.cpu_kernels
    }

    /// How a step of `rows` rows with `new_tokens` new tokens each runs.
    pub fn block_ops(&self, rows: usize, new_tokens: usize) -> BlockOpsKind {
        match self.host_steps {
            Some(h)
                if new_tokens <= h.max_new_tokens
                    && h.max_rows.is_none_or(|m| rows * new_tokens <= m) =>
            {
                BlockOpsKind::Host
            }
            _ => BlockOpsKind::Tensor,
        }
    }

    /// Runs a forward pass `f` as the plan says: on rayon's hot pool where
    /// the CPU kernels split products over its threads, directly elsewhere.
    pub fn run<T: Send>(&self, f: impl FnOnce() -> T + Send) -> T {
        if self.hot_pool {
            crate::threads::on_hot_pool(f)
        } else {
            f()
        }
    }
}

/// One projection as [`ExecutionPlan::with_projections`] sees it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ProjectionKernel {
    /// It has a quantised copy that host products read.
    pub host: bool,
    /// That copy takes 8-bit activations.
    pub int8_activations: bool,
    /// The kernel that computes its decode products.
    pub kernel: String,
}

impl fmt::Display for ExecutionPlan {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let backend = match self.backend {
            BackendKind::HostMemory => "burn-flex (tensors in host memory)",
            BackendKind::Device => "a device backend or autodiff (burn's ops)",
        };
        writeln!(f, "execution plan ({:?} route) on {backend}", self.route)?;
        match (self.host_steps, &self.host_steps_declined) {
            (Some(h), _) => {
                let rows = match h.max_rows {
                    Some(m) => format!("at most {m} rows × new tokens"),
                    None => "any number of rows".to_string(),
                };
                writeln!(
                    f,
                    "  steps of ≤ {} new tokens per row, {rows}: host block operations (fused per-row passes)",
                    h.max_new_tokens
                )?;
                writeln!(f, "  other steps: tensor block operations")?;
            }
            (None, Some(why)) => {
                writeln!(f, "  every step: tensor block operations ({why})")?;
            }
            (None, None) => writeln!(f, "  every step: tensor block operations")?,
        }
        match &self.host_training_declined {
            None if self.host_training => writeln!(
                f,
                "  training steps: host vectors (the host kernels, their backward beside them)"
            )?,
            Some(why) => writeln!(f, "  training steps: burn autodiff ({why})")?,
            None => writeln!(f, "  training steps: burn autodiff")?,
        }
        if self.products.cpu_kernels {
            writeln!(
                f,
                "  tensor-op products: CPU kernels up to {} rows (8-bit activations: any rows), else burn's matmul",
                self.products.few_rows_max
            )?;
        } else {
            writeln!(f, "  products: burn's matmul")?;
        }
        let kernels: Vec<String> = self
            .kernels
            .iter()
            .map(|(name, n)| format!("{n} × {name}"))
            .collect();
        if !kernels.is_empty() {
            writeln!(f, "  block projections: {}", kernels.join(", "))?;
        }
        writeln!(
            f,
            "  attention: {}",
            if self.host_kv {
                "KV cache in host memory, host attention for decode steps"
            } else {
                "KV cache in tensors, burn's eager attention"
            }
        )?;
        if let Some(cpu) = self.cpu {
            writeln!(f, "  CPU kernels: {} (detected once)", cpu.isa)?;
            if let Some(why) = cpu.isa_declined {
                writeln!(f, "  CPU kernels: no AMX int8 tiles: {why}")?;
            }
            writeln!(
                f,
                "  f16 KV cache: {}",
                if cpu.f16_kv_in_registers {
                    "widened in AVX-512 registers"
                } else {
                    "widened into f32 scratch first"
                }
            )?;
            writeln!(
                f,
                "  Q4_1 blocks × f32: {}",
                if cpu.q4_1_lookup_table {
                    "dequantised through a 16-entry lookup table (AVX-512)"
                } else {
                    "dequantised entry by entry"
                }
            )?;
        }
        write!(
            f,
            "  threads: {}",
            if self.hot_pool {
                "rayon's pool kept hot during each forward"
            } else {
                "the backend's own scheduling"
            }
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn kernel(host: bool, int8: bool) -> ProjectionKernel {
        ProjectionKernel {
            host,
            int8_activations: int8,
            kernel: format!("k{host}{int8}"),
        }
    }

    #[cfg(feature = "flex")]
    #[test]
    fn host_steps_need_host_memory_and_every_projection_quantised() {
        use burn::backend::{Autodiff, Flex};
        let flex = ExecutionPlan::for_backend::<Flex>(Route::Fastest);
        let all = flex.clone().with_projections(vec![kernel(true, true); 3]);
        assert_eq!(all.block_ops(100, 1), BlockOpsKind::Host);
        assert_eq!(all.block_ops(1, 9), BlockOpsKind::Tensor);
        let f32_acts = flex
            .clone()
            .with_projections(vec![kernel(true, true), kernel(true, false)]);
        assert_eq!(f32_acts.block_ops(24, 1), BlockOpsKind::Host);
        assert_eq!(f32_acts.block_ops(25, 1), BlockOpsKind::Tensor);
        let missing = flex
            .clone()
            .with_projections(vec![kernel(true, true), kernel(false, false)]);
        assert_eq!(missing.block_ops(1, 1), BlockOpsKind::Tensor);
        assert!(missing.to_string().contains("no quantised copy"));
        for route in [Route::TensorBlocks, Route::BurnOpsOnly] {
            let p = ExecutionPlan::for_backend::<Flex>(route)
                .with_projections(vec![kernel(true, true)]);
            assert_eq!(p.block_ops(1, 1), BlockOpsKind::Tensor, "{route:?}");
            assert_eq!(p.products.cpu_kernels, route == Route::TensorBlocks);
        }
        let autodiff = ExecutionPlan::for_backend::<Autodiff<Flex>>(Route::Fastest)
            .with_projections(vec![kernel(true, true)]);
        assert_eq!(autodiff.backend, BackendKind::Device);
        assert_eq!(autodiff.block_ops(1, 1), BlockOpsKind::Tensor);
        assert!(!autodiff.hot_pool && !autodiff.host_kv);
    }

    /// The host training step is planned on burn autodiff over burn-flex
    /// for an architecture that has it, and on nothing else.
    #[cfg(all(feature = "flex", feature = "autodiff"))]
    #[test]
    fn host_training_needs_autodiff_over_flex_and_the_architecture() {
        use burn::backend::{Autodiff, Flex};
        let autodiff = ExecutionPlan::for_backend::<Autodiff<Flex>>(Route::Fastest);
        assert!(
            !autodiff.host_training,
            "undecided until the architecture says"
        );
        let llama = autodiff
            .clone()
            .with_host_training::<Autodiff<Flex>>(None)
            .with_projections(vec![kernel(false, false)]);
        assert!(llama.host_training && llama.host_training_declined.is_none());
        assert!(llama.to_string().contains("training steps: host vectors"));
        let interleaved = autodiff.with_host_training::<Autodiff<Flex>>(Some("interleaved RoPE"));
        assert!(!interleaved.host_training);
        assert!(interleaved.to_string().contains("lacks interleaved RoPE"));
        let plain =
            ExecutionPlan::for_backend::<Flex>(Route::Fastest).with_host_training::<Flex>(None);
        assert!(!plain.host_training);
        assert!(
            plain
                .to_string()
                .contains("not burn autodiff over burn-flex")
        );
    }

    /// The printed plan states the instruction set the CPU kernels run at
    /// and the two choices made from it outside the product kernels (the
    /// attention's f16 widening, the Q4_1 lookup table), as the kernel table
    /// made them; a plan without the CPU kernels states none of them.
    #[cfg(feature = "flex")]
    #[test]
    fn printed_plan_states_the_instruction_set_decisions() {
        use crate::cpu::{ActivationFormat, Isa, WeightFormat, kernel_for};
        use burn::backend::{Autodiff, Flex};
        let isa = Isa::detected();
        let plan = ExecutionPlan::for_backend::<Flex>(Route::Fastest)
            .with_projections(vec![kernel(true, true)]);
        let cpu = plan.cpu.expect("CPU kernels on plain flex");
        assert_eq!(cpu.isa, isa.name());
        let q4_1 = kernel_for(WeightFormat::Q4_1, ActivationFormat::F32).expect("a kernel");
        assert_eq!(cpu.q4_1_lookup_table, q4_1.isa.has_avx512());
        assert_eq!(
            cpu.f16_kv_in_registers,
            cfg!(target_arch = "x86_64") && isa.has_avx512()
        );
        let printed = plan.to_string();
        assert!(
            printed.contains(&format!("CPU kernels: {isa} (detected once)")),
            "{printed}"
        );
        // AMX is either used or the plan says why not (where VNNI is).
        assert_eq!(cpu.isa_declined, Isa::AmxInt8.declined());
        assert_eq!(
            printed.contains("no AMX int8 tiles: "),
            isa == Isa::Avx512Vnni
        );
        let (f16, lut) = if isa.has_avx512() {
            ("widened in AVX-512 registers", "16-entry lookup table")
        } else {
            ("widened into f32 scratch first", "entry by entry")
        };
        assert!(
            printed.contains(&format!("f16 KV cache: {f16}")),
            "{printed}"
        );
        assert!(printed.contains(lut), "{printed}");
        for plan in [
            ExecutionPlan::for_backend::<Flex>(Route::BurnOpsOnly),
            ExecutionPlan::for_backend::<Autodiff<Flex>>(Route::Fastest),
        ] {
            assert_eq!(plan.cpu, None);
            let printed = plan.to_string();
            assert!(!printed.contains("CPU kernels"), "{printed}");
            assert!(!printed.contains("f16 KV cache"), "{printed}");
        }
    }
}
