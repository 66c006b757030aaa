//! Exact verification of the three noisy baselines: Laplace subsample-and-
//! aggregate, GNMax and embedding space aggregation.
//!
//! For tiny instances (V ≤ 3 tokens or d ≤ 2 dimensions, N ≤ 3 members or
//! subsets, a COARSE grid) the law of what each mechanism publishes (the token
//! distribution, the chosen token, the chosen candidate) is computed here from
//! the definitions alone — the noise lattice summed out to a tail whose mass is
//! bounded — on a dataset and on each neighbour under every adjacency the
//! mechanism's doc claims, with a changed member or output arbitrary (the
//! public model's prediction, point masses, ties, huge vectors). Then
//! `D_α(law‖law') ≤ ε(α)` is asserted in both directions at orders 1.5 … 16,
//! ε the charge. Nothing here calls the mechanisms beyond their public entry
//! points (`average`, `clipped_mean`, the curves, and a frequency check of
//! `release` that ties the computed laws to what the mechanisms draw).
//!
//! Budgeted runs of T = 3 steps (`verify_noise_baselines/transcript.rs`, issue 39 §3):
//! the same laws over transcripts that record each step's token, refusal or error kind,
//! the charge it reports (checked against what the account added) and the account
//! after it, against unbudgeted accounts and budgets that run out before the first step,
//! mid-run and at the last, compared with the total the account realised.
//!
//! Each computed probability is a lower bound P̃ with `P ≤ P̃(1 + 10⁻¹²) + τ`
//! (τ the lattice tail, the factor the f64 evaluation); the divergence is
//! bounded from above with the upper bounds in the numerator's place and the
//! lower ones in the denominator's, so a pass is a proof up to that f64 slack.

use privmix_accountant::{Orders, RdpCurve};
use privmix_mechanisms::baselines::{Gnmax, SubsampleAggregateLaplace};
use privmix_mechanisms::{
    EmbeddingSpaceAggregation, Ensemble, EnsembleMechanism, PrivacyRng, Unbudgeted, clipped_mean,
};
use proptest::prelude::*;
use proptest::test_runner::RngAlgorithm;

mod transcript;

const ORDERS: [f64; 5] = [1.5, 2.0, 4.0, 8.0, 16.0];

fn orders() -> Orders {
    Orders::new(ORDERS.to_vec()).unwrap()
}

/// A law: lower bounds of each outcome's probability and the tail τ.
#[derive(Debug, Clone)]
struct Law {
    mass: Vec<f64>,
    tail: f64,
}

/// An upper bound of `D_α(P‖Q)`, in log space: `ln Σ P^α Q^{1−α} / (α − 1)`
/// with P's upper and Q's lower bounds; a Q of 0 under a P above 0 is +∞.
fn renyi_upper(p: &Law, q: &Law, alpha: f64) -> f64 {
    let mut logs = Vec::new();
    for (&pm, &qm) in p.mass.iter().zip(&q.mass) {
        let up = pm * (1.0 + 1e-12) + p.tail;
        let low = qm * (1.0 - 1e-12);
        if up == 0.0 {
            continue;
        }
        if low <= 0.0 {
            return f64::INFINITY;
        }
        logs.push(alpha * up.ln() + (1.0 - alpha) * low.ln());
    }
    let max = logs.iter().copied().fold(f64::NEG_INFINITY, f64::max);
    let sum: f64 = logs.iter().map(|l| (l - max).exp()).sum();
    ((max + sum.ln()) / (alpha - 1.0)).max(0.0)
}

/// The largest exact/charged ratio and the number of neighbour pairs, per mechanism.
static COVERAGE: std::sync::Mutex<std::collections::BTreeMap<&'static str, (f64, usize)>> =
    std::sync::Mutex::new(std::collections::BTreeMap::new());

