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
//! sampling one token per position would cost, a calibration aid, not a guarantee for
//! the perplexity. Nothing derived from the steps' diagnostics (λ, losses, how many
//! answers fell back to the public model) is printed.

use privmix_accountant::Orders;
use privmix_mechanisms::{Ensemble, PrivacyRng, Rows, Unbudgeted};
use serde_json::json;

use crate::args::{MechanismKind, ScoreArgs};
use crate::error::CliError;
use crate::protected::protected_set;
use crate::setup::{MechanismPlan, build_mechanism, load_runner, load_tokenizer};

/// Runs `privmix score`.
pub fn run(args: &ScoreArgs) -> Result<(), CliError> {
    let kind = args.model.mechanism;
    if args.block < 2 {
        return Err(CliError::arg("--block", "a block needs at least 2 tokens"));
    }
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
    let private = !args.no_privacy;
    // One member's data counted twice is refused here as in generate.
    protected_set(&args.model.adapters)?;
    let text = std::fs::read_to_string(&args.text).map_err(|source| CliError::Io {
        what: format!("reading {}", args.text.display()),
        source,
    })?;
    let runner = load_runner(&args.model)?;
    let tokenizer = load_tokenizer(&args.model)?.ok_or(CliError::NoTokenizer)?;
    let tokens = tokenizer
        .encode(&text, false)
        .map_err(|e| CliError::Tokenizer(e.to_string()))?;
    let mut blocks: Vec<&[u32]> = tokens.chunks(args.block).filter(|b| b.len() >= 2).collect();
    if let Some(max) = args.max_blocks {
        blocks.truncate(max);
    }
    if blocks.is_empty() {
        return Err(CliError::arg(
            "--text",
            format!("{} has fewer than 2 tokens", args.text.display()),
        ));
    }
    let queries: u64 = blocks.iter().map(|b| b.len() as u64 - 1).sum();
    let orders = Orders::dp_accounting_default();
    let (mut mechanism, layout) = build_mechanism(&MechanismPlan {
        kind,
        params: &args.model.params,
        members: runner.num_members(),
        epsilon: args.epsilon,
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
    let mut block_perplexities = Vec::with_capacity(blocks.len());
    for block in &blocks {
        let steps = runner.score_block_full(&layout, block)?;
        let mut nll = 0.0f64;
        for (i, rows) in steps.iter().enumerate() {
            let members = if layout.len() > 1 {
                rows.member_rows()
            } else {
                &[]
            };
            let ensemble = Ensemble::new(Rows::LogProbF32(rows.row(0)), Rows::LogProbF32(members))?;
            let release = mechanism.release(&ensemble, &mut rng, &mut account)?;
            nll -= release.distribution[block[i + 1] as usize].ln();
        }
        block_perplexities.push((nll / steps.len() as f64).exp());
    }
    let perplexity = block_perplexities.iter().sum::<f64>() / block_perplexities.len() as f64;
    let spent = account.spent().epsilon(args.delta)?;
    if args.json {
        let line = json!({
            "mechanism": kind.name(),
            "perplexity": perplexity.is_finite().then_some(perplexity),
            "blocks": blocks.len(),
            "queries": queries,
            "epsilon": spent.epsilon.is_finite().then_some(spent.epsilon),
            "delta": args.delta,
            "order": spent.order,
            "private": private,
        });
        println!("{line}");
    } else if private {
        println!(
            "{}: perplexity {perplexity:.4} over {} blocks ({queries} queries; the public model \
             alone, no private data read)",
            kind.name(),
            blocks.len(),
        );
    } else {
        println!(
            "{}: perplexity {perplexity:.4} over {} blocks ({queries} queries); NOT private \
             (--no-privacy): no charge covers a perplexity; sampling one token per query would \
             cost ε = {} at δ = {}",
            kind.name(),
            blocks.len(),
            spent.epsilon,
            args.delta
        );
    }
    Ok(())
}
