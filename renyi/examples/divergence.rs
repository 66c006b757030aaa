//! The Rényi divergences of two next-token distributions, and a batch of rows against a
//! public reference, with the privacy bound rounded up.
//!
//! Run with `cargo run -p privmix-renyi --example divergence`.

use privmix_renyi::round::{ln_up, mul_up};
use privmix_renyi::{
    Direction, MixturePath, Order, RenyiError, batched_divergence, divergence, kl_divergence,
    symmetric_divergence,
};

/// A softmax of `logits` at `temperature`.
fn softmax(logits: &[f64], temperature: f64) -> Vec<f64> {
    let max = logits.iter().copied().fold(f64::NEG_INFINITY, f64::max);
    let w: Vec<f64> = logits
        .iter()
        .map(|&l| ((l - max) / temperature).exp())
        .collect();
    let s: f64 = w.iter().sum();
    w.into_iter().map(|x| x / s).collect()
}

fn main() -> Result<(), RenyiError> {
    // A public (zero-shot) distribution over a small vocabulary, and a private one that
    // puts more mass on two tokens.
    let public_logits = [2.0, 1.5, 1.0, 0.5, 0.0, -0.5, -1.0, -2.0];
    let private_logits = [2.0, 3.0, 1.0, 0.5, 2.0, -0.5, -1.0, -2.0];
    let public = softmax(&public_logits, 1.0);
    let private = softmax(&private_logits, 1.0);

    println!("order      D(private‖public)  D(public‖private)  symmetric");
    for alpha in [1.5, 2.0, 8.0, 32.0, f64::INFINITY] {
        let order = Order::new(alpha)?;
        let forward = divergence(&private, &public, order)?;
        let reverse = divergence(&public, &private, order)?;
        let sym = symmetric_divergence(&private, &public, order)?;
        assert_eq!(sym, forward.max(reverse));
        println!("{alpha:<10} {forward:<18.12} {reverse:<18.12} {sym:.12}");
    }
    let kl = kl_divergence(&private, &public)?;
    println!("KL(private‖public) = {kl:.12} (the limit α → 1)");

    // D_α is non-decreasing in α: KL ≤ D_2 ≤ D_∞.
    let d2 = divergence(&private, &public, Order::new(2.0)?)?;
    let dinf = divergence(&private, &public, Order::Infinite)?;
    assert!(kl <= d2 && d2 <= dinf);

    // A batch: several private rows (temperatures) against the public row, in parallel;
    // every entry is bitwise what `divergence` returns for that row.
    let temperatures = [0.5, 1.0, 2.0, 4.0];
    let rows: Vec<f64> = temperatures
        .iter()
        .flat_map(|&t| softmax(&private_logits, t))
        .collect();
    let order = Order::new(18.0)?;
    let batch = batched_divergence(&rows, &public, order, Direction::Symmetric)?;
    println!("\nsymmetric D_18 of each row against the public distribution:");
    for (t, d) in temperatures.iter().zip(&batch) {
        let row = softmax(&private_logits, *t);
        assert_eq!(*d, symmetric_divergence(&row, &public, order)?);
        println!("  temperature {t:<4} {d:.12}");
    }

    // Along the mixture λ·private + (1−λ)·public against public: the value grows with λ.
    let path = MixturePath::forward(&private, &public, order)?;
    println!("\nD_18(λ·private + (1−λ)·public ‖ public):");
    let mut previous = 0.0;
    for lambda in [0.0, 0.1, 0.25, 0.5, 1.0] {
        let v = path.evaluate(lambda)?;
        assert!(v.value >= previous);
        previous = v.value;
        println!(
            "  λ = {lambda:<5} value {:.12}  slope {:.6e}",
            v.value, v.slope
        );
    }

    // A privacy number is rounded up, never to nearest: e.g. a bound 2·ln(3) reported
    // from the outward-rounded operations.
    let bound = mul_up(2.0, ln_up(3.0));
    assert!(bound >= 2.0 * 3.0_f64.ln());
    println!("\n2·ln 3 rounded up: {bound:e}");
    Ok(())
}
