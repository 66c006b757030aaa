//! AdaPMixED's leave-one-out divergences `Dsym_α(p ‖ p₋ᵢ)` for every member i at
//! integer orders, in one pass over the members that keeps each vocabulary chunk
//! of the shared vectors in cache.
//!
//! With `S = Σⱼ p̄ⱼ` (the running sum of the members' mixtures), `p = S/N` and
//! `p₋ᵢ = (S − p̄ᵢ)/(N−1)`, the ratio `t = p₋ᵢ/p = (S − p̄ᵢ)·N/((N−1)·S)` needs
//! one multiplication by a precomputed `N/((N−1)S)` per entry, and
//!
//! * `D_α(p₋ᵢ ‖ p) = (ln Σ p·t^α − α ln P + (α−1) ln Q)/(α−1)`,
//! * `D_α(p ‖ p₋ᵢ) = (ln Σ p·t^{1−α} − α ln Q + (α−1) ln P)/(α−1)`,
//!
//! with `P = Σ p₋ᵢ` and `Q = Σ p` (so both are divergences of the normalised
//! vectors, as [`privmix_renyi::divergence`] computes them). `S − p̄ᵢ` is summed
//! from the other members directly wherever p̄ᵢ holds more than half of S (at
//! most one member per entry), so no entry suffers cancellation.
//!
//! A member that holds at most half of S at every entry of a chunk (the usual
//! case) takes one fused sweep over the chunk that forms
//! `t = c − λᵢ·pᵢ·(c/S) − (1−λᵢ)·p₀·(c/S)` (`c = N/(N−1)`, `t ∈ [c/2, c]`, a few
//! ulps) and sums its powers on the spot; otherwise the chunk is redone by the
//! two-loop pass that sums the others directly where needed.
//!
//! Every term is non-negative and `t ≤ N/(N−1)·(1 + 4u)`, so the forward sum
//! cannot overflow; the reverse one can only where some `t` is tiny. A member
//! whose smallest `t` makes `t^{α−1}` leave the normal range, or whose sums come
//! out non-finite, is answered by the general kernels of `privmix_renyi` instead
//! (the caller's fallback), as are non-integer orders and orders above
//! [`MAX_FAST_ORDER`]. The values agree with the general kernels to rounding
//! (a few ulps per term, amplified at most α-fold); AdaPMixED's additive
//! allowance covers that.

use privmix_renyi::simd::{Prefetch, pow_vectors, warm};
use pulp::{Simd, WithSimd};
use rayon::prelude::*;

use crate::Ensemble;

/// Largest integer order computed here (powers by repeated squaring).
pub(crate) const MAX_FAST_ORDER: u32 = 64;

/// The vocabulary is cut into this many equal chunks (fewer for a small
/// vocabulary, see [`chunk_len`]), a number fixed independently of the thread
/// count so that the reduction order, and so the result, is too.
const CHUNKS: usize = 8;

/// Smallest chunk: below this a member's slice is too short a memory stream.
const MIN_CHUNK: usize = 2048;

/// Entries per chunk. Long chunks matter: every member's slice of a chunk is a
/// separate stream from memory, and the prefetchers pay a start-up cost per stream,
/// so short chunks cost more than the cache they save. With 8 chunks the
/// chunk's shared vectors (p₀, S, p, the reciprocals, t: 6 × 50 KB for V = 50257)
/// still stay in L2 while every member passes over it.
fn chunk_len(v: usize) -> usize {
    v.div_ceil(CHUNKS).next_multiple_of(W).max(MIN_CHUNK)
}

/// Elements per block of the inner loops: two AVX-512 vectors.
const W: usize = 16;

/// The integer orders `k` (2 ≤ k ≤ [`MAX_FAST_ORDER`]) of `orders`, or `None`
/// for an order this kernel does not serve.
pub(crate) fn fast_order(alpha: f64) -> Option<u32> {
    let k = alpha as u32;
    (f64::from(k) == alpha && (2..=MAX_FAST_ORDER).contains(&k)).then_some(k)
}

