//! Times decode steps of the server's configuration (SmolLM2 Q4_1 with 8-bit
//! activations, an f16 KV cache, 8 LoRA members) at several batch sizes: each
//! request is the public row and 8 member rows, after a 48-token prompt, so a
//! batch of R requests runs 9·R rows per step. Prints ms per step and rows/s, and
//! the server's mechanism phase on those rows (each request's rows turned into
//! probabilities, validated into its reused ensemble, PMixED released and a token
//! drawn, every request in one parallel region as `privmix serve` does) separately.
//! PMixED is calibrated as the server calibrates it, for `SERVE_STEP_EPSILON` (10⁶
//! by default, the serving benchmark's budget) over 32 queries at δ = 10⁻⁵.
//!
//! `cargo run --release -p privmix-ensemble --example serve_step -- MODEL MEMBERS_DIR [REQUESTS...]`

use std::time::Instant;

use burn::backend::Flex;
use privmix_accountant::Orders;
use privmix_ensemble::lora::{LoraAdapter, LoraBase};
use privmix_ensemble::rows::RowLayout;
use privmix_ensemble::runner::EnsembleRunner;
use privmix_ensemble::stacked::FactorPrecision;
use privmix_mechanisms::{
    Ensemble, EnsembleMechanism, Pmixed, PmixedConfig, PrivacyRng, Rows, Unbudgeted,
};
use privmix_models::{DecodeProducts, KvPrecision, LanguageModel, LoadOptions, Model};
use rayon::prelude::*;

const MEMBERS: usize = 8;
const PROMPT: usize = 48;

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let [model, members, requests @ ..] = args.as_slice() else {
        return Err("usage: serve_step MODEL MEMBERS_DIR [REQUESTS...]".into());
    };
    let requests: Vec<usize> = if requests.is_empty() {
        vec![1, 8, 32]
    } else {
        requests
            .iter()
            .map(|r| r.parse())
            .collect::<Result<_, _>>()?
    };
    // Steps timed per batch size (`SERVE_STEP_STEPS`, 6 by default).
    let steps: usize = std::env::var("SERVE_STEP_STEPS").map_or(Ok(6), |s| s.parse())?;
    let epsilon: f64 = std::env::var("SERVE_STEP_EPSILON").map_or(Ok(1e6), |s| s.parse())?;
    let orders = Orders::default();
    let pmixed = PmixedConfig::calibrate(epsilon, 1e-5, 32, 1.0, MEMBERS as u64, 36.0, &orders)?;
    let device = Default::default();
    let model = Model::<Flex>::load(
        LoadOptions::path(model, &device).decode_products(DecodeProducts::Int8Activations),
    )?;
    let base = model.base_shapes()?;
    let adapters = (0..MEMBERS)
        .map(|i| {
            let dir = std::path::Path::new(members).join(format!("member-{i}"));
            LoraAdapter::<Flex>::load_peft(&dir, &base, &device)
        })
        .collect::<Result<Vec<_>, _>>()?;
    let vocab = model.vocab_size() as u32;
    let runner = EnsembleRunner::with_precision(model, &adapters, FactorPrecision::F32)?
        .with_kv_precision(KvPrecision::F16);
    for &r in &requests {
        let layout: Vec<Option<usize>> = (0..r)
            .flat_map(|_| std::iter::once(None).chain((0..MEMBERS).map(Some)))
            .collect();
        let rows = layout.len();
        let mut decoder = runner.decoder(RowLayout::custom(layout))?;
        let prompt: Vec<u32> = (0..PROMPT as u32).map(|t| (t * 97 + 13) % vocab).collect();
        decoder.prefill(&prompt)?;
        let tokens: Vec<u32> = (0..rows as u32).map(|t| (t * 31 + 7) % vocab).collect();
        decoder.next_log_probs_rows(&tokens)?;
        eprintln!("prefilled {rows} rows");
        let mut states: Vec<MechanismState> = (0..r)
            .map(|_| MechanismState::new(&pmixed))
            .collect::<Result<_, _>>()?;
        // Wall and CPU seconds of each phase, summed over the steps.
        let (mut forward, mut mechanism) = ([0.0; 2], [0.0; 2]);
        for _ in 0..steps {
            let (start, cpu) = (Instant::now(), cpu_seconds());
            let log_probs = decoder.next_log_probs_rows(&tokens)?;
            forward[0] += start.elapsed().as_secs_f64();
            forward[1] += cpu_seconds() - cpu;
            let (start, cpu) = (Instant::now(), cpu_seconds());
            let vocab = log_probs.vocab();
            states
                .par_iter_mut()
                .zip(log_probs.as_flat().par_chunks((1 + MEMBERS) * vocab))
                .try_for_each(|(state, rows)| state.step(rows, vocab, &orders).map(drop))?;
            mechanism[0] += start.elapsed().as_secs_f64();
            mechanism[1] += cpu_seconds() - cpu;
        }
        let ms = |s: f64| s * 1e3 / steps as f64;
        println!(
            "{r} requests, {rows} rows: forward {:.1} ms/step ({:.0} rows/s, {:.1} CPU ms), mechanism {:.1} ms/step ({:.1} CPU ms)",
            ms(forward[0]),
            rows as f64 * steps as f64 / forward[0],
            ms(forward[1]),
            ms(mechanism[0]),
            ms(mechanism[1]),
        );
    }
    Ok(())
}

/// One request's PMixED and the buffers its steps reuse, as the server keeps them.
struct MechanismState {
    pmixed: Pmixed,
    rng: PrivacyRng,
    probs: Vec<f32>,
    ensemble: Option<Ensemble>,
}

impl MechanismState {
    fn new(config: &PmixedConfig) -> Result<Self, privmix_mechanisms::MechanismError> {
        Ok(Self {
            pmixed: Pmixed::new(*config),
            rng: PrivacyRng::from_os()?,
            probs: Vec::new(),
            ensemble: None,
        })
    }

    /// The server's mechanism step on one request's rows (public, then members).
    fn step(
        &mut self,
        log_probs: &[f32],
        vocab: usize,
        orders: &Orders,
    ) -> Result<usize, privmix_mechanisms::MechanismError> {
        self.probs.clear();
        self.probs.extend_from_slice(log_probs);
        privmix_models::cpu::vexp::exp_shifted_in_place(&mut self.probs, 0.0);
        let ensemble = Ensemble::renew_or_new(
            self.ensemble.take(),
            Rows::ProbF32(&self.probs[..vocab]),
            Rows::ProbF32(&self.probs[vocab..]),
        )?;
        let mut account = Unbudgeted::new(orders.clone());
        let token = self
            .pmixed
            .step(&ensemble, &mut self.rng, &mut account)?
            .token;
        self.ensemble = Some(ensemble);
        Ok(token)
    }
}

/// User + system CPU seconds of this process so far (`/proc/self/stat`), or 0 where
/// that file is absent: the work done, whatever else the machine runs.
fn cpu_seconds() -> f64 {
    let Ok(stat) = std::fs::read_to_string("/proc/self/stat") else {
        return 0.0;
    };
    // Fields after the command name (which may hold spaces) start after ')'.
    let fields: Vec<&str> = stat
        .rsplit_once(')')
        .map_or("", |(_, rest)| rest)
        .split_whitespace()
        .collect();
    let ticks = |i: usize| {
        fields
            .get(i)
            .and_then(|f| f.parse::<f64>().ok())
            .unwrap_or(0.0)
    };
    // utime and stime, fields 14 and 15 of the whole line (11 and 12 here), in
    // clock ticks of 1/100 s on Linux.
    (ticks(11) + ticks(12)) / 100.0
}
