//! Admission: requests waiting to join the running batch, and their prompts'
//! prefill under a per-step budget.
//!
//! At each step boundary the engine prefills at most `--prefill-budget` (default
//! [`PREFILL_ROW_TOKENS`]) row-tokens of prompt (a prompt's tokens times its
//! request's rows), oldest request first:
//!
//! - the whole prompts that fit what is left of the budget are prefilled together,
//!   in one forward of one decoder (their rows concatenated, each prompt left-padded
//!   to the longest with masked padding that no row attends), so that requests
//!   arriving together read the weights once;
//! - a prompt that does not fit is prefilled in chunks, step after step, in a decoder
//!   of its own, each chunk what the budget has left.
//!
//! So an arrival holds the running batch's step back by at most one budget's worth
//! of prefill, however long its prompt (as the chunked prefill of llama.cpp's server,
//! vLLM and TGI), and the requests in the batch go on decoding meanwhile. A request
//! whose prompt is fully prefilled joins the batch at that step's end, after its
//! first mechanism step; a prefilled decoder's rows continue as they would alone
//! (the continuous-batching tests of `ensemble/tests/integration/continuous_batching.rs`).
//!
//! The last few prompts prefilled alone (or with copies of themselves) are kept, with
//! their rows' caches and log-probabilities: a request of the same tenant, prompt and
//! rows starts from a copy of them, with no forward (as llama.cpp's server reuses a
//! slot's cached prompt). The forward is deterministic, so a copy holds what its own
//! prefill would have computed. Whether a request hits depends on its tenant's own
//! earlier prompts only: never on the members, and never on another tenant's prompts
//! (whose reuse would show in the time to the first token).
//!
//! Nothing a prefill computes leaves the engine: its log-probabilities are only the
//! first input of each request's mechanism, and no charge is due for them.

use std::collections::VecDeque;
use std::sync::Arc;

use burn::tensor::backend::Backend;
use privmix_accountant::Orders;
use privmix_ensemble::lora::LoraBase;
use privmix_ensemble::rows::{LogProbRows, RowLayout};
use privmix_ensemble::runner::{Decoder, EnsembleRunner};
use privmix_models::LanguageModel;

use crate::args::MechanismParams;
use crate::error::CliError;
use crate::setup::{MechanismPlan, build_mechanism};

use super::draw::MechanismState;
use super::job::{EngineConfig, Event, Job, Note};

/// Row-tokens of prompt prefilled per step at most, by default (llama.cpp's server
/// takes 2,048 tokens per batch by default); a request of more rows than the budget
/// still advances by one token per step.
pub const PREFILL_ROW_TOKENS: usize = 2048;

/// Prompts kept for reuse ([`Admission`]'s `recent`), each of at most the prefill
/// budget's row-tokens.
const RECENT_PROMPTS: usize = 4;

/// A prompt prefilled alone: who asked, its rows' decoder and log-probabilities.
struct Recent<'a, B: Backend, M> {
    tenant: Option<String>,
    rows: Vec<Option<usize>>,
    prompt: Vec<u32>,
    decoder: Decoder<'a, B, M>,
    current: Arc<LogProbRows>,
}

/// The name of the tenant `p` is for.
fn tenant_of<'p, B: Backend, M>(p: &'p Prefill<'_, B, M>) -> Option<&'p str> {
    p.job.tenant.as_ref().map(|t| t.name.as_str())
}

/// Whether `p` is for `tenant` and asks for the prefill of `prompt` by `rows`.
fn same_prefill<B: Backend, M>(
    p: &Prefill<'_, B, M>,
    tenant: Option<&str>,
    rows: &[Option<usize>],
    prompt: &[u32],
) -> bool {
    tenant_of(p) == tenant && p.layout.rows() == rows && p.job.prompt == prompt
}

/// A request being prefilled.
struct Prefill<'a, B: Backend, M> {
    job: Job,
    mech: MechanismState,
    layout: RowLayout,
    /// Once its prompt is prefilled in chunks: its own decoder and the prompt
    /// tokens fed to it so far.
    chunked: Option<(Decoder<'a, B, M>, usize)>,
}

/// A request whose prompt is prefilled, ready for its first step.
pub struct Prefilled {
    /// The request.
    pub job: Job,
    /// Its mechanism.
    pub mech: MechanismState,
    /// Its number of rows.
    pub rows: usize,
    /// The log-probabilities its first step reads, from row `first` on.
    pub current: Arc<LogProbRows>,
    /// Where its rows start in `current` and in its decoder.
    pub first: usize,
    /// Which of the step's decoders ([`Admitted::decoders`]) holds its rows.
    pub decoder: usize,
}