/// `Dsym_{k}(p ‖ p₋ᵢ)` for every member i and every order of `orders` (each
/// served by [`fast_order`]): `result[i][o]`, or `None` for a member the caller
/// must recompute with the general kernels.
pub(crate) fn leave_one_out_divergences(
    ensemble: &Ensemble,
    lambdas: &[f64],
    sum: &[f64],
    distribution: &[f64],
    orders: &[u32],
) -> Vec<Option<Vec<f64>>> {
    divergences(ensemble, lambdas, sum, distribution, orders, true).0
}

/// [`leave_one_out_divergences`], with the fused pass on or off, and how many
/// (member, chunk) pairs took it.
fn divergences(
    ensemble: &Ensemble,
    lambdas: &[f64],
    sum: &[f64],
    distribution: &[f64],
    orders: &[u32],
    fuse: bool,
) -> (Vec<Option<Vec<f64>>>, usize) {
    let (n, v) = (ensemble.len(), ensemble.vocab());
    debug_assert!(n >= 2 && lambdas.len() == n && sum.len() == v);
    let chunk = chunk_len(v);
    let starts: Vec<usize> = (0..v).step_by(chunk).collect();
    let partials: Vec<Partial> = starts
        .par_iter()
        .map(|&start| {
            let end = (start + chunk).min(v);
            pulp::Arch::new().dispatch(ChunkPass {
                ensemble,
                lambdas,
                sum,
                distribution,
                orders,
                range: (start, end),
                fuse,
            })
        })
        .collect();
    // Chunks are reduced in vocabulary order: the result does not depend on the
    // number of threads.
    let mut total = Partial::zero(n, orders.len());
    for p in &partials {
        total.add(p);
    }
    let q_total = total.q_total;
    let kmax = orders.iter().copied().max().unwrap_or(2);
    let values = (0..n)
        .map(|i| {
            let p_total = total.rest[i] / (n - 1) as f64;
            // t^{α−1} of the smallest t must stay a normal number.
            let smallest = total.t_min[i].powi(kmax as i32 - 1);
            if !(p_total > 0.0 && p_total.is_finite() && smallest >= 1e-290) {
                return None;
            }
            let (lp, lq) = (p_total.ln(), q_total.ln());
            orders
                .iter()
                .enumerate()
                .map(|(o, &k)| {
                    let (f, r) = (total.forward[i][o], total.reverse[i][o]);
                    if !(f > 0.0 && f.is_finite() && r > 0.0 && r.is_finite()) {
                        return None;
                    }
                    let a = f64::from(k);
                    let forward = (f.ln() - a * lp + (a - 1.0) * lq) / (a - 1.0);
                    let reverse = (r.ln() - a * lq + (a - 1.0) * lp) / (a - 1.0);
                    Some(forward.max(reverse).max(0.0))
                })
                .collect()
        })
        .collect();
    (values, total.fused)
}

/// `Σ_{j≠i} (λⱼ·pⱼ(x) + (1 − λⱼ)·p₀(x))`, summed directly in member order: the
/// rest of S at an entry where member i holds more than half of it, so that
/// `S − p̄ᵢ` would cancel.
pub(crate) fn others_sum(ensemble: &Ensemble, lambdas: &[f64], i: usize, x: usize) -> f64 {
    let public = ensemble.public();
    (0..ensemble.len())
        .filter(|&j| j != i)
        .map(|j| lambdas[j] * ensemble.member(j)[x] + (1.0 - lambdas[j]) * public[x])
        .sum()
}

