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

/// The attention with every product over the full `seq × seq` block (the
/// passes before causal tiles): the reference whose bits the tiled passes
/// keep.
mod full_blocks {
    use super::*;

    pub(super) fn forward(
        shape: CausalShape,
        q: &[f32],
        k: &[f32],
        v: &[f32],
        probs: &mut [f32],
        out: &mut [f32],
    ) {
        let CausalShape {
            seq: t,
            heads,
            kv_heads,
            head_dim: hd,
        } = shape;
        let (qw, kw) = shape.widths();
        let rep = heads / kv_heads;
        let scale = shape.scale();
        out.par_chunks_mut(t * qw)
            .zip(probs.par_chunks_mut(heads * t * t))
            .enumerate()
            .for_each(|(row, (out, probs))| {
                let q = &q[row * t * qw..(row + 1) * t * qw];
                let k = &k[row * t * kw..(row + 1) * t * kw];
                let v = &v[row * t * kw..(row + 1) * t * kw];
                for (head, p) in probs.chunks_mut(t * t).enumerate() {
                    let g = (head / rep) * hd;
                    let qh = Mat {
                        data: &q[head * hd..],
                        rs: qw,
                        cs: 1,
                    };
                    let kt = Mat {
                        data: &k[g..],
                        rs: 1,
                        cs: kw,
                    };
                    gemm_into(p, t, t, t, hd, false, scale, qh, kt);
                    for (i, row) in p.chunks_mut(t).enumerate() {
                        let max = row[..=i].iter().copied().fold(f32::NEG_INFINITY, f32::max);
                        let inv = (1.0 / exp_shifted_in_place(&mut row[..=i], max)) as f32;
                        for s in &mut row[..=i] {
                            *s *= inv;
                        }
                        row[i + 1..].fill(0.0);
                    }
                    let vh = Mat {
                        data: &v[g..],
                        rs: kw,
                        cs: 1,
                    };
                    gemm_into(
                        &mut out[head * hd..],
                        qw,
                        t,
                        hd,
                        t,
                        false,
                        1.0,
                        Mat::rows(p, t),
                        vh,
                    );
                }
            });
    }

    pub(super) fn backward(
        shape: CausalShape,
        (q, k, v, probs): (&[f32], &[f32], &[f32], &[f32]),
        d_out: &[f32],
        dq: &mut [f32],
        dk: &mut [f32],
        dv: &mut [f32],
    ) {
        let CausalShape {
            seq: t,
            heads,
            kv_heads,
            head_dim: hd,
        } = shape;
        let (qw, kw) = shape.widths();
        let rep = heads / kv_heads;
        let scale = shape.scale();
        dq.par_chunks_mut(t * qw)
            .zip(dk.par_chunks_mut(t * kw))
            .zip(dv.par_chunks_mut(t * kw))
            .enumerate()
            .for_each(|(row, ((dq, dk), dv))| {
                let q = &q[row * t * qw..(row + 1) * t * qw];
                let k = &k[row * t * kw..(row + 1) * t * kw];
                let v = &v[row * t * kw..(row + 1) * t * kw];
                let d_out = &d_out[row * t * qw..(row + 1) * t * qw];
                let probs = &probs[row * heads * t * t..(row + 1) * heads * t * t];
                dk.fill(0.0);
                dv.fill(0.0);
                let mut ds = vec![0.0f32; t * t];
                for (head, p) in probs.chunks(t * t).enumerate() {
                    let g = (head / rep) * hd;
                    let doh = Mat {
                        data: &d_out[head * hd..],
                        rs: qw,
                        cs: 1,
                    };
                    // dP = dO vᵀ; dv += Pᵀ dO.
                    gemm_into(
                        &mut ds,
                        t,
                        t,
                        t,
                        hd,
                        false,
                        1.0,
                        doh,
                        Mat {
                            data: &v[g..],
                            rs: 1,
                            cs: kw,
                        },
                    );
                    gemm_into(
                        &mut dv[g..],
                        kw,
                        t,
                        hd,
                        t,
                        true,
                        1.0,
                        Mat::transposed(p, t),
                        doh,
                    );
                    // dS = P ⊙ (dP − Σ_u P dP).
                    for (prow, drow) in p.chunks(t).zip(ds.chunks_mut(t)) {
                        let dot: f32 = prow.iter().zip(drow.iter()).map(|(a, b)| a * b).sum();
                        for (d, p) in drow.iter_mut().zip(prow) {
                            *d = p * (*d - dot);
                        }
                    }
                    // dq = scale · dS k; dk += scale · dSᵀ q.
                    let kh = Mat {
                        data: &k[g..],
                        rs: kw,
                        cs: 1,
                    };
                    gemm_into(
                        &mut dq[head * hd..],
                        qw,
                        t,
                        hd,
                        t,
                        false,
                        scale,
                        Mat::rows(&ds, t),
                        kh,
                    );
                    let qh = Mat {
                        data: &q[head * hd..],
                        rs: qw,
                        cs: 1,
                    };
                    gemm_into(
                        &mut dk[g..],
                        kw,
                        t,
                        hd,
                        t,
                        true,
                        scale,
                        Mat::transposed(&ds, t),
                        qh,
                    );
                }
            });
    }
}