/// What one step's admission prefilled.
pub struct Admitted<'a, B: Backend, M> {
    /// Decoders holding prefilled rows, to join the batch at the step's end.
    pub decoders: Vec<Decoder<'a, B, M>>,
    /// The requests ready for their first step, by decoder and then by row.
    pub ready: Vec<Prefilled>,
}

/// Requests received and not yet in the batch.
pub struct Admission<'a, B: Backend, M> {
    /// Received, mechanism not yet built.
    waiting: VecDeque<Job>,
    /// Started: mechanism built, prompt being prefilled.
    prefilling: VecDeque<Prefill<'a, B, M>>,
    /// The last prompts prefilled alone, newest first.
    recent: VecDeque<Recent<'a, B, M>>,
}

impl<B: Backend, M> Default for Admission<'_, B, M> {
    /// No request waiting.
    fn default() -> Self {
        Self {
            waiting: VecDeque::new(),
            prefilling: VecDeque::new(),
            recent: VecDeque::new(),
        }
    }
}

impl<'a, B, M> Admission<'a, B, M>
where
    B: Backend,
    M: LanguageModel<B> + LoraBase,
{
    /// True when no request waits or is being prefilled.
    pub fn is_idle(&self) -> bool {
        self.waiting.is_empty() && self.prefilling.is_empty()
    }

    /// Queues a received request.
    pub fn push(&mut self, job: Job) {
        self.waiting.push_back(job);
    }

    /// One step's admission: waiting requests started (their mechanisms built)
    /// while fewer than `room` are being prefilled, then at most
    /// `config.prefill_budget` row-tokens of their prompts prefilled, oldest first.
    /// A request that cannot be started or prefilled is told why ([`Event::Failed`])
    /// and dropped.
    pub fn step(
        &mut self,
        runner: &'a EnsembleRunner<B, M>,
        config: &EngineConfig,
        params: &MechanismParams,
        orders: &Orders,
        room: usize,
    ) -> Result<Admitted<'a, B, M>, CliError> {
        while self.prefilling.len() < room {
            let Some(job) = self.waiting.pop_front() else {
                break;
            };
            if let Some(p) = start(runner, config, params, orders, job)? {
                self.prefilling.push_back(p);
            }
        }
        let mut out = Admitted {
            decoders: Vec::new(),
            ready: Vec::new(),
        };
        let mut budget = config.prefill_budget;
        let mut group: Vec<Prefill<'a, B, M>> = Vec::new();
        // Requests of the same prompt and rows as one in `group`.
        let mut copies: Vec<Prefill<'a, B, M>> = Vec::new();
        let mut later = VecDeque::new();
        let mut progressed = false;
        while let Some(mut p) = self.prefilling.pop_front() {
            if p.job.events.is_closed() {
                continue;
            }
            let rows = p.layout.len();
            let len = p.job.prompt.len();
            if p.chunked.is_none() {
                if let Some(r) = self
                    .recent
                    .iter()
                    .find(|r| same_prefill(&p, r.tenant.as_deref(), &r.rows, &r.prompt))
                {
                    out.decoders.push(r.decoder.clone());
                    out.ready.push(Prefilled {
                        job: p.job,
                        mech: p.mech,
                        rows,
                        current: Arc::clone(&r.current),
                        first: 0,
                        decoder: out.decoders.len() - 1,
                    });
                    continue;
                }
                if group
                    .iter()
                    .any(|g| same_prefill(&p, tenant_of(g), g.layout.rows(), &g.job.prompt))
                {
                    copies.push(p);
                    continue;
                }
            }
            if p.chunked.is_none() && rows * len <= budget {
                budget -= rows * len;
                progressed = true;
                group.push(p);
                continue;
            }
            let fed = p.chunked.as_ref().map_or(0, |(_, fed)| *fed);
            let mut chunk = (budget / rows).min(len - fed);
            if chunk == 0 && !progressed {
                chunk = 1;
            }
            if chunk == 0 {
                later.push_back(p);
                continue;
            }
            budget = budget.saturating_sub(rows * chunk);
            progressed = true;
            let (mut decoder, fed) = match p.chunked.take() {
                Some(c) => c,
                None => (runner.decoder(p.layout.clone())?, 0),
            };
            match decoder.prefill(&p.job.prompt[fed..fed + chunk]) {
                Err(e) => {
                    let _ = p.job.events.send(Note::Now(Event::Failed(e.to_string())));
                }
                Ok(current) if fed + chunk == len => {
                    out.decoders.push(decoder);
                    out.ready.push(Prefilled {
                        job: p.job,
                        mech: p.mech,
                        rows,
                        current: Arc::new(current),
                        first: 0,
                        decoder: out.decoders.len() - 1,
                    });
                }
                Ok(_) => {
                    p.chunked = Some((decoder, fed + chunk));
                    later.push_back(p);
                }
            }
        }
        self.prefilling = later;
        let alone = group.len() == 1;
        let kept = group.first().map(|p| {
            (
                tenant_of(p).map(str::to_string),
                p.layout.rows().to_vec(),
                p.job.prompt.clone(),
            )
        });
        let before = out.decoders.len();
        prefill_together(runner, group, &mut out)?;
        // A prompt prefilled alone is kept, and its copies start from it; copies of
        // a prompt prefilled beside others wait for the next step.
        match kept {
            Some((tenant, rows, prompt)) if alone && out.decoders.len() > before => {
                let recent = Recent {
                    tenant,
                    rows,
                    prompt,
                    decoder: out.decoders[before].clone(),
                    current: Arc::clone(&out.ready[out.ready.len() - 1].current),
                };
                self.recent.push_front(recent);
                self.recent.truncate(RECENT_PROMPTS);
                for c in copies {
                    let r = &self.recent[0];
                    out.decoders.push(r.decoder.clone());
                    out.ready.push(Prefilled {
                        job: c.job,
                        mech: c.mech,
                        rows: c.layout.len(),
                        current: Arc::clone(&r.current),
                        first: 0,
                        decoder: out.decoders.len() - 1,
                    });
                }
            }
            _ => {
                for c in copies.into_iter().rev() {
                    self.prefilling.push_front(c);
                }
            }
        }
        Ok(out)
    }
}