/// One chunk's contribution to every member's sums.
struct Partial {
    /// `Σ (S − p̄ᵢ)` per member.
    rest: Vec<f64>,
    /// Smallest `t` per member.
    t_min: Vec<f64>,
    /// `Σ p·t^k` per member and order.
    forward: Vec<Vec<f64>>,
    /// `Σ p·t^{1−k}` per member and order.
    reverse: Vec<Vec<f64>>,
    /// `Σ p`.
    q_total: f64,
    /// How many (member, chunk) pairs took the fused pass (for the tests).
    fused: usize,
}

impl Partial {
    fn zero(n: usize, orders: usize) -> Self {
        Partial {
            rest: vec![0.0; n],
            t_min: vec![f64::INFINITY; n],
            forward: vec![vec![0.0; orders]; n],
            reverse: vec![vec![0.0; orders]; n],
            q_total: 0.0,
            fused: 0,
        }
    }

    fn add(&mut self, other: &Partial) {
        self.q_total += other.q_total;
        self.fused += other.fused;
        for i in 0..self.rest.len() {
            self.rest[i] += other.rest[i];
            self.t_min[i] = self.t_min[i].min(other.t_min[i]);
            for o in 0..self.forward[i].len() {
                self.forward[i][o] += other.forward[i][o];
                self.reverse[i][o] += other.reverse[i][o];
            }
        }
    }
}

/// The pass over one vocabulary chunk, as a `pulp` operation so that its loops
/// are compiled for the CPU's widest vectors.
struct ChunkPass<'a> {
    ensemble: &'a Ensemble,
    lambdas: &'a [f64],
    sum: &'a [f64],
    distribution: &'a [f64],
    orders: &'a [u32],
    range: (usize, usize),
    /// Take the fused pass where it applies (false only in tests: the two-loop pass
    /// everywhere).
    fuse: bool,
}