fn assert_within(p: &Law, q: &Law, charge: &RdpCurve, what: &'static str) {
    let mut worst = 0.0f64;
    for (&a, &eps) in ORDERS.iter().zip(charge.epsilons()) {
        let forward = renyi_upper(p, q, a);
        let backward = renyi_upper(q, p, a);
        assert!(
            forward <= eps && backward <= eps,
            "{what}: α {a}: D = {forward}, {backward} > charged {eps}\n{p:?}\n{q:?}"
        );
        if eps > 0.0 && eps.is_finite() {
            worst = worst.max(forward.max(backward) / eps);
        }
    }
    let mut table = COVERAGE.lock().unwrap_or_else(|e| e.into_inner());
    let entry = table.entry(what).or_insert((0.0, 0));
    entry.0 = entry.0.max(worst);
    entry.1 += 1;
}

/// Prints the largest exact/charged ratio per baseline over the hand-built extremes (run
/// with `--nocapture`; runs last by name).
#[test]
fn zz_coverage() {
    gnmax_extremes_stay_within_the_charge();
    laplace_extremes_stay_within_the_charge();
    embedding_extremes_stay_within_the_charge();
    let table = COVERAGE.lock().unwrap_or_else(|e| e.into_inner());
    for (what, (worst, cases)) in table.iter() {
        println!("| {what} | T = 1 | {cases} | {worst:.4} |");
    }
    // The budgeted transcripts' rows, in the verifier's table (with whatever else this
    // process verified).
    gnmax_budgeted_transcripts_are_covered();
    laplace_budgeted_transcripts_are_covered();
    embedding_budgeted_transcripts_are_covered();
    println!("{}", crate::verifier::coverage_table());
}

/// The discrete Laplace law of scale `t` grid units on `[−k, k]`, and the mass
/// outside it.
fn laplace_lattice(t: f64) -> (Vec<f64>, i64, f64) {
    let r = (-1.0 / t).exp();
    let k = (37.0 * t).ceil() as i64;
    let pmf = (-k..=k)
        .map(|z| (1.0 - r) / (1.0 + r) * r.powi(z.abs() as i32))
        .collect();
    (pmf, k, 2.0 * r.powi(k as i32 + 1) / (1.0 + r))
}

/// The discrete Gaussian law of parameter `s` grid units on `[−k, k]`
/// (k = 40s + 5: the tail is below e⁻⁸⁰⁰, 0 in f64), normalised by the sum of
/// the lattice terms, smallest first.
fn gaussian_lattice(s: f64) -> (Vec<f64>, i64) {
    let k = (40.0 * s).ceil() as i64 + 5;
    let w: Vec<f64> = (-k..=k)
        .map(|z| (-((z * z) as f64) / (2.0 * s * s)).exp())
        .collect();
    let mut order: Vec<usize> = (0..w.len()).collect();
    order.sort_by(|&a, &b| w[a].total_cmp(&w[b]));
    let norm: f64 = order.iter().map(|&i| w[i]).sum();
    (w.iter().map(|x| x / norm).collect(), k)
}

// ---------------------------------------------------------------- GNMax

/// Each member's vote: its most likely token, ties to the lowest index.
fn votes(members: &[Vec<f64>], vocab: usize) -> Vec<i64> {
    let mut h = vec![0; vocab];
    for m in members {
        let mut best = 0;
        for (j, &x) in m.iter().enumerate() {
            if x > m[best] {
                best = j;
            }
        }
        h[best] += 1;
    }
    h
}

/// P(argmax_j (h_j + Z_j) = k), ties to the lowest index, Z i.i.d. discrete
/// Gaussian with parameter σ (grid of one vote).
fn gnmax_law(h: &[i64], sigma: f64) -> Law {
    let (pmf, k) = gaussian_lattice(sigma);
    let lo = h.iter().min().unwrap() - k;
    let hi = h.iter().max().unwrap() + k;
    let at = |j: usize, x: i64| -> f64 {
        let z = x - h[j];
        if z.abs() <= k {
            pmf[(z + k) as usize]
        } else {
            0.0
        }
    };
    // cdf_j(x) = P(h_j + Z_j ≤ x).
    let cdf = |j: usize, x: i64| -> f64 { (lo..=x).map(|y| at(j, y)).sum::<f64>().min(1.0) };
    let v = h.len();
    let mut mass = vec![0.0; v];
    for (winner, m) in mass.iter_mut().enumerate() {
        for x in lo..=hi {
            let p = at(winner, x);
            if p == 0.0 {
                continue;
            }
            let mut prod = p;
            for j in 0..v {
                if j < winner {
                    prod *= cdf(j, x - 1);
                } else if j > winner {
                    prod *= cdf(j, x);
                }
            }
            *m += prod;
        }
    }
    Law { mass, tail: 0.0 }
}

