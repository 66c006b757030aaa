//! AdaPMixED's individual Rényi filter and the data-independent account of a run.
//!
//! Each member keeps its own running loss at every tracked order β and leaves for good
//! (its slot then holds p₀) once a sub-step's loss would take it over the budget `B(β)`:
//! the individual filter of Feldman & Zrnic ("Individual Privacy Accounting via a Rényi
//! Filter", arXiv:2008.11193, Thm 3.1), which bounds the run against the corpus `W` whose
//! changed member is the public model. After t queries the run is within
//! `G_t(β) = min(B(β), t·ρmax(β))` of `W` at every tracked β (`ρmax` one query's worst
//! loss, whatever the screening decides); a changed member costs, by Mironov's weak
//! triangle inequality ("Rényi Differential Privacy", arXiv:1702.07476, Prop. 11),
//!
//! `U_t(α) = min_p (α − 1/p)/(α − 1)·G_t(pα) + G_t((pα − 1)/(p − 1))`,
//!
//! and query t charges `U_t − U_{t−1}` (rounded up) before it reads any member, so the
//! account holds `U_t`, a function of t, N and the configuration only. The argument is
//! written out in `proof.md` beside this file (`src/adapmixed/proof.md`).

use privmix_accountant::{Orders, RdpCurve};

use crate::pmixed::bounds::{averaging_slack, mixture_bound_up, second_order_bound_up};
use crate::{Account, MechanismError};
use privmix_renyi::round::{
    add_up, div_down, div_up, mul_up, sub_down, sub_up, u64_up, usize_down,
};

/// The values of p tried in the weak triangle inequality.
const TRIANGLE_P: [f64; 24] = [
    1.02, 1.05, 1.1, 1.15, 1.2, 1.3, 1.4, 1.5, 1.6, 1.75, 1.9, 2.0, 2.25, 2.5, 2.75, 3.0, 3.5, 4.0,
    5.0, 6.0, 8.0, 10.0, 16.0, 32.0,
];

/// A bound at the tracked orders, read at any order: the value at the smallest tracked
/// order ≥ `order`, +∞ above them all.
fn at_or_above(tracked: &[f64], values: &[f64], order: f64) -> f64 {
    let i = tracked.partition_point(|&t| t < order);
    values.get(i).copied().unwrap_or(f64::INFINITY)
}

/// `min_p (α − 1/p)/(α − 1)·g(pα) + g((pα − 1)/(p − 1))`, rounded up, for a bound `g`
/// at the tracked orders (`proof.md`, "From W to a changed member"): the changed-member RDP at α of a run within `g`
/// of the emptied-member corpus in both directions.
pub fn changed_member_epsilon(tracked: &[f64], g: &[f64], alpha: f64) -> f64 {
    if g.iter().all(|&x| x == 0.0) {
        return 0.0;
    }
    let am1 = sub_down(alpha, 1.0);
    let mut best = f64::INFINITY;
    for &p in &TRIANGLE_P {
        // Looking a bound up at a higher order than the exact one is conservative.
        let first_order = mul_up(p, alpha);
        let second_order = div_up(sub_up(first_order, 1.0), sub_down(p, 1.0));
        let coefficient = div_up(sub_up(alpha, div_down(1.0, p)), am1);
        let a = at_or_above(tracked, g, first_order);
        let b = at_or_above(tracked, g, second_order);
        if a.is_finite() && b.is_finite() {
            best = best.min(add_up(mul_up(coefficient, a), b));
        }
    }
    best
}

/// The per-member filter of one AdaPMixED run: each member's spent loss and whether it
/// is still active, and the run's data-independent schedule of charges.
///
/// The schedule: after t queries the run is within `G_t(β) = min(B(β), t·ρmax(β))` of
/// the emptied-member corpus at every tracked β, `ρmax` one query's worst loss
/// (screening plus a private answer, whatever the screening decides), and the account
/// holds `U_t`, the changed-member conversion of `G_t`. Query t's charge `U_t − U_{t−1}`
/// is a function of t, N and the configuration only, and is taken *before* the query
/// reads any member ([`MemberFilter::charge_next_query`]); a refused charge changes
/// nothing here (`proof.md`, "What is charged").
#[derive(Debug, Clone, PartialEq)]
pub struct MemberFilter {
    tracked: Vec<f64>,
    budget: Option<Vec<f64>>,
    spent: Vec<Vec<f64>>,
    active: Vec<bool>,
    worst_query: Vec<f64>,
    queries: u64,
    charged: Option<(Orders, Vec<f64>)>,
}