/// Builds a request's mechanism (with the server's calibrated parameters); a
/// request whose client has left is dropped, one whose mechanism cannot be built
/// is told so.
fn start<'a, B, M>(
    runner: &'a EnsembleRunner<B, M>,
    config: &EngineConfig,
    params: &MechanismParams,
    orders: &Orders,
    job: Job,
) -> Result<Option<Prefill<'a, B, M>>, CliError>
where
    B: Backend,
    M: LanguageModel<B> + LoraBase,
{
    if job.events.is_closed() {
        return Ok(None);
    }
    let built = build_mechanism(&MechanismPlan {
        kind: config.mechanism,
        params,
        members: runner.num_members(),
        epsilon: config.request_epsilon,
        spent: None,
        delta: config.delta,
        queries: config.max_tokens,
        orders,
    });
    match built {
        Ok((mechanism, layout)) => Ok(Some(Prefill {
            job,
            mech: MechanismState::new(mechanism)?,
            layout,
            chunked: None,
        })),
        Err(e) => {
            let _ = job.events.send(Note::Now(Event::Failed(e.to_string())));
            Ok(None)
        }
    }
}

/// Prefills the whole prompts of `group` in one decoder (each request's rows fed its
/// prompt, left-padded to the longest); if that fails, each alone, so that a
/// request whose prompt fails is the only one told.
fn prefill_together<'a, B, M>(
    runner: &'a EnsembleRunner<B, M>,
    group: Vec<Prefill<'a, B, M>>,
    out: &mut Admitted<'a, B, M>,
) -> Result<(), CliError>
where
    B: Backend,
    M: LanguageModel<B> + LoraBase,
{
    if group.is_empty() {
        return Ok(());
    }
    let rows: Vec<Option<usize>> = group
        .iter()
        .flat_map(|p| p.layout.rows().iter().copied())
        .collect();
    let contexts: Vec<Vec<u32>> = group
        .iter()
        .flat_map(|p| std::iter::repeat_n(p.job.prompt.clone(), p.layout.len()))
        .collect();
    let mut decoder = runner.decoder(RowLayout::custom(rows))?;
    let together = if group.len() == 1 {
        decoder.prefill(&group[0].job.prompt)
    } else {
        decoder.prefill_rows(&contexts)
    };
    match together {
        Ok(current) => {
            let current = Arc::new(current);
            out.decoders.push(decoder);
            let at = out.decoders.len() - 1;
            let mut first = 0;
            for p in group {
                let rows = p.layout.len();
                out.ready.push(Prefilled {
                    job: p.job,
                    mech: p.mech,
                    rows,
                    current: Arc::clone(&current),
                    first,
                    decoder: at,
                });
                first += rows;
            }
        }
        Err(e) if group.len() == 1 => {
            let p = group.into_iter().next().expect("one request");
            let _ = p.job.events.send(Note::Now(Event::Failed(e.to_string())));
        }
        Err(_) => {
            for p in group {
                prefill_together(runner, vec![p], out)?;
            }
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use burn::backend::Flex;
    use clap::Parser;
    use privmix_accountant::Orders;

    use super::*;
    use crate::setup::{Runner, load_runner};

    /// The tiny Llama fixture with two PEFT members, as `serve` loads them.
    fn tiny_runner() -> (Runner<Flex>, EngineConfig) {
        let root = env!("CARGO_MANIFEST_DIR");
        let model = format!("{root}/../models/tests/fixtures/hf/llama");
        let peft = format!("{root}/../ensemble/tests/fixtures/peft");
        let (a, b) = (format!("{peft}/ours"), format!("{peft}/full"));
        #[derive(Parser)]
        struct Cli {
            #[command(flatten)]
            serve: crate::serve::ServeArgs,
        }
        let args = Cli::try_parse_from([
            "serve",
            "--model",
            &model,
            "--ledger",
            "l",
            "--no-auth",
            "--adapter",
            &a,
            "--adapter",
            &b,
        ])
        .unwrap()
        .serve;
        let model = args.model_args();
        let runner = load_runner::<Flex>(&model, &Default::default()).unwrap();
        let config = EngineConfig {
            mechanism: model.mechanism,
            params: model.params.clone(),
            request_epsilon: 1.0,
            max_tokens: 8,
            max_batch: 8,
            prefill_budget: PREFILL_ROW_TOKENS,
            stop_ids: Vec::new(),
            delta: 1e-6,
            paced: false,
            phase_timings: false,
        };
        (runner, config)
    }

    /// A request reusing a kept prompt (same tenant, prompt and rows: no forward)
    /// starts from the same log-probabilities, bit for bit, as a fresh prefill of
    /// its prompt, and its decoder then decodes the same tokens to the same
    /// log-probabilities as the fresh one's and as the decoder it was copied from
    /// (the copy shares no cache that a step of the other would change).
    #[test]
    fn a_reused_prompt_decodes_bit_for_bit_as_a_fresh_prefill() {
        let (runner, config) = tiny_runner();
        let orders = Orders::dp_accounting_default();
        let (events, _received) = tokio::sync::mpsc::unbounded_channel();
        let prompt: Vec<u32> = vec![5, 17, 3, 42, 9, 11];
        let job = || Job {
            prompt: prompt.clone(),
            max_tokens: 8,
            temperature: 1.0,
            stop: Vec::new(),
            tenant: None,
            events: events.clone(),
        };
        let mut admission = Admission::default();
        admission.push(job());
        let mut first = admission
            .step(&runner, &config, &config.params, &orders, 4)
            .unwrap();
        admission.push(job());
        let mut second = admission
            .step(&runner, &config, &config.params, &orders, 4)
            .unwrap();
        assert_eq!((first.ready.len(), second.ready.len()), (1, 1));
        // The second request was served from the kept prompt, with no forward.
        assert!(Arc::ptr_eq(
            &first.ready[0].current,
            &second.ready[0].current
        ));
        let bits = |rows: &LogProbRows| -> Vec<u32> {
            (0..rows.rows())
                .flat_map(|r| rows.row(r).iter().map(|x| x.to_bits()).collect::<Vec<_>>())
                .collect()
        };
        let layout = first.decoders[0].layout().clone();
        let mut fresh = runner.decoder(layout).unwrap();
        let fresh_start = fresh.prefill(&prompt).unwrap();
        assert_eq!(bits(&second.ready[0].current), bits(&fresh_start));
        let mut reused = second.decoders.remove(0);
        let mut original = first.decoders.remove(0);
        let rows = reused.len();
        for step in 0..4u32 {
            let tokens: Vec<u32> = (0..rows as u32).map(|r| 7 + 3 * step + r).collect();
            let want = bits(&fresh.next_log_probs_rows(&tokens).unwrap());
            assert_eq!(
                bits(&reused.next_log_probs_rows(&tokens).unwrap()),
                want,
                "step {step}: the reused prompt's decoder"
            );
            assert_eq!(
                bits(&original.next_log_probs_rows(&tokens).unwrap()),
                want,
                "step {step}: the decoder it was copied from"
            );
        }
    }
}