impl WithSimd for ChunkPass<'_> {
    type Output = Partial;

    #[inline(always)]
    fn with_simd<S: Simd>(self, simd: S) -> Partial {
        let ChunkPass {
            ensemble,
            lambdas,
            sum,
            distribution,
            orders,
            range: (start, end),
            fuse,
        } = self;
        let n = ensemble.len();
        let len = end - start;
        let mut out = Partial::zero(n, orders.len());
        // The chunk's shared vectors, padded to whole blocks of `W` with S = 0 and
        // p = 0, where `base = 1` makes t = 1 (weight 0: no contribution).
        let padded = len.div_ceil(W) * W;
        let (mut s, mut w, mut inv, mut base, mut p0) = (
            vec![0.0; padded],
            vec![0.0; padded],
            vec![0.0; padded],
            vec![1.0; padded],
            vec![0.0; padded],
        );
        s[..len].copy_from_slice(&sum[start..end]);
        w[..len].copy_from_slice(&distribution[start..end]);
        p0[..len].copy_from_slice(&ensemble.public()[start..end]);
        let c = n as f64 / (n - 1) as f64;
        for x in 0..len {
            if s[x] > 0.0 {
                inv[x] = c / s[x];
                base[x] = 0.0;
            }
        }
        // p₀·c/S, shared by every member's fused pass (0 where S = 0).
        let scaled_public: Vec<f64> = p0.iter().zip(&inv).map(|(&q, &v)| q * v).collect();
        let (s_total, p0_total) = (s.iter().sum::<f64>(), p0.iter().sum::<f64>());
        out.q_total = w.iter().sum();
        let (sv, wv, iv, bv, qv) = (
            S::as_simd_f64s(&s).0,
            S::as_simd_f64s(&w).0,
            S::as_simd_f64s(&inv).0,
            S::as_simd_f64s(&base).0,
            S::as_simd_f64s(&p0).0,
        );
        let mut t = vec![0.0; padded];
        let half = simd.splat_f64s(0.5);
        let (zero, one) = (simd.splat_f64s(0.0), simd.splat_f64s(1.0));
        let spv = S::as_simd_f64s(&scaled_public).0;
        let mut prefetched = false;
        for i in 0..n {
            let row = &ensemble.member(i)[start..end];
            let (head, tail) = S::as_simd_f64s(row);
            let tail = simd.partial_load_f64s(tail);
            // The member's slice is a short stream: unless the previous member's
            // fused pass prefetched it, fetch it with many misses in flight.
            if !prefetched {
                warm(row);
            }
            // The common case: no entry dominated by member i, one fused pass.
            let store = (orders.len() > 1).then_some(&mut t);
            let fused = fuse.then(|| FusedMember {
                head,
                tail,
                next: if i + 1 < n {
                    &ensemble.member(i + 1)[start..end]
                } else {
                    &[]
                },
                inv: iv,
                scaled_public: spv,
                weight: wv,
                lambda: lambdas[i],
                c,
                k: orders[0],
            });
            // A fused pass (even one that finds a dominated entry) prefetches the
            // next member's slice.
            prefetched = fused.is_some();
            if let Some(f) = fused.and_then(|m| m.run(simd, store)) {
                out.fused += 1;
                out.rest[i] = s_total - (lambdas[i] * f.p_total + (1.0 - lambdas[i]) * p0_total);
                out.t_min[i] = f.t_min;
                out.forward[i][0] = f.forward;
                out.reverse[i][0] = f.reverse;
                let tv = S::as_simd_f64s(&t).0;
                for (o, &k) in orders.iter().enumerate().skip(1) {
                    let (f, r) = powered_sums(simd, tv, wv, k);
                    out.forward[i][o] = f;
                    out.reverse[i][o] = r;
                }
                continue;
            }
            let (li, mi) = (
                simd.splat_f64s(lambdas[i]),
                simd.splat_f64s(1.0 - lambdas[i]),
            );
            let (mut racc, mut tmin, mut dom) = (zero, simd.splat_f64s(f64::INFINITY), zero);
            {
                let tv = S::as_mut_simd_f64s(&mut t).0;
                for v in 0..sv.len() {
                    // Past the member's row: zeros (own = 0, rest = S = 0, t = 1).
                    let p = if v < head.len() {
                        head[v]
                    } else if v == head.len() {
                        tail
                    } else {
                        zero
                    };
                    let own = simd.mul_add_f64s(li, p, simd.mul_f64s(mi, qv[v]));
                    let dominant = simd.greater_than_f64s(own, simd.mul_f64s(half, sv[v]));
                    dom = simd.select_f64s(dominant, one, dom);
                    let rest = simd.sub_f64s(sv[v], own);
                    racc = simd.add_f64s(racc, rest);
                    let tx = simd.mul_add_f64s(rest, iv[v], bv[v]);
                    tmin = simd.min_f64s(tmin, tx);
                    tv[v] = tx;
                }
            }
            let mut rest_total = simd.reduce_sum_f64s(racc);
            let mut smallest = simd.reduce_min_f64s(tmin);
            if simd.reduce_max_f64s(dom) > 0.0 {
                // Rare: recompute the entries where member i dominates from the others.
                let (li, mi) = (lambdas[i], 1.0 - lambdas[i]);
                for x in 0..len {
                    let own = li * row[x] + mi * p0[x];
                    if own > 0.5 * s[x] {
                        let rest = others_sum(ensemble, lambdas, i, start + x);
                        rest_total += rest - (s[x] - own);
                        t[x] = rest * inv[x];
                    }
                }
                smallest = t.iter().copied().fold(f64::INFINITY, f64::min);
            }
            out.rest[i] = rest_total;
            out.t_min[i] = smallest;
            let tv = S::as_simd_f64s(&t).0;
            for (o, &k) in orders.iter().enumerate() {
                let (f, r) = powered_sums(simd, tv, wv, k);
                out.forward[i][o] = f;
                out.reverse[i][o] = r;
            }
        }
        out
    }
}

/// Vectors per block of [`powered_sums`]: enough independent chains to hide the
/// multiplications' latency and the loop's exponent tests.
const U: usize = 4;