/// The vote histograms of every neighbour of `members` (one member replaced by
/// a member voting any token, removed when N ≥ 2, or one added voting any
/// token); GNMax's charge does not depend on N.
fn gnmax_neighbours(members: &[Vec<f64>], vocab: usize) -> Vec<Vec<i64>> {
    let point = |t: usize| {
        let mut r = vec![0.0; vocab];
        r[t] = 1.0;
        r
    };
    let mut out = Vec::new();
    for i in 0..members.len() {
        for t in 0..vocab {
            let mut m = members.to_vec();
            m[i] = point(t);
            out.push(votes(&m, vocab));
        }
        if members.len() >= 2 {
            let mut m = members.to_vec();
            m.remove(i);
            out.push(votes(&m, vocab));
        }
    }
    for t in 0..vocab {
        let mut m = members.to_vec();
        m.push(point(t));
        out.push(votes(&m, vocab));
    }
    out
}

fn check_gnmax(members: &[Vec<f64>], vocab: usize, sigma: f64) {
    let charge = Gnmax::new(sigma).unwrap().curve(&orders()).unwrap();
    let law = gnmax_law(&votes(members, vocab), sigma);
    let total: f64 = law.mass.iter().sum();
    assert!((total - 1.0).abs() < 1e-9, "gnmax law sums to {total}");
    for h in gnmax_neighbours(members, vocab) {
        assert_within(&law, &gnmax_law(&h, sigma), &charge, "gnmax");
    }
}

#[test]
fn gnmax_extremes_stay_within_the_charge() {
    let tie = vec![0.5, 0.5, 0.0];
    let sure0 = vec![1.0, 0.0, 0.0];
    let sure2 = vec![0.0, 1e-300, 1.0 - 1e-16];
    for sigma in [0.5, 1.0, 2.0] {
        check_gnmax(std::slice::from_ref(&sure0), 3, sigma); // N = 1
        check_gnmax(&[tie.clone(), sure2.clone()], 3, sigma); // N = 2
        check_gnmax(&[sure0.clone(), sure0.clone(), sure2.clone()], 3, sigma);
        check_gnmax(&[vec![0.25; 4], vec![0.0, 0.0, 0.0, 1.0]], 4, sigma);
        check_gnmax(&[vec![0.5, 0.5]], 2, sigma);
    }
}

// ------------------------------------------------- Laplace subsample-aggregate

/// The law of S&A's token: Σ over the lattice of the noisy grid vector
/// `n = R + Z` of P(Z)·(n⁺/Σn⁺, or p₀ when no entry is positive).
fn laplace_law(ensemble: &Ensemble, mech: &SubsampleAggregateLaplace) -> Law {
    let g = mech.granularity();
    let avg = SubsampleAggregateLaplace::average(ensemble).unwrap();
    let r: Vec<i64> = avg.iter().map(|x| (x / g).round() as i64).collect();
    let (pmf, k, tail1) = laplace_lattice(mech.scale() / g);
    let v = r.len();
    let width = (2 * k + 1) as usize;
    let mut mass = vec![0.0; v];
    let total = width.pow(v as u32);
    for flat in 0..total {
        let mut rest = flat;
        let mut weight = 1.0;
        let mut n = vec![0i64; v];
        for j in 0..v {
            let idx = rest % width;
            rest /= width;
            weight *= pmf[idx];
            n[j] = r[j] + idx as i64 - k;
        }
        if weight == 0.0 {
            continue;
        }
        let positive: i64 = n.iter().map(|&x| x.max(0)).sum();
        if positive > 0 {
            for j in 0..v {
                mass[j] += weight * n[j].max(0) as f64 / positive as f64;
            }
        } else {
            for j in 0..v {
                mass[j] += weight * ensemble.public()[j];
            }
        }
    }
    Law {
        mass,
        tail: v as f64 * tail1,
    }
}