impl MemberFilter {
    /// A fresh filter for `members` members at the `tracked` orders (increasing), with a
    /// budget per tracked order (`None`: no filter, members never leave), and one
    /// query's worst loss `worst_query` at the tracked orders (every member's loss in
    /// one query, screening and private answer together, is at most it).
    pub fn new(
        members: usize,
        tracked: Vec<f64>,
        budget: Option<Vec<f64>>,
        worst_query: Vec<f64>,
    ) -> Self {
        let k = tracked.len();
        Self {
            tracked,
            budget,
            spent: vec![vec![0.0; k]; members],
            active: vec![true; members],
            worst_query,
            queries: 0,
            charged: None,
        }
    }

    /// The number of members the filter was made for.
    pub fn members(&self) -> usize {
        self.active.len()
    }

    /// The number of queries whose charge the account accepted.
    pub fn queries(&self) -> u64 {
        self.queries
    }

    /// Whether each member is still active (for audits; this is private state and must
    /// not be published).
    pub fn active(&self) -> &[bool] {
        &self.active
    }

    /// Offers member `i` a loss (one value per tracked order): if it fits the budget the
    /// member pays it and stays (true); else it leaves for good (false). Inactive
    /// members stay out.
    pub fn admit(&mut self, i: usize, loss: &[f64]) -> bool {
        if !self.active[i] {
            return false;
        }
        let after: Vec<f64> = self.spent[i]
            .iter()
            .zip(loss)
            .map(|(&s, &l)| add_up(s, l))
            .collect();
        let fits = match &self.budget {
            None => true,
            Some(b) => after.iter().zip(b).all(|(a, b)| a <= b),
        };
        if fits {
            self.spent[i] = after;
        } else {
            self.active[i] = false;
        }
        fits
    }

    /// `G_t` at the tracked orders after `queries` queries: `min(B, t·ρmax)`, rounded
    /// up. A function of t and the configuration only.
    pub fn bound_after(&self, queries: u64) -> Vec<f64> {
        let t = u64_up(queries);
        let worst = self.worst_query.iter().map(|&w| mul_up(t, w));
        match &self.budget {
            None => worst.collect(),
            Some(b) => worst.zip(b).map(|(w, &b)| w.min(b)).collect(),
        }
    }

    /// `G_t` after the queries charged so far.
    pub fn bound(&self) -> Vec<f64> {
        self.bound_after(self.queries)
    }

    /// The charge that brings the account from `U_{t−1}` to `U_t` at `orders` for the
    /// next query t: `U_t − U_{t−1}` rounded up (+∞ at an order the first time `U` is
    /// +∞ there, then 0), and the `U_t` it brings the account to. Changes nothing.
    pub fn next_charge(&self, orders: &Orders) -> Result<(RdpCurve, Vec<f64>), MechanismError> {
        let g = self.bound_after(self.queries.saturating_add(1));
        let now: Vec<f64> = orders
            .as_slice()
            .iter()
            .map(|&a| changed_member_epsilon(&self.tracked, &g, a))
            .collect();
        let before = match &self.charged {
            Some((o, v)) if o == orders => v.clone(),
            // Nothing charged yet at these orders: the whole `U_t`.
            _ => vec![0.0; orders.len()],
        };
        let step: Vec<f64> = now
            .iter()
            .zip(&before)
            .map(|(&n, &b)| {
                if b == f64::INFINITY {
                    0.0
                } else if n == f64::INFINITY {
                    n
                } else {
                    sub_up(n, b).max(0.0)
                }
            })
            .collect();
        Ok((RdpCurve::new(orders.clone(), step)?, now))
    }

    /// Charges `account` the next query's step of the schedule
    /// ([`MemberFilter::next_charge`]) before anything of the query is computed. Only
    /// once the account has accepted it does the filter count the query; a refusal
    /// returns the account's error and leaves the filter as it was.
    pub fn charge_next_query(
        &mut self,
        account: &mut dyn Account,
        label: &str,
    ) -> Result<RdpCurve, MechanismError> {
        let (step, now) = self.next_charge(account.orders())?;
        account.charge(&step, label)?;
        self.charged = Some((account.orders().clone(), now));
        self.queries = self.queries.saturating_add(1);
        Ok(step)
    }
}