/// One member's pass over a chunk when no entry is dominated by the member:
/// `t = c − λ·p·(c/S) − (1−λ)·p₀·(c/S)` (= `(S − p̄ᵢ)·c/S`), its smallest value,
/// `Σ p`, and the powered sums of the first order, in one sweep that reads the
/// member's slice and three shared vectors and stores nothing (except `t`, when
/// more orders need it).
///
/// Why: the two-loop form (build `t`, then sum its powers) moved eight vectors per
/// entry through L2 and was bound by that traffic; this one moves four. The two
/// forms round differently (a few ulps of `t`, which lies in `[c/2, c]` here);
/// both are within the allowance the caller adds.
///
/// `None` when some entry has `t < c/2` (member i holds more than half of S there;
/// with a margin for rounding): the caller then takes the exact two-loop path,
/// which sums the others directly at such entries.
struct FusedMember<'a, S: Simd> {
    head: &'a [S::f64s],
    tail: S::f64s,
    /// The next member's slice of the chunk (empty for the last member): its
    /// lines are prefetched during this pass, one per vector, so that its DRAM
    /// latency hides behind this member's arithmetic.
    next: &'a [f64],
    inv: &'a [S::f64s],
    scaled_public: &'a [S::f64s],
    weight: &'a [S::f64s],
    lambda: f64,
    c: f64,
    k: u32,
}

/// What [`FusedMember::run`] returns.
struct FusedSums {
    p_total: f64,
    t_min: f64,
    forward: f64,
    reverse: f64,
}

impl<S: Simd> FusedMember<'_, S> {
    #[inline(always)]
    fn run(self, simd: S, mut store: Option<&mut Vec<f64>>) -> Option<FusedSums> {
        let FusedMember {
            head,
            tail,
            next,
            inv,
            scaled_public,
            weight,
            lambda,
            c,
            k,
        } = self;
        let zero = simd.splat_f64s(0.0);
        let (neg_l, neg_m, cv) = (
            simd.splat_f64s(-lambda),
            simd.splat_f64s(-(1.0 - lambda)),
            simd.splat_f64s(c),
        );
        // Entries below this are (or may be, by rounding) dominated by member i.
        let floor = 0.5 * c * (1.0 + 1e-12);
        let load = |v: usize| {
            if v < head.len() {
                head[v]
            } else if v == head.len() {
                tail
            } else {
                zero
            }
        };
        let (mut fa, mut ra, mut ps) = ([zero; U], [zero; U], [zero; U]);
        let mut tmin = simd.splat_f64s(f64::INFINITY);
        let mut tv = store.as_mut().map(|t| S::as_mut_simd_f64s(t).0);
        let prefetch = Prefetch::new();
        let lanes = size_of::<S::f64s>() / size_of::<f64>();
        for b in 0..inv.len() / U {
            let mut x = [zero; U];
            for j in 0..U {
                let v = b * U + j;
                prefetch.line(next, v * lanes);
                let p = load(v);
                ps[j] = simd.add_f64s(ps[j], p);
                let rest = simd.mul_add_f64s(neg_m, scaled_public[v], cv);
                x[j] = simd.mul_add_f64s(neg_l, simd.mul_f64s(p, inv[v]), rest);
                tmin = simd.min_f64s(tmin, x[j]);
                if let Some(t) = tv.as_mut() {
                    t[v] = x[j];
                }
            }
            add_powers(simd, x, &weight[b * U..], k, &mut fa, &mut ra);
        }
        // The padded length is a multiple of W entries, which need not fill a block
        // of U vectors (on AVX-512, W is two vectors): the rest go one at a time.
        for v in (inv.len() / U) * U..inv.len() {
            let p = load(v);
            ps[0] = simd.add_f64s(ps[0], p);
            let rest = simd.mul_add_f64s(neg_m, scaled_public[v], cv);
            let x = simd.mul_add_f64s(neg_l, simd.mul_f64s(p, inv[v]), rest);
            tmin = simd.min_f64s(tmin, x);
            if let Some(t) = tv.as_mut() {
                t[v] = x;
            }
            add_powers(simd, [x], &weight[v..], k, &mut fa, &mut ra);
        }
        // Some entry below the floor (dominated) has the smallest t below it.
        let t_min = simd.reduce_min_f64s(tmin);
        if t_min.is_nan() || t_min < floor {
            return None;
        }
        Some(FusedSums {
            p_total: lane_sum(simd, ps),
            t_min,
            forward: lane_sum(simd, fa),
            reverse: lane_sum(simd, ra),
        })
    }
}