fn ensemble(public: &[f64], members: &[Vec<f64>]) -> Ensemble {
    Ensemble::from_probabilities(public, &members.concat()).unwrap()
}

/// Every neighbour claimed by S&A's doc, with the member count whose charge
/// covers the pair: a member replaced by any of `others`, removed (N ≥ 2), or
/// one of `others` added.
fn laplace_neighbours(members: &[Vec<f64>], others: &[Vec<f64>]) -> Vec<(Vec<Vec<f64>>, usize)> {
    let n = members.len();
    let mut out = Vec::new();
    for i in 0..n {
        for o in others {
            let mut m = members.to_vec();
            m[i] = o.clone();
            out.push((m, n));
        }
        if n >= 2 {
            let mut m = members.to_vec();
            m.remove(i);
            out.push((m, n));
        }
    }
    for o in others {
        let mut m = members.to_vec();
        m.push(o.clone());
        out.push((m, n + 1));
    }
    out
}

fn check_laplace(public: &[f64], members: &[Vec<f64>], scale: f64, granularity: f64) {
    let v = public.len();
    let mech = SubsampleAggregateLaplace::with_granularity(scale, granularity).unwrap();
    let law = laplace_law(&ensemble(public, members), &mech);
    let total: f64 = law.mass.iter().sum();
    assert!((total - 1.0).abs() < 1e-9, "laplace law sums to {total}");
    let mut others = vec![public.to_vec(), vec![1.0 / v as f64; v]];
    for t in 0..v {
        let mut r = vec![0.0; v];
        r[t] = 1.0;
        others.push(r);
    }
    others.extend(members.iter().cloned());
    for (m, count) in laplace_neighbours(members, &others) {
        let charge = mech.curve(&orders(), count, v).unwrap();
        let other = laplace_law(&ensemble(public, &m), &mech);
        assert_within(&law, &other, &charge, "laplace");
    }
}

#[test]
fn laplace_extremes_stay_within_the_charge() {
    let g = 1.0 / 8.0;
    let p0 = [0.5, 0.5];
    for scale in [g, 4.0 * g, 1.0] {
        check_laplace(&p0, &[vec![1.0, 0.0]], scale, g); // N = 1
        check_laplace(&p0, &[vec![1.0, 0.0], vec![0.0, 1.0]], scale, g);
        check_laplace(&p0, &[vec![0.5, 0.5], vec![1.0 - 1e-12, 1e-12]], scale, g);
    }
    let p3 = [0.2, 0.3, 0.5];
    check_laplace(&p3, &[vec![1.0, 0.0, 0.0]], 2.0 * g, g);
    check_laplace(
        &p3,
        &[vec![0.0, 1.0, 0.0], vec![0.0, 0.0, 1.0], vec![1.0 / 3.0; 3]],
        g,
        g,
    );
}

// --------------------------------------------------- embedding aggregation

