//! DP-SGD accounting: the smallest noise multiplier σ that keeps a training
//! run of Poisson-sampled Gaussian steps within a target (ε, δ), for a few
//! targets, and the ε each σ actually gives.
//!
//! Run: `cargo run -p privmix-accountant --example dp_sgd`

use privmix_accountant::{AccountantError, DpEvent, Orders, poisson_gaussian_sigma};

fn main() -> Result<(), AccountantError> {
    // 60 000 examples, batches of 256 expected, 15 epochs.
    let (records, batch, epochs) = (60_000u64, 256u64, 15u64);
    let q = batch as f64 / records as f64;
    let steps = epochs * records / batch;
    let delta = 1e-5;
    let orders = Orders::integers(128)?;
    println!("DP-SGD: q = {q:.5}, {steps} steps, δ = {delta:e}, integer orders 2..=128");
    println!(
        "{:>8} {:>10} {:>12} {:>7}",
        "target ε", "σ", "ε reached", "order"
    );
    for target in [1.0, 2.0, 4.0, 8.0] {
        let sigma = poisson_gaussian_sigma(&orders, q, steps, target, delta)?;
        let run = DpEvent::gaussian(sigma)?
            .poisson_sampled(q)?
            .self_composed(steps)?;
        let reached = run.rdp(&orders)?.epsilon(delta)?;
        assert!(reached.epsilon <= target);
        println!(
            "{target:>8} {sigma:>10.5} {:>12.6} {:>7}",
            reached.epsilon, reached.order
        );
    }
    Ok(())
}