/// `(Σ w·t^k, Σ w/t^{k−1})`, for vectors `t` and `w` of equal length.
#[inline(always)]
fn powered_sums<S: Simd>(simd: S, t: &[S::f64s], w: &[S::f64s], k: u32) -> (f64, f64) {
    let zero = simd.splat_f64s(0.0);
    let (mut fa, mut ra) = ([zero; U], [zero; U]);
    let (tb, wb) = (t.chunks_exact(U), w.chunks_exact(U));
    let (tt, wt) = (tb.remainder(), wb.remainder());
    for (tb, wb) in tb.zip(wb) {
        let mut x = [zero; U];
        x.copy_from_slice(tb);
        add_powers(simd, x, wb, k, &mut fa, &mut ra);
    }
    for (&tv, wv) in tt.iter().zip(wt.chunks(1)) {
        add_powers(simd, [tv], wv, k, &mut fa, &mut ra);
    }
    (lane_sum(simd, fa), lane_sum(simd, ra))
}

/// Adds `w·x^k` to `fa` and `w/x^{k−1}` to `ra`, vector by vector, for the `B`
/// vectors of `x` (powers in `B` independent chains): the accumulation both the
/// two-loop and the fused leave-one-out passes use.
#[inline(always)]
fn add_powers<S: Simd, const B: usize>(
    simd: S,
    x: [S::f64s; B],
    w: &[S::f64s],
    k: u32,
    fa: &mut [S::f64s; U],
    ra: &mut [S::f64s; U],
) {
    let xk1 = pow_vectors(simd, x, k - 1);
    for j in 0..B {
        fa[j] = simd.mul_add_f64s(w[j], simd.mul_f64s(xk1[j], x[j]), fa[j]);
        ra[j] = simd.add_f64s(ra[j], simd.div_f64s(w[j], xk1[j]));
    }
}

/// The sum of every lane of `U` accumulators, added in order.
#[inline(always)]
fn lane_sum<S: Simd>(simd: S, a: [S::f64s; U]) -> f64 {
    let mut s = a[0];
    for x in &a[1..] {
        s = simd.add_f64s(s, *x);
    }
    simd.reduce_sum_f64s(s)
}

#[cfg(test)]
mod tests {
    use super::*;
    use privmix_renyi::{Order, symmetric_divergence};
    use proptest::prelude::*;

    /// `Dsym_k(p ‖ p₋ᵢ)` on explicitly built rows, by the general kernels.
    fn explicit(e: &Ensemble, lambdas: &[f64], i: usize, k: u32) -> f64 {
        let (n, v) = (e.len(), e.vocab());
        let mix =
            |j: usize, x: usize| lambdas[j] * e.member(j)[x] + (1.0 - lambdas[j]) * e.public()[x];
        let p: Vec<f64> = (0..v)
            .map(|x| (0..n).map(|j| mix(j, x)).sum::<f64>() / n as f64)
            .collect();
        let rest: Vec<f64> = (0..v)
            .map(|x| (0..n).filter(|&j| j != i).map(|j| mix(j, x)).sum::<f64>() / (n - 1) as f64)
            .collect();
        symmetric_divergence(&p, &rest, Order::new(f64::from(k)).unwrap()).unwrap()
    }

