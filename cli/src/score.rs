//! `privmix score`: perplexity of a mechanism's next-token distributions on a text file.
//!
//! The text is cut into blocks of `--block` tokens; at every position the mechanism's
//! output distribution given the true prefix is evaluated at the true next token (teacher
//! forcing), perplexity is `exp(−mean log p)` per block and then the mean over blocks (as
//! in the PMixED and SubMix evaluations).
//!
//! # Why a perplexity over private adapters needs `--no-privacy`
//!
//! A mechanism's guarantee covers one token *sampled* from each output distribution, not
//! the distribution: the probability it gives the true next token is a deterministic
//! function of the members (PMixED with q = 1 has no randomness before sampling), so no
//! per-query charge bounds what a perplexity reveals, and it is exactly what a
//! membership-inference attack asks for. `score` therefore never charges a ledger (a
//! charge would suggest a guarantee that does not exist). Over private adapters it
//! refuses unless `--no-privacy` is given, and then marks its output `"private": false`;
//! the `public` mechanism reads no private data and needs no flag.
//!
//! Every position is one query (`EnsembleMechanism::release` gives the distribution a
//! step would sample), composed into an account without a budget: the ε reported is what
//! sampling one token per position of the whole run would cost, a calibration aid, not a
//! guarantee for the perplexity.
//!
//! `--text PATH|-` is one text, or with `--jsonl` one text or conversation a line, each
//! scored apart (its own blocks and perplexity, reported with its index) under one
//! mechanism calibrated for all their positions. `--chat` renders each through the chat
//! template first. `--temperature` tempers each model's distribution before the
//! mechanism (`temper.rs`). A progress bar on stderr counts the blocks. Nothing derived from the steps' diagnostics (λ, losses, how many
//! answers fell back to the public model) is printed.

use indicatif::{ProgressBar, ProgressDrawTarget, ProgressStyle};
use privmix_accountant::Orders;
use privmix_mechanisms::step_loop::settle_charged;
use privmix_mechanisms::{Ensemble, PrivacyRng, Rows, Unbudgeted};
use privmix_models::ModelBackend;
use serde_json::json;

use crate::args::{MechanismKind, ScoreArgs};
use crate::error::CliError;
use crate::prompts::{PromptInput, prompt_ids, read_prompts};
use crate::protected::protected_set;
use crate::setup::{
    BackendFn, MechanismPlan, build_mechanism, load_chat_template, load_runner, load_tokenizer,
    with_backend,
};
use crate::temper::{check_temperature, tempered_rows};

/// Runs `privmix score`.
pub fn run(args: &ScoreArgs) -> Result<(), CliError> {
    let kind = args.model.mechanism;
    if args.block < 2 {
        return Err(CliError::arg("--block", "a block needs at least 2 tokens"));
    }
    check_temperature(args.model.temperature)?;
    if kind != MechanismKind::Public && !args.no_privacy {
        return Err(CliError::arg(
            "--no-privacy",
            format!(
                "{} reads the private adapters, and no privacy charge covers a perplexity (a mechanism's guarantee is for tokens sampled from its distributions, not for the probabilities it gives the true text: a membership-inference oracle); pass --no-privacy to compute it anyway, marked \"private\": false",
                kind.name()
            ),
        ));
    }
    if args.seed.is_some() && !args.no_privacy {
        return Err(CliError::arg(
            "--seed",
            "a seeded run is an experiment with no privacy: pass --no-privacy",
        ));
    }
    // One member's data counted twice is refused here as in generate.
    protected_set(&args.model.adapters)?;
    let inputs = read_prompts(&args.text, args.jsonl, args.chat)?;
    with_backend(args.model.backend, Scoring { args, inputs })
}

/// A score run once its arguments are checked, generic over the backend.
struct Scoring<'a> {
    args: &'a ScoreArgs,
    inputs: Vec<PromptInput>,
}

