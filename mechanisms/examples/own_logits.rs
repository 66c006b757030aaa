//! Bring your own model: next-token logits from any source, one `Vec<f32>` per
//! member and one for the public model, fed through PMixED and then AdaPMixED
//! token by token, every charge written to a durable ledger before its token is
//! released.
//!
//! The "models" here are a deterministic toy: bigram logits over a ten-word
//! vocabulary, the public model's from a fixed table and each member's shifted
//! toward the words of its own (private) shard. Swap `public_logits` and
//! `member_logits` for real forward passes; nothing else changes.
//!
//! Run: `cargo run -p privmix-mechanisms --example own_logits`

use privmix_accountant::{Ledger, Orders, PrivacyBudget};
use privmix_mechanisms::{
    Adapmixed, AdapmixedConfig, Ensemble, EnsembleMechanism, Pmixed, PmixedConfig, PrivacyRng, Rows,
};

const VOCAB: [&str; 10] = [
    "the", "cat", "dog", "sat", "ran", "on", "mat", "rug", "home", ".",
];
const MEMBERS: usize = 4;
const TOKENS_PER_RUN: u64 = 12;
const DELTA: f64 = 1e-5;

/// The public model: bigram logits of the last token (any model's head would do).
fn public_logits(context: &[usize]) -> Vec<f32> {
    let last = context.last().copied().unwrap_or(9);
    let next: &[usize] = match VOCAB[last] {
        "the" => &[1, 2, 6, 7],
        "cat" | "dog" => &[3, 4],
        "sat" | "ran" => &[5, 8],
        "on" => &[0],
        "mat" | "rug" | "home" => &[9],
        _ => &[0],
    };
    (0..VOCAB.len())
        .map(|w| if next.contains(&w) { 3.0 } else { -1.0 })
        .collect()
}

/// Member `m`'s logits: the public ones plus a preference for the words of its
/// own shard, and a word it never says (masked with −∞).
fn member_logits(m: usize, context: &[usize]) -> Vec<f32> {
    let mut logits = public_logits(context);
    let favourite = [1, 2, 7, 8][m];
    logits[favourite] += 2.5;
    logits[[4, 3, 6, 6][m]] = f32::NEG_INFINITY;
    logits
}

/// One run of `tokens` tokens: the logits of every model at the current context,
/// an ensemble built from them, one mechanism step charged to `ledger`.
fn generate(
    mechanism: &mut dyn EnsembleMechanism,
    ledger: &mut Ledger,
    rng: &mut PrivacyRng,
    tokens: u64,
) -> Result<Vec<usize>, Box<dyn std::error::Error>> {
    let mut context = vec![0]; // "the"
    let mut ensemble: Option<Ensemble> = None;
    for _ in 0..tokens {
        let public = public_logits(&context);
        let members: Vec<f32> = (0..MEMBERS)
            .flat_map(|m| member_logits(m, &context))
            .collect();
        let e = Ensemble::renew_or_new(
            ensemble.take(),
            Rows::LogitsF32(&public),
            Rows::LogitsF32(&members),
        )?;
        // The ledger accepts (and syncs) the charge before the token is drawn.
        let step = mechanism.step(&e, rng, ledger)?;
        context.push(step.token);
        ensemble = Some(e);
    }
    Ok(context)
}

fn words(tokens: &[usize]) -> String {
    tokens
        .iter()
        .map(|&t| VOCAB[t])
        .collect::<Vec<_>>()
        .join(" ")
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let dir = std::env::temp_dir().join(format!("privmix-own-logits-{}", std::process::id()));
    std::fs::create_dir_all(&dir)?;
    let path = dir.join("ledger.pmx");
    let result = run(&path);
    std::fs::remove_dir_all(&dir)?;
    result
}

fn run(path: &std::path::Path) -> Result<(), Box<dyn std::error::Error>> {
    let orders = Orders::dp_accounting_default();
    let total = 8.0;
    let mut ledger = Ledger::create(
        path,
        orders.clone(),
        Some(PrivacyBudget::new(total, DELTA)?),
    )?;
    let mut rng = PrivacyRng::from_os()?;

    // PMixED, with the radius that fits ε = 3 over this run.
    let config = PmixedConfig::calibrate(
        3.0,
        DELTA,
        TOKENS_PER_RUN,
        0.75,
        MEMBERS as u64,
        36.0,
        &orders,
    )?;
    let mut pmixed = Pmixed::new(config);
    let text = generate(&mut pmixed, &mut ledger, &mut rng, TOKENS_PER_RUN)?;
    let spent = ledger.spent_epsilon(DELTA)?;
    println!(
        "PMixED    (radius b = {:.4}): {}",
        config.radius(),
        words(&text)
    );
    println!(
        "  ledger: {} charges, ε = {:.4} at δ = {DELTA:e}",
        ledger.charges(),
        spent.epsilon
    );

    // AdaPMixED, its filter fitted to what is left of ε = 8 after PMixED's run.
    let config = AdapmixedConfig::default().with_calibrated_filter_after(
        ledger.spent(),
        total,
        DELTA,
        MEMBERS,
    )?;
    let mut adapmixed = Adapmixed::new(config)?;
    let text = generate(&mut adapmixed, &mut ledger, &mut rng, TOKENS_PER_RUN)?;
    println!("AdaPMixED (filtered)        : {}", words(&text));
    if let Some(active) = adapmixed.active_members() {
        // Private state, printed here only because the data is a toy.
        let left = active.iter().filter(|&&a| !a).count();
        println!("  members that left the filter: {left} of {MEMBERS}");
    }

    // The ledger is durable: reopened from disk, it holds every charge.
    drop(ledger);
    let reopened = Ledger::open(path)?;
    let spent = reopened.spent_epsilon(DELTA)?;
    println!(
        "  ledger reopened: {} charges, ε = {:.4} of {total} at δ = {DELTA:e}",
        reopened.charges(),
        spent.epsilon
    );
    assert!(spent.epsilon <= total);
    Ok(())
}