    fn run(e: &Ensemble, lambdas: &[f64], orders: &[u32]) -> Vec<Option<Vec<f64>>> {
        let (n, v) = (e.len(), e.vocab());
        let mut sum = vec![0.0; v];
        for j in 0..n {
            for x in 0..v {
                sum[x] += lambdas[j] * e.member(j)[x] + (1.0 - lambdas[j]) * e.public()[x];
            }
        }
        let dist: Vec<f64> = sum.iter().map(|s| s / n as f64).collect();
        leave_one_out_divergences(e, lambdas, &sum, &dist, orders)
    }

    fn row(v: usize) -> impl Strategy<Value = Vec<f64>> {
        // Some exact zeros and a wide dynamic range, so that members dominate entries.
        prop::collection::vec(
            prop_oneof![1 => Just(0.0), 6 => 1e-6..1.0f64, 1 => 1e-12..1e-9f64],
            v,
        )
        .prop_filter("a positive entry", |w| w.iter().any(|&x| x > 0.0))
        .prop_map(|w| {
            let s: f64 = w.iter().sum();
            w.into_iter().map(|x| x / s).collect()
        })
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(96))]

        /// Where the fused kernel answers, it agrees with the general kernels on the
        /// materialised leave-one-out rows; crossing vector and chunk boundaries
        /// (V up to 2100 > MIN_CHUNK) and tails of every length.
        #[test]
        fn agrees_with_the_general_kernels(
            (v, n) in (1usize..40, 2usize..7),
            big in any::<bool>(),
            seed_rows in prop::collection::vec(row(40), 8),
            lambdas in prop::collection::vec(0.0..=1.0f64, 7),
        ) {
            // A large vocabulary repeats the small rows (then renormalises).
            let v = if big { 2100 } else { v };
            let norm = |r: &Vec<f64>| -> Vec<f64> {
                let w: Vec<f64> = (0..v).map(|x| r[x % 40] + 1e-300 * (x % 3) as f64).collect();
                let s: f64 = w.iter().sum();
                w.into_iter().map(|x| x / s).collect()
            };
            let positive = |r: &Vec<f64>| (0..v).any(|x| r[x % 40] > 0.0) || v > 1;
            prop_assume!(seed_rows.iter().all(positive));
            let public = norm(&seed_rows[7]);
            let members: Vec<f64> = (0..n).flat_map(|i| norm(&seed_rows[i])).collect();
            let e = Ensemble::from_probabilities(&public, &members).unwrap();
            let lambdas = &lambdas[..n];
            let orders = [2u32, 3, 18];
            for (i, got) in run(&e, lambdas, &orders).into_iter().enumerate() {
                let Some(got) = got else { continue };
                for (&k, g) in orders.iter().zip(got) {
                    let want = explicit(&e, lambdas, i, k);
                    let tol = 1e-10 * want.max(1.0);
                    prop_assert!((g - want).abs() <= tol, "member {i} order {k}: {g} vs {want}");
                }
            }
        }
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(48))]

        /// Members that are perturbations of one row (no member dominates an
        /// entry): the fused pass serves every (member, chunk) pair, and agrees
        /// with the two-loop pass and with the general kernels, for one order and
        /// for several (where it also stores t for the others).
        #[test]
        fn the_fused_pass_agrees_with_the_two_loop_pass(
            v in prop_oneof![1usize..40, 2040usize..2200],
            n in 3usize..9,
            seed in any::<u64>(),
            lambdas in prop::collection::vec(0.5..=1.0f64, 8),
            several in any::<bool>(),
        ) {
            let mut state = seed | 1;
            let mut uniform = move || {
                state ^= state << 13;
                state ^= state >> 7;
                state ^= state << 17;
                (state >> 11) as f64 / (1u64 << 53) as f64
            };
            let norm = |w: Vec<f64>| -> Vec<f64> {
                let s: f64 = w.iter().sum();
                w.into_iter().map(|x| x / s).collect()
            };
            let base: Vec<f64> = (0..v).map(|_| (8.0 * uniform()).exp()).collect();
            let public = norm(base.iter().map(|b| b * (1.0 + 0.2 * uniform())).collect());
            let members: Vec<f64> = (0..n)
                .flat_map(|_| norm(base.iter().map(|b| b * (1.0 + 0.2 * uniform())).collect()))
                .collect();
            let e = Ensemble::from_probabilities(&public, &members).unwrap();
            let lambdas = &lambdas[..n];
            let orders: &[u32] = if several { &[18, 2, 5] } else { &[18] };
            let mut sum = vec![0.0; v];
            for j in 0..n {
                for x in 0..v {
                    sum[x] += lambdas[j] * e.member(j)[x] + (1.0 - lambdas[j]) * e.public()[x];
                }
            }
            let dist: Vec<f64> = sum.iter().map(|s| s / n as f64).collect();
            let (fused, count) = divergences(&e, lambdas, &sum, &dist, orders, true);
            let (plain, none) = divergences(&e, lambdas, &sum, &dist, orders, false);
            let chunks = v.div_ceil(chunk_len(v));
            prop_assert_eq!(count, n * chunks);
            prop_assert_eq!(none, 0);
            for (i, (f, p)) in fused.iter().zip(&plain).enumerate() {
                let (f, p) = (f.as_ref().unwrap(), p.as_ref().unwrap());
                for (o, &k) in orders.iter().enumerate() {
                    // The two passes round t differently: agreement to the log
                    // terms' rounding (absolute) and a relative 1e-10.
                    let want = explicit(&e, lambdas, i, k);
                    let close = 1e-13 + 1e-10 * want;
                    prop_assert!((f[o] - p[o]).abs() <= close, "{i} {k}: {} vs {}", f[o], p[o]);
                    let tol = 1e-10 * want.max(1.0);
                    prop_assert!((f[o] - want).abs() <= tol, "{i} {k}: {} vs {want}", f[o]);
                }
            }
        }
    }

    #[test]
    fn a_dominant_member_is_summed_from_the_others() {
        // Member 0 holds almost all of entry 0's mass: S − p̄₀ would cancel there.
        let public = [0.5, 0.25, 0.25];
        let members = [
            1.0 - 2e-12,
            1e-12,
            1e-12,
            1e-9,
            0.5,
            0.5 - 1e-9,
            2e-9,
            0.5,
            0.5 - 2e-9,
        ];
        let e = Ensemble::from_probabilities(&public, &members).unwrap();
        let lambdas = [1.0, 1.0, 1.0];
        let got = run(&e, &lambdas, &[2, 18]);
        for (i, g) in got.iter().enumerate() {
            let g = g.as_ref().expect("served by the fused kernel");
            for (&k, &value) in [2u32, 18].iter().zip(g) {
                let want = explicit(&e, &lambdas, i, k);
                assert!(
                    (value - want).abs() <= 1e-10 * want.max(1.0),
                    "{i} {k}: {value} vs {want}"
                );
            }
        }
    }

    #[test]
    fn a_zero_left_after_removal_is_declined() {
        // Only member 0 puts mass on entry 2 (λ = 1): removing it leaves 0 where p > 0,
        // an infinite reverse divergence, which the general kernels must report.
        let public = [0.5, 0.5, 0.0];
        let members = [0.4, 0.4, 0.2, 0.5, 0.5, 0.0];
        let e = Ensemble::from_probabilities(&public, &members).unwrap();
        let got = run(&e, &[1.0, 1.0], &[2]);
        assert!(got[0].is_none());
        assert!(fast_order(2.5).is_none() && fast_order(65.0).is_none());
        assert_eq!(fast_order(64.0), Some(64));
    }
}