impl BackendFn<()> for Scoring<'_> {
    fn run<B: ModelBackend>(self, device: B::Device) -> Result<(), CliError> {
        let Scoring { args, inputs } = self;
        let kind = args.model.mechanism;
        let private = !args.no_privacy;
        let runner = load_runner::<B>(&args.model, &device)?;
        let tokenizer = load_tokenizer(&args.model)?.ok_or(CliError::NoTokenizer)?;
        let template = if args.chat {
            Some(load_chat_template(&args.model)?)
        } else {
            None
        };
        let name = crate::prompts::input_name(&args.text);
        // Each text's blocks; a text is encoded without special tokens (a chat render
        // writes its own).
        let mut texts: Vec<Vec<Vec<u32>>> = Vec::with_capacity(inputs.len());
        for (i, input) in inputs.iter().enumerate() {
            let tokens = match (input, &template) {
                (PromptInput::Text(text), None) => tokenizer
                    .encode(text, false)
                    .map_err(|e| CliError::Tokenizer(e.to_string()))?,
                _ => prompt_ids(input, Some(&tokenizer), template.as_ref(), false)?,
            };
            let mut blocks: Vec<Vec<u32>> = tokens
                .chunks(args.block)
                .filter(|b| b.len() >= 2)
                .map(<[u32]>::to_vec)
                .collect();
            if let Some(max) = args.max_blocks {
                blocks.truncate(max);
            }
            if blocks.is_empty() {
                let which = if inputs.len() > 1 {
                    format!(" (text {i})")
                } else {
                    String::new()
                };
                return Err(CliError::arg(
                    "--text",
                    format!("{name}{which} has fewer than 2 tokens"),
                ));
            }
            texts.push(blocks);
        }
        let all_blocks: usize = texts.iter().map(Vec::len).sum();
        let queries: u64 = texts.iter().flatten().map(|b| b.len() as u64 - 1).sum();
        let orders = Orders::dp_accounting_default();
        let (mut mechanism, layout) = build_mechanism(&MechanismPlan {
            kind,
            params: &args.model.params,
            members: runner.num_members(),
            epsilon: args.epsilon,
            spent: None,
            delta: args.delta,
            queries,
            orders: &orders,
        })?;
        let mut rng = match args.seed {
            Some(seed) => PrivacyRng::from_seed(seed),
            None => PrivacyRng::from_os()?,
        };
        // Every position is one query, charged as if its token were released; the
        // account has no budget (nothing is written to a ledger).
        let mut account = Unbudgeted::new(orders);
        let bar = progress_bar(all_blocks as u64);
        let mut tempered = Vec::new();
        let mut results = Vec::with_capacity(texts.len());
        for blocks in &texts {
            let mut block_perplexities = Vec::with_capacity(blocks.len());
            for block in blocks {
                let steps = runner.score_block_full(&layout, block)?;
                let mut nll = 0.0f64;
                for (i, rows) in steps.iter().enumerate() {
                    let (public, members) =
                        tempered_rows(rows, args.model.temperature, &mut tempered);
                    let members = if layout.len() > 1 { members } else { &[] };
                    let ensemble =
                        Ensemble::new(Rows::LogProbF32(public), Rows::LogProbF32(members))?;
                    // The step loop, releasing a score: the unbudgeted account never
                    // refuses, so every position is scored.
                    let stepped = mechanism.release(&ensemble, &mut rng, &mut account);
                    let release = settle_charged(stepped)?.ok_or_else(|| {
                        CliError::arg("--mechanism", "internal: an unbudgeted charge was refused")
                    })?;
                    nll -= release.distribution[block[i + 1] as usize].ln();
                }
                block_perplexities.push((nll / steps.len() as f64).exp());
                bar.inc(1);
            }
            let perplexity =
                block_perplexities.iter().sum::<f64>() / block_perplexities.len() as f64;
            let text_queries: u64 = blocks.iter().map(|b| b.len() as u64 - 1).sum();
            results.push((perplexity, blocks.len(), text_queries));
        }
        bar.finish_and_clear();
        // The ε of all the run's queries (every text's), reported with each text.
        let spent = account.spent().epsilon(args.delta)?;
        let many = results.len() > 1;
        for (index, (perplexity, blocks, queries)) in results.into_iter().enumerate() {
            let which = if many {
                format!("text {index}: ")
            } else {
                String::new()
            };
            if args.json {
                let line = json!({
                    "prompt": index,
                    "mechanism": kind.name(),
                    "perplexity": perplexity.is_finite().then_some(perplexity),
                    "blocks": blocks,
                    "queries": queries,
                    "epsilon": spent.epsilon.is_finite().then_some(spent.epsilon),
                    "delta": args.delta,
                    "order": spent.order,
                    "private": private,
                });
                println!("{line}");
            } else if private {
                println!(
                    "{which}{}: perplexity {perplexity:.4} over {blocks} blocks ({queries} queries; \
                     the public model alone, no private data read)",
                    kind.name(),
                );
            } else {
                println!(
                    "{which}{}: perplexity {perplexity:.4} over {blocks} blocks ({queries} queries); \
                     NOT private (--no-privacy): no charge covers a perplexity; sampling one token \
                     per query of this run would cost ε = {} at δ = {}",
                    kind.name(),
                    spent.epsilon,
                    args.delta
                );
            }
        }
        Ok(())
    }
}

fn progress_bar(len: u64) -> ProgressBar {
    let bar = ProgressBar::with_draw_target(Some(len), ProgressDrawTarget::stderr());
    if let Ok(style) = ProgressStyle::with_template("scoring {bar:30} {pos}/{len} blocks ({eta})") {
        bar.set_style(style);
    }
    bar
}