/// The law of the chosen candidate: Σ over the lattice of `n = R + Z` of
/// P(Z)·[the candidate of largest cosine with g·n, ties and n = 0 to the
/// first], the cosine evaluated as the mechanism documents it.
fn embedding_law(outputs: &[Vec<f32>], candidates: &[Vec<f32>], sigma: f64, g: f64) -> Law {
    let mean = clipped_mean(outputs).unwrap();
    let r: Vec<i64> = mean.iter().map(|x| (x / g).round() as i64).collect();
    let (pmf, k) = gaussian_lattice(sigma / g);
    let d = r.len();
    let width = (2 * k + 1) as usize;
    let norms: Vec<f64> = candidates
        .iter()
        .map(|c| c.iter().map(|&v| (v as f64).powi(2)).sum::<f64>().sqrt())
        .collect();
    let mut mass = vec![0.0; candidates.len()];
    for flat in 0..width.pow(d as u32) {
        let mut rest = flat;
        let mut weight = 1.0;
        let mut e = vec![0.0; d];
        for j in 0..d {
            let idx = rest % width;
            rest /= width;
            weight *= pmf[idx];
            e[j] = (r[j] + idx as i64 - k) as f64 * g;
        }
        if weight == 0.0 {
            continue;
        }
        let norm = e.iter().map(|v| v * v).sum::<f64>().sqrt();
        let mut best = 0;
        let mut best_sim = f64::NEG_INFINITY;
        for (i, (c, n)) in candidates.iter().zip(&norms).enumerate() {
            let dot: f64 = c.iter().zip(&e).map(|(&a, b)| a as f64 * b).sum();
            let sim = dot / (n * norm.max(f64::MIN_POSITIVE));
            if sim > best_sim {
                best = i;
                best_sim = sim;
            }
        }
        mass[best] += weight;
    }
    Law { mass, tail: 0.0 }
}

fn check_embedding(
    outputs: &[Vec<f32>],
    candidates: &[Vec<f32>],
    others: &[Vec<f32>],
    sigma: f64,
    g: f64,
) {
    let esa = EmbeddingSpaceAggregation::with_granularity(sigma, g).unwrap();
    let charge = esa
        .curve(&orders(), outputs.len(), outputs[0].len())
        .unwrap();
    let law = embedding_law(outputs, candidates, sigma, g);
    for i in 0..outputs.len() {
        for o in others {
            let mut m = outputs.to_vec();
            m[i] = o.clone();
            let other = embedding_law(&m, candidates, sigma, g);
            assert_within(&law, &other, &charge, "embedding");
        }
    }
}

#[test]
fn embedding_extremes_stay_within_the_charge() {
    let g = 1.0 / 8.0;
    let line = vec![vec![1.0f32], vec![-1.0f32]];
    let others1 = vec![vec![1e30f32], vec![-1e30f32], vec![0.0f32], vec![0.3f32]];
    for sigma in [0.25, 0.5, 1.0] {
        check_embedding(&[vec![1.0]], &line, &others1, sigma, g); // N = 1
        check_embedding(&[vec![0.0], vec![-1.0]], &line, &others1, sigma, g);
        check_embedding(
            &[vec![1.0], vec![1.0], vec![-0.9]],
            &line,
            &others1,
            sigma,
            g,
        );
    }
    let plane = vec![vec![1.0f32, 0.0], vec![0.0, 1.0], vec![-1.0, -1.0]];
    let others2 = vec![
        vec![-3.0f32, -4.0],
        vec![0.0, 0.0],
        vec![1.0, 0.0],
        vec![0.6, 0.8],
    ];
    check_embedding(&[vec![1.0, 0.0]], &plane, &others2, 0.5, g);
    check_embedding(&[vec![0.6, 0.8], vec![0.0, -1.0]], &plane, &others2, 0.5, g);
}

proptest! {
    #![proptest_config(ProptestConfig {
        cases: 24,
        rng_algorithm: RngAlgorithm::ChaCha,
        ..ProptestConfig::default()
    })]

    #[test]
    fn gnmax_random_members_stay_within_the_charge(
        rows in prop::collection::vec(prop::collection::vec(0.0f64..1.0, 3), 1..=3),
        sigma in prop::sample::select(vec![0.5, 0.8, 1.5]),
    ) {
        check_gnmax(&rows, 3, sigma);
    }

    #[test]
    fn laplace_random_members_stay_within_the_charge(
        weights in prop::collection::vec((0.0f64..1.0, 1u32..6), 1..=3),
        p0 in 0.01f64..0.99,
        scale_units in prop::sample::select(vec![1.0, 2.0, 3.0]),
    ) {
        let g = 1.0 / 16.0;
        let members: Vec<Vec<f64>> = weights
            .iter()
            .map(|&(w, p)| {
                let x = w.powi(p as i32);
                vec![x, 1.0 - x]
            })
            .collect();
        check_laplace(&[p0, 1.0 - p0], &members, scale_units * g, g);
    }

    #[test]
    fn embedding_random_outputs_stay_within_the_charge(
        values in prop::collection::vec(-2.0f32..2.0, 1..=3),
        replacement in -50.0f32..50.0,
        sigma in prop::sample::select(vec![0.2, 0.5, 1.0]),
    ) {
        let outputs: Vec<Vec<f32>> = values.iter().map(|&v| vec![v]).collect();
        let line = vec![vec![1.0f32], vec![-1.0f32]];
        check_embedding(&outputs, &line, &[vec![replacement], vec![0.0]], sigma, 1.0 / 8.0);
    }
}