/// The private answer's loss of a member within `d` of p₀ (at α_c), among `members`
/// whose slots are all within `radius` of p₀, at each tracked order β (`proof.md`,
/// "Per-step losses against W"): the smaller of the joint-convexity bound
/// `ln(1 + (e^{(β−1)d} − 1)/N)/(β − 1)` and the one-sided second-order bound
/// ([`second_order_bound_up`], `../pmixed/proof.md`), plus the f64 averaging slack
/// [`averaging_slack`]`(β, N)` of the N slots' average (`../pmixed/proof.md`,
/// "Rounding"), rounded up. Never above the loss at `d = radius`, so every member's
/// loss is at most the worst one. `d` is rounded up to a multiple of `radius/64` for
/// the second-order bound (a member within d is within any larger radius), which keeps
/// the number of distinct moment bounds per run at 64.
pub fn private_loss(
    tracked: &[f64],
    d: f64,
    radius: f64,
    alpha_c: f64,
    members: usize,
) -> Vec<f64> {
    let worst = private_loss_at(tracked, radius, radius, alpha_c, members);
    if d >= radius {
        return worst;
    }
    let steps = if radius > 0.0 {
        mul_up(64.0, div_up(d, radius)).ceil()
    } else {
        64.0
    };
    let quantised = if steps >= 64.0 {
        radius
    } else {
        mul_up(radius, steps / 64.0).min(radius)
    };
    let n = members.max(1);
    let w = div_up(1.0, usize_down(n)).min(1.0);
    tracked
        .iter()
        .zip(&worst)
        .map(|(&b, &at_radius)| {
            let first = mixture_bound_up(b, d, w);
            let second = second_order_bound_up(b, alpha_c, quantised, radius, w, true);
            add_up(first.min(second), averaging_slack(b, n as u64)).min(at_radius)
        })
        .collect()
}

