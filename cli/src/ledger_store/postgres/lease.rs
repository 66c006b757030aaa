//! Budget leases: a replica reserves a slice of the budget in one transaction and
//! spends it locally, so that replicas do not queue on the ledger's lock at every step.
//!
//! # Guarantee
//!
//! A reservation is recorded exactly as a charge is (`charge.rs`): under the ledger's
//! lock, composed onto the total's and the tenant's spending and checked against both
//! budgets, a row naming its lease. It is durable before any charge is spent from it.
//! A charge is spent from a lease only when the lease's used curve composed with it
//! (`RdpCurve::compose`, rounded up; Mironov, arXiv:1702.07476, Prop. 1) stays at or
//! below the reserved curve at every order. Everyone's true spending is then at most
//! the recorded spending, order by order, and the (ε, δ) conversion (Balle et al.,
//! arXiv:1905.09982, Thm 21) only grows with the curve, so the recorded ε bounds the
//! true ε: the budgets hold for what was released.
//!
//! A lease of one tenant (or of requests without a tenant) is reserved `per_reservation`
//! charges of the cost that needed it at a time (halved down to one when a budget
//! cannot pay more), and renewed when a charge no longer fits. What a lease did not
//! spend stays counted while it is open: a replica that crashes loses it, an
//! over-count, never an under-count.
//!
//! A clean stop (`Leases::close`) gives the unspent part back: in one serializable
//! transaction under the ledger's lock, each open lease gets a release record
//! (`RELEASE_LABEL`, naming the lease) holding `unspent` (reserved − used per
//! order, rounded down), the total's and tenant's spending become `give_back` of it
//! (the difference rounded up), and the lease's reserved curve becomes its used one.
//! Since the used curve covers every charge released from the lease and the spending
//! drops by at most the unspent part, the recorded spending after still bounds
//! everything released. `ledger verify` replays both functions bit for bit.
//!
//! Each step commit writes the leases' use (used curve and charges) to their rows in one
//! short transaction on the replica's own rows, without the ledger's lock, before the
//! step's tokens are released; `ledger show` and `ledger verify` report it. That
//! transaction does not wait for its commit record to reach the disk
//! (`synchronous_commit = off` for it alone): what pays for the step's tokens is the
//! reservation, which was flushed before any of them could be spent, so a server crash
//! that loses the last use written can make a lease show less use than its replica
//! released, never make the ledger count less than was spent.

use std::collections::{BTreeMap, HashMap};

use privmix_accountant::{Orders, PrivacyBudget, RdpCurve};

use super::charge::{Prepared, commit_charges};
use super::codec::{RELEASE_LABEL, curve_of};
use super::connection::Connection;
use super::error::{Fail, pg, postgres_error};
use super::retry::serializable;
use crate::ledger_store::step::{Cost, PendingCharge};
use crate::ledger_store::{StepOutcomes, StoreError};

/// The label of a reservation's charge row.
pub(super) const LEASE_LABEL: &str = "lease";

/// What a lease that reserved `reserved` and used `used` gives back on closing:
/// `reserved − used` at each order, rounded down (never below 0), so that it never
/// exceeds the true unspent part.
pub(crate) fn unspent(reserved: &RdpCurve, used: &RdpCurve) -> Result<RdpCurve, StoreError> {
    let values = reserved
        .epsilons()
        .iter()
        .zip(used.epsilons())
        .map(|(&r, &u)| {
            let d = r - u;
            if d > 0.0 { d.next_down().max(0.0) } else { 0.0 }
        })
        .collect();
    Ok(RdpCurve::new(reserved.orders().clone(), values)?)
}

/// `spent` less a released `unspent` part: `spent − unspent` at each order, rounded
/// up (never below 0), so that the recorded spending after never falls below the
/// true one.
pub(crate) fn give_back(spent: &RdpCurve, unspent: &RdpCurve) -> Result<RdpCurve, StoreError> {
    let values = spent
        .epsilons()
        .iter()
        .zip(unspent.epsilons())
        .map(|(&s, &g)| {
            if g <= 0.0 {
                s
            } else {
                (s - g).next_up().max(0.0)
            }
        })
        .collect();
    Ok(RdpCurve::new(spent.orders().clone(), values)?)
}

/// The leases one store handle (one replica) holds.
pub(super) struct Leases {
    /// The name its lease rows carry.
    replica: String,
    /// How many charges of a cost one reservation asks for.
    per_reservation: u64,
    /// By tenant (`None`: requests without a tenant).
    held: BTreeMap<Option<String>, Held>,
}