/// The computed laws are the mechanisms' laws: frequencies of what `release`
/// publishes (fixed seeds) agree with them within 5 binomial standard errors.
#[test]
fn the_verified_laws_are_what_the_mechanisms_draw() {
    let draws = 6000;
    let se = |p: f64| 5.0 * (p * (1.0 - p) / draws as f64).sqrt() + 1e-9;
    let mut account = Unbudgeted::new(orders());
    // GNMax.
    let e = ensemble(
        &[0.2, 0.3, 0.5],
        &[vec![0.5, 0.5, 0.0], vec![0.0, 0.0, 1.0]],
    );
    let law = gnmax_law(&[1, 0, 1], 0.8);
    let mut mech = Gnmax::new(0.8).unwrap();
    let mut rng = PrivacyRng::from_seed(3);
    let mut counts = [0usize; 3];
    for _ in 0..draws {
        let r = mech.release(&e, &mut rng, &mut account).unwrap();
        counts[r.distribution.iter().position(|&x| x == 1.0).unwrap()] += 1;
    }
    for j in 0..3 {
        let f = counts[j] as f64 / draws as f64;
        assert!(
            (f - law.mass[j]).abs() < se(law.mass[j]),
            "gnmax {j}: {f} vs {}",
            law.mass[j]
        );
    }
    // Laplace S&A: the mean released distribution is the token law.
    let g = 1.0 / 8.0;
    let mut mech = SubsampleAggregateLaplace::with_granularity(2.0 * g, g).unwrap();
    let e = ensemble(&[0.5, 0.5], &[vec![0.9, 0.1], vec![0.3, 0.7]]);
    let law = laplace_law(&e, &mech);
    let mut mean = [0.0; 2];
    for _ in 0..draws {
        let r = mech.release(&e, &mut rng, &mut account).unwrap();
        for j in 0..2 {
            mean[j] += r.distribution[j] / draws as f64;
        }
    }
    assert!(
        (mean[0] - law.mass[0]).abs() < se(law.mass[0]),
        "laplace: {mean:?} vs {law:?}"
    );
    // Embedding aggregation.
    let esa = EmbeddingSpaceAggregation::with_granularity(0.5, g).unwrap();
    let outputs = vec![vec![0.6f32, 0.8], vec![0.0, -1.0]];
    let plane = vec![vec![1.0f32, 0.0], vec![0.0, 1.0], vec![-1.0, -1.0]];
    let law = embedding_law(&outputs, &plane, 0.5, g);
    let mut counts = [0usize; 3];
    for _ in 0..draws {
        counts[esa
            .release(&outputs, &plane, &mut rng, &mut account)
            .unwrap()
            .index] += 1;
    }
    for j in 0..3 {
        let f = counts[j] as f64 / draws as f64;
        assert!(
            (f - law.mass[j]).abs() < se(law.mass[j]),
            "embedding {j}: {f} vs {}",
            law.mass[j]
        );
    }
}

