//! PMixED's λ for a private/public pair of next-token distributions: the largest mixing
//! weight whose symmetric Rényi divergence from the public distribution stays within
//! the bound βα, with the constraint checked as evaluated and recomputed from scratch.
//!
//! Run with `cargo run -p privmix-mixing --example lambda`.

use privmix_mixing::{LAMBDA_TOLERANCE, MixingError, PmixedProjection, enforced_radius};
use privmix_renyi::{Order, symmetric_divergence};

/// A Zipf-like next-token distribution over `len` tokens.
fn zipf(len: usize, exponent: f64) -> Vec<f64> {
    let w: Vec<f64> = (0..len)
        .map(|i| 1.0 / (i as f64 + 1.0).powf(exponent))
        .collect();
    let s: f64 = w.iter().sum();
    w.into_iter().map(|x| x / s).collect()
}

fn main() -> Result<(), MixingError> {
    let vocab = 1000;
    let public = zipf(vocab, 1.1);
    // A private model that reweights the public one token by token (by factors between
    // 0.4 and 1.6), as fine-tuning on private text would.
    let weighted: Vec<f64> = public
        .iter()
        .enumerate()
        .map(|(i, &p)| p * (1.0 + 0.6 * (i as f64).sin()))
        .collect();
    let total: f64 = weighted.iter().sum();
    let private: Vec<f64> = weighted.iter().map(|w| w / total).collect();
    let alpha = Order::new(18.0)?;

    println!("PMixED projection, α = 18, vocabulary {vocab}");
    println!("β        bound βα   λ              Dsym as evaluated  recomputed        passes");
    for beta in [0.0005, 0.001, 0.002, 0.005, 0.02] {
        let bound = beta * alpha.value();
        let projection = PmixedProjection::new(&private, &public, alpha, bound)?;
        let sol = projection.solve()?;

        // The constraint holds at λ as the solver's evaluator computes it…
        let evaluated = projection.constraint(sol.lambda)?;
        assert!(evaluated == sol.value && evaluated <= bound);
        // …and the bracket's upper end, within the tolerance, does not hold.
        if let Some(hi) = sol.violated_at {
            assert!(hi - sol.lambda <= LAMBDA_TOLERANCE);
            assert!(projection.constraint(hi)? > bound);
        }
        // The mixture to output, and its symmetric divergence recomputed by the
        // single-pair kernel (agreement to rounding).
        let mixture = projection.mixture(sol.lambda)?;
        let recomputed = symmetric_divergence(&mixture, &public, alpha)?;
        assert!((recomputed - evaluated).abs() <= 1e-12 * bound);
        println!(
            "{beta:<8} {bound:<10.4} {:<14.10} {evaluated:<18.12} {recomputed:<17.12} {}",
            sol.lambda, sol.evaluations
        );
    }

    // The certified solve enforces a slightly smaller radius, so that the *exact*
    // divergence of the mixture returned is within the bound.
    let bound = 0.002 * alpha.value();
    let enforced = enforced_radius(bound, alpha, vocab)?;
    let certified = PmixedProjection::new(&private, &public, alpha, bound)?.solve_certified()?;
    assert!(enforced < bound && certified.value <= enforced);
    println!(
        "\ncertified: bound {bound:.4} enforced as {enforced:.15} (margin {:.2e}), λ = {:.10}",
        bound - enforced,
        certified.lambda
    );
    Ok(())
}
