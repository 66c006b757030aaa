//! Stacked LoRA factors in host memory, applied row by row (plain burn-flex).
//!
//! Why: as tensors, one site's per-row update `(x A_i) B_i` is two batched
//! matmuls of `N + 1` tiny products each, and gemm's per-call packing and
//! dispatch cost more than the arithmetic (3 800 calls per SmolLM2 decode
//! step at N = 8). On plain burn-flex the base projection of a decode step is
//! computed in host memory anyway ([`privmix_models::Linear`]), so the update
//! is added there: `r` dot products and `r` scaled additions per row.
//!
//! Same arithmetic as the tensor path up to the order of f32 sums: `u = x A`
//! (sums over `in`), then `y += u B` (sums over `r`), with each member's
//! scale folded into `B` in f32 as there.

use std::collections::HashMap;

use privmix_models::Site;
#[cfg(test)]
use privmix_models::layers::simd::{axpy, dot};
use privmix_models::runtime::{for_each_task, rows_per_task};
use pulp::{Simd, WithSimd};
use ranks::{FactorRow, add_rank_groups};

/// One site's factors for every member: `A` transposed, `[members, r, in]`,
/// and the scaled `B`, `[members, r, out]`, in f32 or in f16.
#[derive(Debug, Clone)]
pub(crate) struct HostSite {
    inp: usize,
    out: usize,
    rank: usize,
    factors: Factors,
}

/// A site's factors, `Aᵀ` then the scaled `B`, as
/// [`crate::stacked::FactorPrecision`] says.
#[derive(Debug, Clone)]
enum Factors {
    F32 {
        a_t: Vec<f32>,
        b: Vec<f32>,
    },
    /// Bits of f16 values: half the bytes to read per step.
    F16 {
        a_t: Vec<u16>,
        b: Vec<u16>,
    },
}

impl HostSite {
    /// From each member's `A: [in, r]` and scaled `B: [r, out]`, row-major,
    /// held in f32.
    pub(crate) fn new(
        inp: usize,
        out: usize,
        rank: usize,
        members: &[(Vec<f32>, Vec<f32>)],
    ) -> Self {
        let (a_t, b) = Self::stack(inp, out, rank, members);
        Self {
            inp,
            out,
            rank,
            factors: Factors::F32 { a_t, b },
        }
    }

    /// [`HostSite::new`] held in f16: every entry must be an f16 value
    /// already (rounded and checked by the caller), so the update is
    /// exactly [`HostSite::new`]'s over the same factors.
    pub(crate) fn new_f16(
        inp: usize,
        out: usize,
        rank: usize,
        members: &[(Vec<f32>, Vec<f32>)],
    ) -> Self {
        let (a_t, b) = Self::stack(inp, out, rank, members);
        let half = |v: Vec<f32>| -> Vec<u16> {
            v.into_iter()
                .map(|x| {
                    let h = half::f16::from_f32(x);
                    debug_assert_eq!(h.to_f32().to_bits(), x.to_bits(), "not an f16 value");
                    h.to_bits()
                })
                .collect()
        };
        Self {
            inp,
            out,
            rank,
            factors: Factors::F16 {
                a_t: half(a_t),
                b: half(b),
            },
        }
    }

    /// `Aᵀ: [members, r, in]` and `B: [members, r, out]` from each member's
    /// `A: [in, r]` and `B: [r, out]`.
    fn stack(
        inp: usize,
        out: usize,
        rank: usize,
        members: &[(Vec<f32>, Vec<f32>)],
    ) -> (Vec<f32>, Vec<f32>) {
        let mut a_t = Vec::with_capacity(members.len() * rank * inp);
        let mut b = Vec::with_capacity(members.len() * rank * out);
        for (a, bm) in members {
            debug_assert_eq!((a.len(), bm.len()), (inp * rank, rank * out));
            for j in 0..rank {
                a_t.extend((0..inp).map(|c| a[c * rank + j]));
            }
            b.extend_from_slice(bm);
        }
        (a_t, b)
    }

    /// Output width.
    pub(crate) fn out_features(&self) -> usize {
        self.out
    }

    /// Bytes the factors take.
    pub(crate) fn bytes(&self) -> usize {
        match &self.factors {
            Factors::F32 { a_t, b } => 4 * (a_t.len() + b.len()),
            Factors::F16 { a_t, b } => 2 * (a_t.len() + b.len()),
        }
    }