/// The verifier is sharp enough to fail: on N = 1 extremes with little noise,
/// the exact divergence at α = 1.5 exceeds the charge of the same mechanism
/// with twice (GNMax), eight times (Laplace) or four times (embedding) the
/// noise — so an undercharge by such a factor would not pass.
#[test]
fn the_verifier_catches_an_undercharge() {
    let at = |c: RdpCurve| c.at(1.5).unwrap();
    let a = gnmax_law(&[1, 0], 0.5);
    let b = gnmax_law(&[0, 1], 0.5);
    assert!(renyi_upper(&a, &b, 1.5) > at(Gnmax::new(1.0).unwrap().curve(&orders()).unwrap()));
    let g = 1.0 / 8.0;
    let mech = SubsampleAggregateLaplace::with_granularity(g, g).unwrap();
    let a = laplace_law(&ensemble(&[0.5, 0.5], &[vec![1.0, 0.0]]), &mech);
    let b = laplace_law(&ensemble(&[0.5, 0.5], &[vec![0.0, 1.0]]), &mech);
    let weaker = SubsampleAggregateLaplace::with_granularity(8.0 * g, g).unwrap();
    assert!(renyi_upper(&a, &b, 1.5) > at(weaker.curve(&orders(), 1, 2).unwrap()));
    let line = vec![vec![1.0f32], vec![-1.0f32]];
    let a = embedding_law(&[vec![1.0]], &line, 0.25, g);
    let b = embedding_law(&[vec![-1.0]], &line, 0.25, g);
    let weaker = EmbeddingSpaceAggregation::with_granularity(1.0, g).unwrap();
    assert!(renyi_upper(&a, &b, 1.5) > at(weaker.curve(&orders(), 1, 1).unwrap()));
}

// ------------------------------------------- budgeted transcripts (issue 39 §3)

use crate::verifier::{AccountKind, Table};
use transcript::{Bug, Mech};

/// The same rows at every context of fewer than `depth` tokens.
fn constant(public: &[f64], members: Vec<Vec<f64>>, depth: usize) -> Table {
    let mut t = Table {
        vocab: public.len(),
        rows: Default::default(),
    };
    for c in crate::verifier::contexts(public.len(), depth) {
        t.rows.insert(c, (public.to_vec(), members.clone()));
    }
    t
}

/// Every account of a T-step run: unbudgeted, and budgets running out before the first
/// step, after the first, and at the last.
fn every_account(steps: usize) -> Vec<AccountKind> {
    let mut kinds = vec![AccountKind::Unbudgeted];
    kinds.extend((0..steps).map(AccountKind::RunsOutAfter));
    kinds.dedup();
    kinds
}

/// Checks `mech` on adaptive (random) and constant tables over 2 tokens, T = 3, with every
/// account, and that each account's transcripts have the shape its budget dictates.
fn check_budgeted(mech: &Mech, seed: u64) {
    let steps = 3;
    let random = Table::random(seed, 2, 2, steps);
    let other = Table::random(seed + 1, 2, 2, steps);
    let opposite = constant(&[0.5, 0.5], vec![vec![1.0, 0.0], vec![0.3, 0.7]], steps);
    let flipped = constant(&[0.5, 0.5], vec![vec![0.0, 1.0], vec![0.5, 0.5]], steps);
    let kinds = every_account(steps);
    for (table, other) in [(&random, &other), (&opposite, &flipped)] {
        let laws = transcript::check(mech, table, other, steps, &kinds);
        for (kind, law) in kinds.iter().zip(&laws) {
            let accepted = match kind {
                AccountKind::Unbudgeted => steps,
                AccountKind::RunsOutAfter(k) => *k,
            };
            let mut want = vec!["T"; accepted];
            want.resize(steps, "refused");
            let shapes = transcript::shapes(law);
            assert_eq!(
                shapes.into_iter().collect::<Vec<_>>(),
                vec![want],
                "{mech:?}, {kind:?}"
            );
        }
    }
}

#[test]
fn gnmax_budgeted_transcripts_are_covered() {
    for sigma in [0.5, 1.5] {
        check_budgeted(&Mech::Gnmax(Gnmax::new(sigma).unwrap()), 21);
    }
}

