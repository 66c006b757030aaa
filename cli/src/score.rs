//! `privmix score`: perplexity of a mechanism's next-token distributions on a text file.
//!
//! The text is cut into blocks of `--block` tokens; at every position the mechanism's
//! output distribution given the true prefix is evaluated at the true next token (teacher
//! forcing), perplexity is `exp(−mean log p)` per block and then the mean over blocks (as
//! in the PMixED and SubMix evaluations). Every position is one query, for any mechanism
//! (`EnsembleMechanism::release` gives the distribution a step would sample): its charge is
//! composed into an account without a budget, and the total ε those queries would cost if
//! their tokens were released is reported (nothing is written to any ledger).

use privmix_accountant::Orders;
use privmix_mechanisms::{Ensemble, PrivacyRng, PublicReason, Rows, Unbudgeted};
use serde_json::json;

use crate::args::ScoreArgs;
use crate::error::CliError;
use crate::setup::{MechanismPlan, build_mechanism, load_runner, load_tokenizer};

/// Runs `privmix score`.
pub fn run(args: &ScoreArgs) -> Result<(), CliError> {
    let kind = args.model.mechanism;
    if args.block < 2 {
        return Err(CliError::arg("--block", "a block needs at least 2 tokens"));
    }
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
    // account has no budget (nothing is written to a ledger), so SubMix's own
    // part budgets are what can stop it.
    let mut account = Unbudgeted::new(orders);
    let mut block_perplexities = Vec::with_capacity(blocks.len());
    let (mut private, mut public) = (0u64, 0u64);
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
            match release.diagnostics.public_reason {
                None => private += 1,
                Some(PublicReason::PublicOnly) => {}
                Some(_) => public += 1,
            }
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
            "private_answers": private,
            "public_answers": public,
            "epsilon": spent.epsilon.is_finite().then_some(spent.epsilon),
            "delta": args.delta,
            "order": spent.order,
        });
        println!("{line}");
    } else {
        println!(
            "{}: perplexity {perplexity:.4} over {} blocks ({queries} queries, {private} answered \
             privately, {public} from the public model); ε = {} at δ = {}",
            kind.name(),
            blocks.len(),
            spent.epsilon,
            args.delta
        );
    }
    Ok(())
}