/// `n` values of magnitude up to `amp`, some scores then large enough that
/// probabilities below the diagonal underflow to zero.
fn scaled(n: usize, seed: u32, amp: f32) -> Vec<f32> {
    values(n, seed).into_iter().map(|x| x * amp).collect()
}

#[test]
fn causal_tiles_keep_the_bits_of_the_full_products() {
    let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
    for (seq, heads, kv_heads, head_dim) in [
        (8, 2, 1, 4),
        (63, 3, 1, 16),
        (64, 2, 2, 64),
        (100, 3, 3, 32),
        (128, 9, 3, 64),
        (161, 2, 1, 64),
        (520, 1, 1, 16),
    ] {
        let shape = CausalShape {
            seq,
            heads,
            kv_heads,
            head_dim,
        };
        let rows = 2;
        let (qw, kw) = shape.widths();
        let n = rows * seq;
        for amp in [1.0, 16.0] {
            let what = format!("{shape:?} at amplitude {amp}");
            let (q, k, v) = (
                scaled(n * qw, 11, amp),
                scaled(n * kw, 12, amp),
                scaled(n * kw, 13, 1.0),
            );
            let d_out = scaled(n * qw, 14, 1.0);
            // Outputs start as NaN: an element the tiled pass leaves
            // unwritten, or reads before writing, shows.
            let (mut probs, mut out) = (
                vec![f32::NAN; shape.probs_len(rows)],
                vec![f32::NAN; n * qw],
            );
            causal_attention(shape, &q, &k, &v, &mut probs, &mut out);
            let (mut want_probs, mut want_out) = (vec![0.0; probs.len()], vec![0.0; out.len()]);
            full_blocks::forward(shape, &q, &k, &v, &mut want_probs, &mut want_out);
            assert_eq!(bits(&probs), bits(&want_probs), "probabilities, {what}");
            assert_eq!(bits(&out), bits(&want_out), "output, {what}");
            if amp > 1.0 {
                assert!(
                    probs
                        .chunks(seq)
                        .enumerate()
                        .any(|(i, r)| r[..=i % seq].contains(&0.0)),
                    "no probability underflows, {what}"
                );
            }
            let grads = |tiled: bool| {
                let mut g = [
                    vec![f32::NAN; n * qw],
                    vec![f32::NAN; n * kw],
                    vec![f32::NAN; n * kw],
                ];
                let [dq, dk, dv] = &mut g;
                let saved = (&q[..], &k[..], &v[..], &probs[..]);
                if tiled {
                    causal_attention_backward(shape, saved, &d_out, dq, dk, dv);
                } else {
                    full_blocks::backward(shape, saved, &d_out, dq, dk, dv);
                }
                g.map(|g| bits(&g))
            };
            assert_eq!(grads(true), grads(false), "gradients, {what}");
        }
    }
}