/// One lease: what it reserved and what it spent.
struct Held {
    id: i64,
    reserved: RdpCurve,
    used: RdpCurve,
    charges: i64,
    /// Its use changed since it was last written.
    dirty: bool,
}

/// `a` at or below `b` at every order.
fn at_most(a: &RdpCurve, b: &RdpCurve) -> bool {
    a.epsilons().iter().zip(b.epsilons()).all(|(x, y)| x <= y)
}

impl Leases {
    /// Leases of `per_reservation` charges (at least 1), on rows named `replica`.
    pub(super) fn new(replica: String, per_reservation: u64) -> Result<Self, StoreError> {
        if per_reservation == 0 {
            return Err(StoreError::BadLease {
                reason: "a lease must reserve at least 1 charge".into(),
            });
        }
        Ok(Self {
            replica,
            per_reservation,
            held: BTreeMap::new(),
        })
    }

    /// A step commit spent from the leases: each charge in order, renewing a lease it
    /// no longer fits, a charge no renewal can pay refused; then the use written.
    /// Returns the outcomes and the total budget last read (when a lease was renewed).
    pub(super) fn commit(
        &mut self,
        conn: &mut Connection,
        orders: &Orders,
        cost_ids: &mut HashMap<Vec<u8>, i64>,
        prepared: &[Prepared<'_>],
    ) -> Result<(StepOutcomes, Option<Option<PrivacyBudget>>), StoreError> {
        let mut outcomes = Vec::with_capacity(prepared.len());
        let mut budget = None;
        for p in prepared {
            let key = p.tenant().map(str::to_owned);
            let fits = |h: &Held| -> Result<bool, StoreError> {
                Ok(at_most(&h.used.compose(&p.curve)?, &h.reserved))
            };
            let fit = match self.held.get(&key) {
                Some(h) => fits(h)?,
                None => false,
            };
            if !fit {
                match self.renew(conn, orders, cost_ids, p) {
                    Ok(b) => budget = Some(b),
                    Err(e @ StoreError::Refused { .. }) => {
                        outcomes.push(Err(e));
                        continue;
                    }
                    Err(e) => return Err(e),
                }
            }
            let h = self
                .held
                .get_mut(&key)
                .ok_or_else(|| StoreError::Backend("a renewed lease is not held".into()))?;
            let used = h.used.compose(&p.curve)?;
            if !at_most(&used, &h.reserved) {
                return Err(StoreError::Backend(
                    "a charge does not fit the lease just renewed for it".into(),
                ));
            }
            h.used = used;
            h.charges += 1;
            h.dirty = true;
            outcomes.push(Ok(()));
        }
        self.write_use(conn)?;
        Ok((outcomes, budget))
    }

    /// Reserves more for `p`'s lease: `per_reservation` charges of its cost, halved
    /// while a budget refuses, in one serializable transaction each try.
    fn renew(
        &mut self,
        conn: &mut Connection,
        orders: &Orders,
        cost_ids: &mut HashMap<Vec<u8>, i64>,
        p: &Prepared<'_>,
    ) -> Result<Option<PrivacyBudget>, StoreError> {
        let key = p.tenant().map(str::to_owned);
        let describe = conn.describe.clone();
        let zero = RdpCurve::zero(orders.clone());
        let (held_id, reserved) = match self.held.get(&key) {
            Some(h) => (Some(h.id), h.reserved.clone()),
            None => (None, zero.clone()),
        };
        let mut n = self.per_reservation;
        loop {
            let mut slice = zero.clone();
            for _ in 0..n {
                slice = slice.compose(&p.curve)?;
            }
            let after = reserved.compose(&slice)?;
            let charge = PendingCharge {
                tenant: p.charge.tenant.clone(),
                cost: Cost::Curve(slice),
                label: LEASE_LABEL.into(),
            };
            let mut reservation = Prepared::new(&charge, orders)?;
            let replica = &self.replica;
            let known = &*cost_ids;
            let tried = serializable(conn, |tx| {
                let id: i64 = match held_id {
                    Some(id) => id,
                    None => tx
                        .query_one(
                            "INSERT INTO privmix_leases
                                 (replica, tenant, reserved, used, charges, opened_at, updated_at)
                             VALUES ($1, $2, $3, $3, 0, clock_timestamp(), clock_timestamp())
                             RETURNING id",
                            &[replica, &key, &zero.epsilons()],
                        )
                        .map_err(pg("opening a lease"))?
                        .get(0),
                };
                reservation.lease = Some(id);
                let committed = commit_charges(
                    tx,
                    orders,
                    &describe,
                    std::slice::from_ref(&reservation),
                    known,
                )?;
                if let Some(Err(_)) = committed.outcomes.first() {
                    let refused = committed.outcomes.into_iter().next();
                    return Err(Fail::Store(match refused {
                        Some(Err(e)) => e,
                        _ => StoreError::Backend("a refusal went missing".into()),
                    }));
                }
                tx.execute(
                    "UPDATE privmix_leases SET reserved = $2, updated_at = clock_timestamp()
                     WHERE id = $1",
                    &[&id, &after.epsilons()],
                )
                .map_err(pg("recording a lease"))?;
                Ok((id, committed.new_costs, committed.budget))
            });
            match tried {
                Ok((id, new_costs, budget)) => {
                    cost_ids.extend(new_costs);
                    let h = self.held.entry(key).or_insert_with(|| Held {
                        id,
                        reserved: zero.clone(),
                        used: zero.clone(),
                        charges: 0,
                        dirty: false,
                    });
                    h.reserved = after;
                    return Ok(budget);
                }
                Err(StoreError::Refused { .. }) if n > 1 => n /= 2,
                Err(e) => return Err(e),
            }
        }
    }

    /// A clean stop: closes every lease held, giving back what it did not spend (see
    /// the module docs), in one serializable transaction. The leases are dropped
    /// whatever the outcome: a failed close leaves them counted, never spent twice.
    pub(super) fn close(
        &mut self,
        conn: &mut Connection,
        orders: &Orders,
    ) -> Result<(), StoreError> {
        let held = std::mem::take(&mut self.held);
        if held.is_empty() {
            return Ok(());
        }
        let describe = conn.describe.clone();
        let releases = held
            .iter()
            .map(|(tenant, h)| Ok((tenant.clone(), h, unspent(&h.reserved, &h.used)?)))
            .collect::<Result<Vec<_>, StoreError>>()?;
        serializable(conn, |tx| {
            let row = tx
                .query_one("SELECT next_sequence FROM privmix_ledger FOR UPDATE", &[])
                .map_err(pg("locking the ledger"))?;
            let mut sequence: i64 = row.get(0);
            for (tenant, h, unspent) in &releases {
                let keys: Vec<&str> = std::iter::once(super::schema::TOTAL_KEY)
                    .chain(tenant.as_deref())
                    .collect();
                for key in keys {
                    let row = tx
                        .query_one(
                            "SELECT curve FROM privmix_spent WHERE tenant = $1 FOR UPDATE",
                            &[&key],
                        )
                        .map_err(pg("reading the spending a lease gives back to"))?;
                    let spent = curve_of(orders, row.get(0), &describe)?;
                    let after = give_back(&spent, unspent)?;
                    tx.execute(
                        "UPDATE privmix_spent SET curve = $2 WHERE tenant = $1",
                        &[&key, &after.epsilons()],
                    )
                    .map_err(pg("giving back a lease's unspent part"))?;
                }
                tx.execute(
                    "INSERT INTO privmix_charges (sequence, tenant, label, curve, count, lease, at)
                     VALUES ($1, $2, $3, $4, 1, $5, clock_timestamp())",
                    &[
                        &sequence,
                        tenant,
                        &RELEASE_LABEL,
                        &unspent.epsilons(),
                        &h.id,
                    ],
                )
                .map_err(pg("recording a lease's release"))?;
                sequence += 1;
                tx.execute(
                    "UPDATE privmix_leases SET reserved = $2, used = $2, charges = $3,
                         updated_at = clock_timestamp() WHERE id = $1",
                    &[&h.id, &h.used.epsilons(), &h.charges],
                )
                .map_err(pg("closing a lease"))?;
            }
            tx.execute("UPDATE privmix_ledger SET next_sequence = $1", &[&sequence])
                .map_err(pg("closing the leases"))?;
            Ok(())
        })
    }

    /// Writes the use of every lease it changed, in one transaction.
    fn write_use(&mut self, conn: &mut Connection) -> Result<(), StoreError> {
        if !self.held.values().any(|h| h.dirty) {
            return Ok(());
        }
        let describe = conn.describe.clone();
        let client = conn.client()?;
        let written = (|| -> Result<(), postgres::Error> {
            let mut tx = client.transaction()?;
            tx.batch_execute("SET LOCAL synchronous_commit = off")?;
            for h in self.held.values().filter(|h| h.dirty) {
                tx.execute(
                    "UPDATE privmix_leases SET used = $2, charges = $3,
                         updated_at = clock_timestamp() WHERE id = $1",
                    &[&h.id, &h.used.epsilons(), &h.charges],
                )?;
            }
            tx.commit()
        })();
        written.map_err(|e| postgres_error(&describe, "recording the leases' use", e))?;
        for h in self.held.values_mut() {
            h.dirty = false;
        }
        Ok(())
    }
}
