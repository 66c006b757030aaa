//! Counterexample: the SubMix paper's protocol (Ginart et al., "Submix: Practical
//! private prediction for large-scale language models", arXiv 2201.00971, Alg. 2 with
//! Prop. 3.1's per-part budgets and STOP) does not bound what it releases.
//!
//! The paper's protocol is replayed here exactly, independently of privmix's code:
//! V = 2, every λ = 1 (halves that agree pass Eq. 2 at any β), p₀ = [.5, .5], two parts
//! whose four halves are [.999, .001], α = 2, per-part budget 0.2.
//!
//! * Corpus: every leave-one-part-out output equals the output [.999, .001], so each
//!   part's loss is 0, 0 is charged, and the first token is drawn from [.999, .001].
//! * Neighbour with part 1's user removed (its halves become the public model): part 1's
//!   loss is `Dsym₂ ≈ 4.15 > 0.2`, the protocol issues STOP and answers from p₀.
//!
//! The two token laws are `Dsym₂ ≈ 5.52` apart against 0 charged. privmix's SubMix
//! therefore departs from Alg. 2 (see `privmix_mechanisms::submix`); the verifier covers
//! it on this corpus in `verify_submix.rs`.

fn d(p: &[f64], q: &[f64], alpha: f64) -> f64 {
    let s: f64 = p
        .iter()
        .zip(q)
        .map(|(&a, &b)| a.powf(alpha) * b.powf(1.0 - alpha))
        .sum();
    s.ln() / (alpha - 1.0)
}

fn dsym(p: &[f64], q: &[f64], alpha: f64) -> f64 {
    d(p, q, alpha).max(d(q, p, alpha))
}

/// Alg. 2 with every λ = 1: the output is the mean of the parts' half-averages.
fn output(parts: &[[Vec<f64>; 2]], public: &[f64]) -> Vec<f64> {
    if parts.is_empty() {
        return public.to_vec();
    }
    let mut out = vec![0.0; public.len()];
    for [a, b] in parts {
        for (o, (x, y)) in out.iter_mut().zip(a.iter().zip(b)) {
            *o += 0.5 * (x + y) / parts.len() as f64;
        }
    }
    out
}

/// One response of the paper's protocol: the released law, and the charge (max part
/// loss), or STOP (public answer, charged nothing) when a part's loss would exceed its
/// budget.
fn respond(parts: &[[Vec<f64>; 2]], public: &[f64], alpha: f64, budget: f64) -> (Vec<f64>, f64) {
    let h = output(parts, public);
    let mut worst: f64 = 0.0;
    for i in 0..parts.len() {
        let rest: Vec<[Vec<f64>; 2]> = parts
            .iter()
            .enumerate()
            .filter(|&(j, _)| j != i)
            .map(|(_, p)| p.clone())
            .collect();
        let loss = dsym(&h, &output(&rest, public), alpha);
        if loss > budget {
            return (public.to_vec(), 0.0);
        }
        worst = worst.max(loss);
    }
    (h, worst)
}

#[test]
fn the_papers_stop_rule_releases_more_than_it_charges() {
    let p0 = vec![0.5, 0.5];
    let peaked = vec![0.999, 0.001];
    let corpus = vec![
        [peaked.clone(), peaked.clone()],
        [peaked.clone(), peaked.clone()],
    ];
    let emptied = vec![[peaked.clone(), peaked.clone()], [p0.clone(), p0.clone()]];
    let (law, charge) = respond(&corpus, &p0, 2.0, 0.2);
    let (law_n, _) = respond(&emptied, &p0, 2.0, 0.2);
    assert_eq!(charge, 0.0);
    assert_eq!(law_n, p0, "the neighbour STOPs");
    let truth = dsym(&law, &law_n, 2.0);
    assert!((truth - 5.52).abs() < 0.01, "{truth}");
    // Removing the part outright: the neighbour is one part, whose own leave-one-out is
    // p₀ at Dsym₂ ≈ 5.52 > the CLI's default part budget of 1, so it STOPs too.
    let removed = vec![[peaked.clone(), peaked.clone()]];
    let (law_r, _) = respond(&removed, &p0, 2.0, 1.0);
    let (law_c, charge_c) = respond(&corpus, &p0, 2.0, 1.0);
    assert_eq!((law_r, charge_c), (p0.clone(), 0.0));
    assert!(dsym(&law_c, &p0, 2.0) > 5.0);
}