    /// `y[row] += (x[row] A_m) B_m` with `m = members[row / seq]`, skipping
    /// rows whose member is `None`; `x: [rows, in]`, `y: [rows, out]`.
    pub(crate) fn add(&self, members: &[Option<usize>], x: &[f32], y: &mut [f32]) {
        add_shared(&[Some(self)], members, x, &mut [y]);
    }

    /// `y += (x A_m) B_m` for one row (`x` of the input width, `y` of the
    /// output width): the arithmetic [`HostSite::add`] does for each row.
    pub(crate) fn add_row(&self, member: usize, x: &[f32], y: &mut [f32]) {
        let rank = self.rank;
        match &self.factors {
            Factors::F32 { a_t, b } => {
                let (a, b) = self.member(a_t, b, member);
                pulp::Arch::new().dispatch(AddRow { rank, a, b, x, y });
            }
            Factors::F16 { a_t, b } => {
                let (a, b) = self.member(a_t, b, member);
                #[cfg(target_arch = "x86_64")]
                if let Some(v4) = pulp::x86::V4::try_new() {
                    v4.vectorize(half_rows::AddRowV4 {
                        v4,
                        rank,
                        a,
                        b,
                        x,
                        y,
                    });
                    return;
                }
                pulp::Arch::new().dispatch(AddHalfRow { rank, a, b, x, y });
            }
        }
    }

    /// Member `member`'s `Aᵀ: [r, in]` and `B: [r, out]` in the stacked
    /// `a_t` and `b` (of either element type).
    fn member<'a, E>(&self, a_t: &'a [E], b: &'a [E], member: usize) -> (&'a [E], &'a [E]) {
        let (a_len, b_len) = (self.rank * self.inp, self.rank * self.out);
        (
            &a_t[member * a_len..][..a_len],
            &b[member * b_len..][..b_len],
        )
    }
}

/// [`HostSite::add`] at several sites that read the same `x` (a block's
/// query, key and value; an MLP's gate and up), `ys[i]` for `sites[i]`
/// (`None`: a site no member adapts, left as it is), in one pass over the
/// rows: each thread takes one run of rows through every site, so the sites
/// share one fork and join instead of one each. Each row's update is
/// [`HostSite::add_row`].
pub(crate) fn add_shared(
    sites: &[Option<&HostSite>],
    members: &[Option<usize>],
    x: &[f32],
    ys: &mut [&mut [f32]],
) {
    let Some(inp) = sites.iter().flatten().map(|s| s.inp).next() else {
        return;
    };
    let rows = x.len() / inp;
    let seq = (rows / members.len().max(1)).max(1);
    let work: usize = sites
        .iter()
        .flatten()
        .map(|s| rows * s.rank * (s.inp + s.out))
        .sum();
    let per = rows_per_task(rows, work >= PARALLEL_MIN_FLOATS);
    // Run t: rows [t·per, (t+1)·per) of every adapted site's output.
    let mut runs: Vec<Vec<(&HostSite, &mut [f32])>> =
        (0..rows.div_ceil(per)).map(|_| Vec::new()).collect();
    for (y, site) in ys.iter_mut().zip(sites) {
        if let Some(site) = site {
            for (run, part) in runs.iter_mut().zip(y.chunks_mut(per * site.out)) {
                run.push((site, part));
            }
        }
    }
    let add = |t: usize, run: Vec<(&HostSite, &mut [f32])>| {
        for (site, part) in run {
            for (i, y) in part.chunks_exact_mut(site.out).enumerate() {
                let row = t * per + i;
                if let Some(m) = members.get(row / seq).copied().flatten() {
                    site.add_row(m, &x[row * inp..][..inp], y);
                }
            }
        }
    };
    for_each_task(runs, add);
}

/// The factors of every adapted site.
pub(crate) type HostFactors = HashMap<Site, HostSite>;

/// Row updates of at least this many factor entries run rows in parallel.
const PARALLEL_MIN_FLOATS: usize = 1 << 14;

/// One row's update `y += (x A_m) B_m` with member `m`'s `Aᵀ` (`a`:
/// `[r, in]`) and scaled `B` (`b`: `[r, out]`).
struct AddRow<'a> {
    rank: usize,
    a: &'a [f32],
    b: &'a [f32],
    x: &'a [f32],
    y: &'a mut [f32],
}

