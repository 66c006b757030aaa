//! `privmix score`: perplexity of a mechanism's next-token distributions on a text file.
//!
//! The text is cut into blocks of `--block` tokens; at every position the mechanism's
//! output distribution given the true prefix is evaluated at the true next token (teacher
//! forcing), perplexity is `exp(−mean log p)` per block and then the mean over blocks (as
//! in the PMixED and SubMix evaluations). Every position is one query: its charge is
//! composed into an account without a budget, and the total ε those queries would cost if
//! their distributions were released is reported (nothing is written to any ledger).

use privmix_accountant::Orders;
use privmix_ensemble::rows::RowLayout;
use privmix_mechanisms::{Ensemble, Pmixed, PmixedConfig, PrivacyRng, Rows};
use serde_json::json;

use crate::args::{MechanismKind, ScoreArgs};
use crate::error::CliError;
use crate::setup::{load_runner, load_tokenizer};

/// Runs `privmix score`.
pub fn run(args: &ScoreArgs) -> Result<(), CliError> {
    let kind = args.model.mechanism;
    if args.block < 2 {
        return Err(CliError::arg("--block", "a block needs at least 2 tokens"));
    }
    if !matches!(
        kind,
        MechanismKind::Pmixed | MechanismKind::Public | MechanismKind::Ensemble
    ) {
        return Err(CliError::arg(
            "--mechanism",
            format!(
                "score supports pmixed, public and ensemble; {} is not supported by score yet",
                kind.name()
            ),
        ));
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
    let n = runner.num_members();
    if n == 0 && kind != MechanismKind::Public {
        return Err(CliError::arg(
            "--adapter",
            format!("{} needs at least one member adapter", kind.name()),
        ));
    }
    let orders = Orders::dp_accounting_default();
    let mut pmixed = match kind {
        MechanismKind::Pmixed => {
            let p = &args.model.params;
            let config = match p.radius {
                Some(r) => PmixedConfig::new(p.alpha_c, r, p.q)?,
                None => PmixedConfig::calibrate(
                    args.epsilon,
                    args.delta,
                    queries,
                    p.q,
                    n as u64,
                    p.alpha_c,
                    &orders,
                )?,
            };
            Some(Pmixed::new(config))
        }
        _ => None,
    };
    let mut rng = match args.seed {
        Some(seed) => PrivacyRng::from_seed(seed),
        None => PrivacyRng::from_os()?,
    };
    // Per-query charges: PMixED's is data-independent, the public model's 0 and the
    // non-private ensemble's +∞; composing `queries` of them is one self-composition.
    let per_query = match (&mut pmixed, kind) {
        (Some(p), _) => p.charge_curve(&orders, n)?.clone(),
        (None, MechanismKind::Public) => privmix_accountant::RdpCurve::zero(orders.clone()),
        (None, _) => privmix_accountant::RdpCurve::from_fn(orders.clone(), |_| f64::INFINITY)?,
    };
    let layout = RowLayout::public_and_members(n);
    let mut block_perplexities = Vec::with_capacity(blocks.len());
    for block in &blocks {
        let steps = runner.score_block_full(&layout, block)?;
        let mut nll = 0.0f64;
        for (i, rows) in steps.iter().enumerate() {
            let ensemble = Ensemble::new(
                Rows::LogProbF32(rows.row(0)),
                Rows::LogProbF32(rows.member_rows()),
            )?;
            let target = block[i + 1] as usize;
            let p = match (&pmixed, kind) {
                (Some(p), _) => {
                    let drawn = p.draw_members(n, &mut rng);
                    p.output_distribution(&ensemble, &drawn)?.distribution[target]
                }
                (None, MechanismKind::Public) => ensemble.public()[target],
                (None, _) => (0..n).map(|m| ensemble.member(m)[target]).sum::<f64>() / n as f64,
            };
            nll -= p.ln();
        }
        block_perplexities.push((nll / steps.len() as f64).exp());
    }
    let perplexity = block_perplexities.iter().sum::<f64>() / block_perplexities.len() as f64;
    let spent = per_query.self_compose(queries).epsilon(args.delta)?;
    if args.json {
        let line = json!({
            "mechanism": kind.name(),
            "perplexity": perplexity.is_finite().then_some(perplexity),
            "blocks": blocks.len(),
            "queries": queries,
            "epsilon": spent.epsilon.is_finite().then_some(spent.epsilon),
            "delta": args.delta,
            "order": spent.order,
        });
        println!("{line}");
    } else {
        println!(
            "{}: perplexity {perplexity:.4} over {} blocks ({queries} queries); ε = {} at δ = {}",
            kind.name(),
            blocks.len(),
            spent.epsilon,
            args.delta
        );
    }
    Ok(())
}