/// [`private_loss`] without the cap at the worst member and without quantising `d`.
fn private_loss_at(tracked: &[f64], d: f64, radius: f64, alpha_c: f64, members: usize) -> Vec<f64> {
    let n = members.max(1);
    let w = div_up(1.0, usize_down(n)).min(1.0);
    tracked
        .iter()
        .map(|&b| {
            let first = mixture_bound_up(b, d, w);
            let second = second_order_bound_up(b, alpha_c, d, radius, w, true);
            add_up(first.min(second), averaging_slack(b, n as u64))
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_triangle_picks_the_best_split_and_needs_higher_orders() {
        let tracked = [2.0, 4.0, 8.0, 16.0];
        let g = [0.1, 0.2, 0.4, 0.8];
        // α = 2, p = 2: (2 − 1/2)/1·g(4) + g(3 → 4) = 1.5·0.2 + 0.2 = 0.5 at most.
        let e = changed_member_epsilon(&tracked, &g, 2.0);
        assert!(e > 0.0 && e <= 0.5 + 1e-12, "{e}");
        // Above what the tracked orders reach: +∞.
        assert_eq!(changed_member_epsilon(&tracked, &g, 16.0), f64::INFINITY);
        assert_eq!(changed_member_epsilon(&tracked, &[0.0; 4], 16.0), 0.0);
    }

    #[test]
    fn the_private_loss_is_at_most_the_first_order_bound_plus_the_slack() {
        let tracked = [1.5, 2.0, 8.0, 18.0];
        let (alpha_c, radius) = (40.0, 0.5);
        for (d, n) in [(0.5, 10usize), (1e-3, 1), (0.0, 100), (0.2, 16)] {
            let loss = private_loss(&tracked, d, radius, alpha_c, n);
            let worst = private_loss(&tracked, radius, radius, alpha_c, n);
            for ((&b, &l), &top) in tracked.iter().zip(&loss).zip(&worst) {
                let w = div_up(1.0, usize_down(n));
                let slack = averaging_slack(b, n as u64);
                assert!(l <= add_up(mixture_bound_up(b, d, w), slack), "{b} {d} {n}");
                assert!(l >= slack && l <= top, "{b} {d} {n}: {l} {top}");
                assert!(slack > 0.0 && slack < 1e-8);
            }
        }
        // Many members: the second-order bound is far below the first-order one.
        let loss = private_loss(&[2.0], 0.1, 0.1, 36.0, 16);
        let first = mixture_bound_up(2.0, 0.1, 1.0 / 16.0);
        assert!(loss[0] < first / 10.0, "{} vs {first}", loss[0]);
    }

    #[test]
    fn the_filter_drops_a_member_that_would_overspend_and_charges_the_schedule() {
        let tracked = vec![2.0, 4.0];
        let worst = vec![0.6, 0.6];
        let mut f = MemberFilter::new(2, tracked.clone(), Some(vec![1.0, 2.0]), worst);
        assert!(f.admit(0, &[0.6, 0.6]));
        assert!(!f.admit(0, &[0.6, 0.6]));
        assert!(!f.admit(0, &[0.0, 0.0]), "a member that left stays out");
        assert!(f.admit(1, &[0.6, 0.6]));
        assert_eq!(f.active(), &[false, true]);
        let orders = Orders::new(vec![1.5, 2.0]).unwrap();
        let mut account = crate::Unbudgeted::new(orders.clone());
        let c1 = f.charge_next_query(&mut account, "t").unwrap();
        let c2 = f.charge_next_query(&mut account, "t").unwrap();
        // G is capped by B: (1.0, 1.2) after two queries, whatever the members did.
        let g = f.bound();
        assert_eq!(g[0], 1.0);
        assert!(g[1] >= 1.2 && g[1] < 1.2 + 1e-14, "{g:?}");
        let total = c1.compose(&c2).unwrap();
        let u = changed_member_epsilon(&tracked, &f.bound(), 1.5);
        assert!(total.at(1.5).unwrap() >= u);
    }

    /// Issue 39 §2: a refused charge recorded nothing in the account but advanced
    /// what the filter had charged, so the next accepted charge was short.
    #[test]
    fn a_refused_charge_leaves_the_filter_as_it_was() {
        let tracked = vec![2.0, 4.0];
        let mut f = MemberFilter::new(3, tracked, Some(vec![5.0, 5.0]), vec![0.5, 0.5]);
        let orders = Orders::new(vec![1.5, 2.0]).unwrap();
        let before = f.clone();
        let mut tiny = privmix_accountant::Budget::new(orders.clone(), 1e-9, 1e-5).unwrap();
        for _ in 0..3 {
            assert!(matches!(
                f.charge_next_query(&mut tiny, "t"),
                Err(MechanismError::ChargeRefused(_))
            ));
            assert_eq!(f, before);
        }
        let mut account = crate::Unbudgeted::new(orders.clone());
        let first = f.charge_next_query(&mut account, "t").unwrap();
        let (fresh, _) = before.next_charge(&orders).unwrap();
        assert_eq!(first, fresh);
        assert_eq!(f.queries(), 1);
    }

    #[test]
    fn the_schedule_depends_on_the_query_count_only() {
        let tracked = vec![2.0, 4.0];
        let worst = vec![0.3, 0.4];
        let orders = Orders::new(vec![1.5, 2.0]).unwrap();
        let mut a = MemberFilter::new(2, tracked.clone(), Some(vec![1.0, 1.0]), worst.clone());
        let mut b = MemberFilter::new(2, tracked, Some(vec![1.0, 1.0]), worst);
        // Different members leave in a and b; the charges are the same.
        assert!(!a.admit(0, &[2.0, 2.0]));
        assert!(b.admit(1, &[0.1, 0.1]));
        let (mut acc_a, mut acc_b) = (
            crate::Unbudgeted::new(orders.clone()),
            crate::Unbudgeted::new(orders.clone()),
        );
        for _ in 0..6 {
            assert_eq!(
                a.charge_next_query(&mut acc_a, "t").unwrap(),
                b.charge_next_query(&mut acc_b, "t").unwrap()
            );
        }
        // After the cap, nothing more is charged.
        assert!(
            a.charge_next_query(&mut acc_a, "t")
                .unwrap()
                .epsilons()
                .iter()
                .all(|&x| x == 0.0)
        );
    }
}