impl WithSimd for AddRow<'_> {
    type Output = ();

    /// Ranks four at a time: `u_j = x · Aᵀ_j` for the four in one pass over
    /// `x` (four accumulators, each summed as `simd::dot` sums), then `y +=
    /// Σ_j u_j B_j` in one pass over `y` (each entry's four multiply-adds in
    /// the order of `j`, as four `simd::axpy` passes would make them): the same bits
    /// as `rank` dots and axpys one after another, with `x` and `y` read
    /// once per four ranks and four independent chains of multiply-adds
    /// instead of one.
    #[inline(always)]
    fn with_simd<S: Simd>(self, simd: S) {
        let AddRow { rank, a, b, x, y } = self;
        let (inp, out) = (x.len(), y.len());
        let a = |j: usize| F32Row::<S>::new(&a[j * inp..][..inp]);
        let b = |j: usize| F32Row::<S>::new(&b[j * out..][..out]);
        add_rank_groups(simd, rank, x, (&a, &b), y);
    }
}

/// A row of f32 factors.
#[derive(Clone, Copy)]
struct F32Row<'a, S: Simd> {
    vectors: &'a [S::f32s],
    tail: &'a [f32],
}

impl<'a, S: Simd> F32Row<'a, S> {
    #[inline(always)]
    fn new(row: &'a [f32]) -> Self {
        let (vectors, tail) = S::as_simd_f32s(row);
        Self { vectors, tail }
    }
}

impl<S: Simd> FactorRow<S> for F32Row<'_, S> {
    #[inline(always)]
    fn vector(self, _: S, v: usize) -> S::f32s {
        self.vectors[v]
    }
    #[inline(always)]
    fn tail(self, i: usize) -> f32 {
        self.tail[i]
    }
}

/// [`AddRow`] over f16 factors (their bits) on any SIMD level.
struct AddHalfRow<'a> {
    rank: usize,
    a: &'a [u16],
    b: &'a [u16],
    x: &'a [f32],
    y: &'a mut [f32],
}

impl WithSimd for AddHalfRow<'_> {
    type Output = ();

    #[inline(always)]
    fn with_simd<S: Simd>(self, simd: S) {
        let AddHalfRow { rank, a, b, x, y } = self;
        let (inp, out) = (x.len(), y.len());
        let a = |j: usize| WidenedHalfRow(&a[j * inp..][..inp]);
        let b = |j: usize| WidenedHalfRow(&b[j * out..][..out]);
        add_rank_groups(simd, rank, x, (&a, &b), y);
    }
}

/// A row of f16 factors (their bits) read on any SIMD level: each vector's
/// entries widened one by one (exactly) as it is read, into the same f32
/// values [`F32Row`] would hold. The path of CPUs without AVX-512, where
/// [`half_rows`] widens whole vectors in registers.
#[derive(Clone, Copy)]
struct WidenedHalfRow<'a>(&'a [u16]);

impl<S: Simd> FactorRow<S> for WidenedHalfRow<'_> {
    #[inline(always)]
    fn vector(self, _: S, v: usize) -> S::f32s {
        let lanes = size_of::<S::f32s>() / size_of::<f32>();
        // pulp's widest vector holds 16 f32s.
        let mut wide = [0.0f32; 16];
        for (w, h) in wide.iter_mut().zip(&self.0[v * lanes..][..lanes]) {
            *w = half::f16::from_bits(*h).to_f32();
        }
        S::as_simd_f32s(&wide[..lanes]).0[0]
    }
    #[inline(always)]
    fn tail(self, i: usize) -> f32 {
        let lanes = size_of::<S::f32s>() / size_of::<f32>();
        half::f16::from_bits(self.0[self.0.len() / lanes * lanes + i]).to_f32()
    }
}

#[cfg(target_arch = "x86_64")]
mod half_rows;
mod ranks;