#[test]
fn laplace_budgeted_transcripts_are_covered() {
    let g = 1.0 / 8.0;
    let mech = SubsampleAggregateLaplace::with_granularity(2.0 * g, g).unwrap();
    check_budgeted(&Mech::Laplace(mech), 31);
}

#[test]
fn embedding_budgeted_transcripts_are_covered() {
    let esa = EmbeddingSpaceAggregation::with_granularity(0.25, 1.0 / 8.0).unwrap();
    check_budgeted(&Mech::Embedding(esa), 41);
}

/// Runs `f` and returns its panic message (panics itself if `f` passed).
fn fails(what: &str, f: impl FnOnce()) -> String {
    let caught = std::panic::catch_unwind(std::panic::AssertUnwindSafe(f));
    let Err(payload) = caught else {
        panic!("the verifier did not catch {what}");
    };
    payload
        .downcast_ref::<String>()
        .cloned()
        .or_else(|| payload.downcast_ref::<&str>().map(|s| s.to_string()))
        .unwrap_or_default()
}

/// Deliberately wrong GNMax wrappers: a charge that depends on the data (with a budget,
/// a refusal on one side only), a refusal that does, an error that does, and an account
/// charged less than the step reports. Member 0 votes for token 0 on the dataset and for
/// token 1 on the neighbour.
#[test]
fn wrong_noise_baselines_are_caught() {
    let table = constant(&[0.5, 0.5], vec![vec![0.9, 0.1], vec![0.4, 0.6]], 2);
    let other = constant(&[0.5, 0.5], vec![vec![0.1, 0.9], vec![0.4, 0.6]], 2);
    let gnmax = Gnmax::new(1.0).unwrap();
    // The right mechanism passes the same checks.
    transcript::check(
        &Mech::Gnmax(gnmax),
        &table,
        &other,
        2,
        &[AccountKind::Unbudgeted, AccountKind::RunsOutAfter(1)],
    );
    let wrong = |bug: Bug, kind: AccountKind, steps: usize| {
        fails(&format!("{bug:?}"), || {
            transcript::check(&Mech::Wrong(gnmax, bug), &table, &other, steps, &[kind]);
        })
    };
    let msg = wrong(Bug::ChargeDependsOnData, AccountKind::RunsOutAfter(1), 2);
    assert!(
        msg.contains("differs between transcripts") || msg.contains("> realised charge"),
        "{msg}"
    );
    let msg = wrong(Bug::RefusesOnData, AccountKind::Unbudgeted, 1);
    assert!(
        msg.contains("differs between transcripts") || msg.contains("> realised charge"),
        "{msg}"
    );
    let msg = wrong(Bug::ErrsOnData, AccountKind::Unbudgeted, 2);
    assert!(
        msg.contains("differs between transcripts") || msg.contains("> realised charge"),
        "{msg}"
    );
    let msg = wrong(Bug::ChargesHalfReportsFull, AccountKind::Unbudgeted, 1);
    assert!(msg.contains("reported a charge"), "{msg}");
}

proptest! {
    #![proptest_config(ProptestConfig {
        cases: 24,
        rng_algorithm: RngAlgorithm::ChaCha,
        ..ProptestConfig::default()
    })]

    /// Random adaptive tables (2 tokens, 2 members, T = 3) for each baseline, against
    /// an account drawn from every kind.
    #[test]
    fn budgeted_random_tables_are_covered(
        seed in any::<u64>(),
        which in 0usize..3,
        kind in 0usize..4,
    ) {
        let g = 1.0 / 8.0;
        let mech = match which {
            0 => Mech::Gnmax(Gnmax::new(0.8).unwrap()),
            1 => Mech::Laplace(SubsampleAggregateLaplace::with_granularity(2.0 * g, g).unwrap()),
            _ => Mech::Embedding(EmbeddingSpaceAggregation::with_granularity(0.25, g).unwrap()),
        };
        let kind = every_account(3)[kind];
        let table = Table::random(seed, 2, 2, 3);
        let other = Table::random(seed ^ 0x9E37_79B9, 2, 2, 3);
        transcript::check(&mech, &table, &other, 3, &[kind]);
    }
}
