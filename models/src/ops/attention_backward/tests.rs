//! The training attention against an independent f64 reference: the
//! forward pass against the reference itself, the backward pass against
//! central differences of the reference (so neither checks itself).

use super::*;

const SHAPE: CausalShape = CausalShape {
    seq: 5,
    heads: 4,
    kv_heads: 2,
    head_dim: 4,
};
const ROWS: usize = 2;

fn values(n: usize, seed: u32) -> Vec<f32> {
    (0..n)
        .map(|i| {
            ((i as u32).wrapping_mul(2654435761).wrapping_add(seed) % 1000) as f32 / 500.0 - 1.0
        })
        .collect()
}

/// The attention of every row and head in f64, straight from its
/// definition.
fn reference(q: &[f64], k: &[f64], v: &[f64]) -> Vec<f64> {
    let CausalShape {
        seq: t,
        heads,
        kv_heads,
        head_dim: hd,
    } = SHAPE;
    let (qw, kw) = (heads * hd, kv_heads * hd);
    let scale = 1.0 / (hd as f64).sqrt();
    let mut out = vec![0.0; ROWS * t * qw];
    for row in 0..ROWS {
        for head in 0..heads {
            let g = head / (heads / kv_heads) * hd;
            for i in 0..t {
                let qi = &q[(row * t + i) * qw + head * hd..][..hd];
                let scores: Vec<f64> = (0..=i)
                    .map(|j| {
                        let kj = &k[(row * t + j) * kw + g..][..hd];
                        scale * qi.iter().zip(kj).map(|(a, b)| a * b).sum::<f64>()
                    })
                    .collect();
                let max = scores.iter().copied().fold(f64::NEG_INFINITY, f64::max);
                let e: Vec<f64> = scores.iter().map(|s| (s - max).exp()).collect();
                let z: f64 = e.iter().sum();
                for (j, ej) in e.iter().enumerate() {
                    let vj = &v[(row * t + j) * kw + g..][..hd];
                    for d in 0..hd {
                        out[(row * t + i) * qw + head * hd + d] += ej / z * vj[d];
                    }
                }
            }
        }
    }
    out
}

fn widen(x: &[f32]) -> Vec<f64> {
    x.iter().map(|&v| f64::from(v)).collect()
}

#[test]
fn the_forward_pass_matches_the_f64_definition() {
    let (qw, kw) = SHAPE.widths();
    let n = ROWS * SHAPE.seq;
    let (q, k, v) = (values(n * qw, 1), values(n * kw, 2), values(n * kw, 3));
    let mut probs = vec![f32::NAN; SHAPE.probs_len(ROWS)];
    let mut out = vec![f32::NAN; n * qw];
    causal_attention(SHAPE, &q, &k, &v, &mut probs, &mut out);
    let want = reference(&widen(&q), &widen(&k), &widen(&v));
    for (i, (g, w)) in out.iter().zip(&want).enumerate() {
        assert!((f64::from(*g) - w).abs() < 1e-5, "output {i}: {g} vs {w}");
    }
    // Each probability row sums to one, with zeros above the diagonal.
    for (i, row) in probs.chunks(SHAPE.seq).enumerate() {
        let at = i % SHAPE.seq;
        assert!(row[at + 1..].iter().all(|&p| p == 0.0));
        let sum: f32 = row.iter().sum();
        assert!((sum - 1.0).abs() < 1e-6, "row {i} sums to {sum}");
    }
}

#[test]
fn the_backward_pass_matches_central_differences() {
    let (qw, kw) = SHAPE.widths();
    let n = ROWS * SHAPE.seq;
    let (q, k, v) = (values(n * qw, 4), values(n * kw, 5), values(n * kw, 6));
    // The loss Σ w ⊙ out, so that its output gradient is `w`.
    let w = values(n * qw, 7);
    let mut probs = vec![0.0; SHAPE.probs_len(ROWS)];
    let mut out = vec![0.0; n * qw];
    causal_attention(SHAPE, &q, &k, &v, &mut probs, &mut out);
    let (mut dq, mut dk, mut dv) = (
        vec![f32::NAN; n * qw],
        vec![f32::NAN; n * kw],
        vec![f32::NAN; n * kw],
    );
    causal_attention_backward(SHAPE, (&q, &k, &v, &probs), &w, &mut dq, &mut dk, &mut dv);
    let loss = |q: &[f64], k: &[f64], v: &[f64]| -> f64 {
        reference(q, k, v)
            .iter()
            .zip(&w)
            .map(|(o, w)| o * f64::from(*w))
            .sum()
    };
    let (q, k, v) = (widen(&q), widen(&k), widen(&v));
    let h = 1e-6;
    for (which, got) in [(0, &dq), (1, &dk), (2, &dv)] {
        let largest = got.iter().fold(0.0f32, |m, g| m.max(g.abs()));
        assert!(largest > 0.1, "operand {which}: a trivial gradient");
        for (i, g) in got.iter().enumerate() {
            let mut ops = [q.clone(), k.clone(), v.clone()];
            ops[which][i] += h;
            let up = loss(&ops[0], &ops[1], &ops[2]);
            ops[which][i] -= 2.0 * h;
            let down = loss(&ops[0], &ops[1], &ops[2]);
            let fd = (up - down) / (2.0 * h);
            assert!(
                (f64::from(*g) - fd).abs() < 1e-4 * f64::from(largest),
                "operand {which} entry {i}: {g} vs {fd}"
            );
        }
    }
}