impl AddRow<'_> {
    /// The row update one rank at a time, by `simd::dot` and `simd::axpy`:
    /// the reference `ranks::add_ranks` is tested against.
    #[cfg(test)]
    fn one_rank_at_a_time(self) {
        struct Plain<'a>(AddRow<'a>);
        impl WithSimd for Plain<'_> {
            type Output = ();
            #[inline(always)]
            fn with_simd<S: Simd>(self, simd: S) {
                let AddRow { rank, a, b, x, y } = self.0;
                let (inp, out) = (x.len(), y.len());
                for j in 0..rank {
                    let u = dot(simd, x, &a[j * inp..][..inp]);
                    axpy(simd, u, &b[j * out..][..out], y);
                }
            }
        }
        pulp::Arch::new().dispatch(Plain(self));
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    /// Multiples of 10⁻³ in `[-1, 1]`, scattered over the index by a
    /// multiplicative hash offset by `seed`.
    fn entries(seed: u32) -> impl Fn(usize) -> f32 + Copy {
        move |i| ((i as u64 * 2654435761 + u64::from(seed)) % 2001) as f32 / 1000.0 - 1.0
    }

    /// Three members' `A: [in, r]` and `B: [r, out]`, entries from `f`.
    fn three_members(
        inp: usize,
        out: usize,
        rank: usize,
        f: impl Fn(usize) -> f32,
    ) -> Vec<(Vec<f32>, Vec<f32>)> {
        (0..3)
            .map(|m| {
                let a = (0..inp * rank).map(|i| f(i + 7 * m)).collect();
                let b = (0..rank * out).map(|i| f(i + 13 * m + 5)).collect();
                (a, b)
            })
            .collect()
    }

    /// Rows split over threads (one run of rows per thread) get exactly what
    /// they get one after another on one thread.
    #[test]
    fn rows_in_parallel_equal_rows_in_sequence() {
        let (inp, out, rank) = (600, 500, 4);
        let f = entries(0);
        let site = HostSite::new(inp, out, rank, &three_members(inp, out, rank, f));
        let members = [
            None,
            Some(0),
            Some(1),
            Some(2),
            Some(1),
            None,
            Some(2),
            Some(0),
            Some(0),
        ];
        let rows = members.len();
        assert!(rows * rank * (inp + out) >= PARALLEL_MIN_FLOATS);
        let x: Vec<f32> = (0..rows * inp).map(|i| f(3 * i + 1)).collect();
        let start: Vec<f32> = (0..rows * out).map(|i| f(i + 11)).collect();
        let run = |threads: usize| {
            let pool = rayon::ThreadPoolBuilder::new()
                .num_threads(threads)
                .build()
                .unwrap();
            let mut y = start.clone();
            pool.install(|| site.add(&members, &x, &mut y));
            y
        };
        let (one, three) = (run(1), run(3));
        assert_ne!(one, start);
        assert!(
            one.iter()
                .zip(&three)
                .all(|(a, b)| a.to_bits() == b.to_bits())
        );
    }

    /// Sites that share `x` updated in one pass over the rows get exactly
    /// what each gets from its own pass, on one thread and on three; a site
    /// no member adapts is left untouched.
    #[test]
    fn sites_in_one_pass_equal_each_site_alone() {
        let (inp, rank) = (600, 4);
        let f = entries(0);
        let outs = [500, 130, 70];
        let sites: Vec<HostSite> = outs
            .iter()
            .map(|&out| {
                HostSite::new(
                    inp,
                    out,
                    rank,
                    &three_members(inp, out, rank, |i| f(i + out)),
                )
            })
            .collect();
        let members = [None, Some(0), Some(1), Some(2), Some(1), None, Some(2)];
        let rows = members.len();
        let x: Vec<f32> = (0..rows * inp).map(|i| f(3 * i + 1)).collect();
        let start = |out: usize| -> Vec<f32> { (0..rows * out).map(|i| f(i + 11)).collect() };
        let alone: Vec<Vec<f32>> = sites
            .iter()
            .map(|site| {
                let mut y = start(site.out);
                site.add(&members, &x, &mut y);
                y
            })
            .collect();
        for threads in [1, 3] {
            let pool = rayon::ThreadPoolBuilder::new()
                .num_threads(threads)
                .build()
                .unwrap();
            let mut ys: Vec<Vec<f32>> = outs.iter().chain([&40]).map(|&o| start(o)).collect();
            let factors = [Some(&sites[0]), Some(&sites[1]), Some(&sites[2]), None];
            pool.install(|| {
                let mut views: Vec<&mut [f32]> = ys.iter_mut().map(Vec::as_mut_slice).collect();
                add_shared(&factors, &members, &x, &mut views);
            });
            for (got, want) in ys.iter().zip(&alone) {
                assert!(
                    got.iter()
                        .zip(want)
                        .all(|(a, b)| a.to_bits() == b.to_bits())
                );
            }
            assert_eq!(ys[3], start(40));
            assert_ne!(ys[0], start(500));
        }
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(64))]

        /// Ranks four at a time give the same bits as one at a time (dots
        /// and axpys), tails and ranks past four included.
        #[test]
        fn ranks_four_at_a_time_equal_one_at_a_time(
            inp in 1usize..80,
            out in 1usize..80,
            rank in 1usize..10,
            member in 0usize..3,
            seed in any::<u32>(),
        ) {
            let f = entries(seed);
            let site = HostSite::new(inp, out, rank, &three_members(inp, out, rank, f));
            let x: Vec<f32> = (0..inp).map(|i| f(3 * i + 1)).collect();
            let start: Vec<f32> = (0..out).map(|i| f(i + 11)).collect();
            let (mut fused, mut plain) = (start.clone(), start.clone());
            site.add_row(member, &x, &mut fused);
            let Factors::F32 { a_t, b } = &site.factors else { unreachable!() };
            let (a, b) = site.member(a_t, b, member);
            AddRow { rank, a, b, x: &x, y: &mut plain }.one_rank_at_a_time();
            prop_assert_ne!(&plain, &start);
            prop_assert!(fused.iter().zip(&plain).all(|(a, b)| a.to_bits() == b.to_bits()));
        }

        /// f16 factors give exactly the f32 update over the same (f16)
        /// values: on AVX-512 (whole vectors widened in registers) and on
        /// any SIMD level (entries widened as read) alike.
        #[test]
        fn f16_factors_equal_f32_factors_of_their_values(
            inp in 1usize..80,
            out in 1usize..80,
            rank in 1usize..10,
            member in 0usize..3,
            seed in any::<u32>(),
        ) {
            let f = |i: usize| {
                half::f16::from_f32(entries(seed)(i) / 7.0).to_f32()
            };
            let factors = three_members(inp, out, rank, f);
            let (single, half) = (
                HostSite::new(inp, out, rank, &factors),
                HostSite::new_f16(inp, out, rank, &factors),
            );
            prop_assert_eq!(2 * half.bytes(), single.bytes());
            let x: Vec<f32> = (0..inp).map(|i| f(3 * i + 1) * 3.3).collect();
            let start: Vec<f32> = (0..out).map(|i| f(i + 11)).collect();
            let (mut want, mut got, mut widened) = (start.clone(), start.clone(), start.clone());
            single.add_row(member, &x, &mut want);
            half.add_row(member, &x, &mut got);
            let Factors::F16 { a_t, b } = &half.factors else { unreachable!() };
            let (a, b) = half.member(a_t, b, member);
            pulp::Arch::new().dispatch(AddHalfRow { rank, a, b, x: &x, y: &mut widened });
            prop_assert_ne!(&want, &start);
            for y in [&got, &widened] {
                prop_assert!(y.iter().zip(&want).all(|(a, b)| a.to_bits() == b.to_bits()));
            }
        }

        /// Each row gets its own member's `(x A) B`, computed in f64 here,
        /// within f32 rounding; rows without a member are untouched.
        #[test]
        fn adds_each_rows_members_update(
            inp in 1usize..70,
            out in 1usize..70,
            rank in 1usize..5,
            members in prop::collection::vec(prop::option::of(0usize..3), 1..5),
            seq in 1usize..3,
            seed in any::<u32>(),
        ) {
            let f = entries(seed);
            let factors = three_members(inp, out, rank, f);
            let site = HostSite::new(inp, out, rank, &factors);
            let rows = members.len() * seq;
            let x: Vec<f32> = (0..rows * inp).map(|i| f(3 * i + 1)).collect();
            let start: Vec<f32> = (0..rows * out).map(|i| f(i + 11)).collect();
            let mut y = start.clone();
            site.add(&members, &x, &mut y);
            // Each output is two f32 dot products deep: within
            // (in + r + 2)·2⁻²³ of the sum of the absolute terms.
            let u32 = f64::from(f32::EPSILON);
            for r in 0..rows {
                for o in 0..out {
                    let s0 = f64::from(start[r * out + o]);
                    let (want, bound) = match members[r / seq] {
                        None => (s0, 0.0),
                        Some(m) => {
                            let (a, b) = &factors[m];
                            let (mut w, mut abs) = (s0, s0.abs());
                            for j in 0..rank {
                                let (mut u, mut ua) = (0.0f64, 0.0f64);
                                for c in 0..inp {
                                    let t = f64::from(x[r * inp + c]) * f64::from(a[c * rank + j]);
                                    u += t;
                                    ua += t.abs();
                                }
                                w += u * f64::from(b[j * out + o]);
                                abs += ua * f64::from(b[j * out + o]).abs();
                            }
                            (w, (inp + rank + 2) as f64 * u32 * abs)
                        }
                    };
                    let got = f64::from(y[r * out + o]);
                    prop_assert!((got - want).abs() <= bound, "{} vs {} (bound {})", got, want, bound);
                }
            }
        }
    }
}
