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
//! cannot pay more). It is renewed ahead of need: once fewer than half a reservation's
//! charges are left in it, a thread of the replica's own, on a second connection,
//! reserves the next `per_reservation` while the steps go on spending what is left,
//! and a step takes the new reservation into the lease once its transaction has
//! committed. A step waits on a reservation only when a charge does not fit what the
//! lease holds: the first one, one after a renewal ahead was refused (near a budget,
//! where reservations halve), or when the steps outrun the renewal. The reserved curve
//! a step spends against only ever holds reservations whose transactions returned, so
//! the guarantee above is unchanged; a reservation under way when the replica crashes
//! is counted and never spent, an over-count. What a lease did not spend stays counted
//! while it is open: a replica that crashes loses it (up to one and a half
//! reservations), an over-count, never an under-count.
//!
//! A clean stop (`Leases::close`) first waits for a renewal under way (so that what it
//! reserved is given back too) and stops the renewal thread; then it gives the unspent
//! part back: in one serializable
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
use std::sync::mpsc;

use privmix_accountant::{Orders, PrivacyBudget, RdpCurve};

use super::charge::{Prepared, commit_charges};
use super::codec::{RELEASE_LABEL, curve_of};
use super::connection::Connection;
use super::error::{Fail, pg, postgres_error};
use super::retry::serializable;
use crate::ledger_store::step::{Cost, PendingCharge};
use crate::ledger_store::{StepOutcomes, StoreError, Tenant};

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
    /// The renewals made ahead of need, once one was asked for.
    ahead: Option<Ahead>,
    /// The total budget last read by a reservation not yet reported.
    budget_read: Option<Option<PrivacyBudget>>,
    /// How many times a step waited on a reservation (made it, or waited for one made
    /// ahead).
    waited: u64,
}

/// One lease: what it reserved and what it spent.
struct Held {
    id: i64,
    reserved: RdpCurve,
    used: RdpCurve,
    charges: i64,
    /// Its use changed since it was last written.
    dirty: bool,
    /// A renewal ahead of need is under way.
    renewing: bool,
    /// A renewal ahead of need was refused (a budget is near): the next renewal is made
    /// when needed, halving, as [`Leases::commit`] does.
    ahead_refused: bool,
}

/// A reservation to make: `per_reservation` charges of `curve` (halved while a budget
/// refuses) for the lease of `key`, whose reserved curve is `reserved` (`lease`:
/// its id, `None` for a new lease).
struct Renewal {
    key: Option<String>,
    tenant: Option<Tenant>,
    curve: RdpCurve,
    lease: Option<i64>,
    reserved: RdpCurve,
}

/// A reservation made: the lease's id and reserved curve after it.
struct Renewed {
    id: i64,
    reserved: RdpCurve,
    new_costs: Vec<(Vec<u8>, i64)>,
    budget: Option<PrivacyBudget>,
}

/// The thread that makes reservations ahead of need on its own connection, one at a
/// time in the order asked.
struct Ahead {
    requests: Option<mpsc::Sender<Renewal>>,
    results: mpsc::Receiver<(Renewal, Result<Renewed, StoreError>)>,
    thread: Option<std::thread::JoinHandle<()>>,
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
            ahead: None,
            budget_read: None,
            waited: 0,
        })
    }

    /// How many times a step commit waited on a reservation.
    #[cfg(test)]
    pub(super) fn waited(&self) -> u64 {
        self.waited
    }

    /// Waits for the renewals under way and takes them in, outside any step.
    #[cfg(test)]
    pub(super) fn settle(&mut self) -> Result<(), StoreError> {
        self.take_renewals(&mut HashMap::new(), true)
    }

    /// A step commit spent from the leases: each charge in order, renewing a lease it
    /// no longer fits (taking the renewal made ahead when one is under way), a charge
    /// no renewal can pay refused; then the use written, and a renewal asked for ahead
    /// of need for each lease with less than half a reservation left. Returns the
    /// outcomes and the total budget last read (when a lease was renewed).
    pub(super) fn commit(
        &mut self,
        conn: &mut Connection,
        orders: &Orders,
        cost_ids: &mut HashMap<Vec<u8>, i64>,
        prepared: &[Prepared<'_>],
    ) -> Result<(StepOutcomes, Option<Option<PrivacyBudget>>), StoreError> {
        self.take_renewals(cost_ids, false)?;
        let mut outcomes = Vec::with_capacity(prepared.len());
        for p in prepared {
            let key = p.tenant().map(str::to_owned);
            let fits = |h: &Held| -> Result<bool, StoreError> {
                Ok(at_most(&h.used.compose(&p.curve)?, &h.reserved))
            };
            let mut fit = match self.held.get(&key) {
                Some(h) => fits(h)?,
                None => false,
            };
            if !fit && self.held.get(&key).is_some_and(|h| h.renewing) {
                self.waited += 1;
                self.take_renewals(cost_ids, true)?;
                fit = match self.held.get(&key) {
                    Some(h) => fits(h)?,
                    None => false,
                };
            }
            if !fit {
                self.waited += 1;
                let renewal = self.renewal_for(&key, p);
                match reserve(
                    conn,
                    orders,
                    cost_ids,
                    &self.replica,
                    self.per_reservation,
                    &renewal,
                ) {
                    Ok(renewed) => self.apply(renewal, renewed, cost_ids)?,
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
            self.renew_ahead(conn, orders, &key, p)?;
        }
        self.write_use(conn)?;
        Ok((outcomes, self.budget_read.take()))
    }

    /// The renewal of `key`'s lease for charges like `p`.
    fn renewal_for(&self, key: &Option<String>, p: &Prepared<'_>) -> Renewal {
        let (lease, reserved) = match self.held.get(key) {
            Some(h) => (Some(h.id), h.reserved.clone()),
            None => (None, RdpCurve::zero(p.curve.orders().clone())),
        };
        Renewal {
            key: key.clone(),
            tenant: p.charge.tenant.clone(),
            curve: p.curve.clone(),
            lease,
            reserved,
        }
    }

    /// Asks the renewal thread for a reservation of `key`'s lease when fewer than half
    /// a reservation's charges like `p` are left in it, and none is under way or was
    /// refused since its last renewal.
    fn renew_ahead(
        &mut self,
        conn: &Connection,
        orders: &Orders,
        key: &Option<String>,
        p: &Prepared<'_>,
    ) -> Result<(), StoreError> {
        let Some(h) = self.held.get(key) else {
            return Ok(());
        };
        if h.renewing || h.ahead_refused {
            return Ok(());
        }
        let half = self.per_reservation.div_ceil(2);
        if at_most(&h.used.compose(&p.curve.self_compose(half))?, &h.reserved) {
            return Ok(());
        }
        let renewal = self.renewal_for(key, p);
        let ahead = self.ahead.get_or_insert_with(|| {
            Ahead::start(
                conn.another(),
                orders.clone(),
                self.replica.clone(),
                self.per_reservation,
            )
        });
        let sent = ahead
            .requests
            .as_ref()
            .is_some_and(|r| r.send(renewal).is_ok());
        if let Some(h) = self.held.get_mut(key) {
            h.renewing = sent;
        }
        Ok(())
    }

    /// Applies the renewals made ahead that are done; with `wait`, first waits for
    /// every one under way. A refused or failed one is dropped (the renewal is then
    /// made when needed, which reports its error).
    fn take_renewals(
        &mut self,
        cost_ids: &mut HashMap<Vec<u8>, i64>,
        wait: bool,
    ) -> Result<(), StoreError> {
        let Some(ahead) = &self.ahead else {
            return Ok(());
        };
        let mut done = Vec::new();
        while wait && self.held.values().any(|h| h.renewing) {
            match ahead.results.recv() {
                Ok(result) => {
                    if let Some(h) = self.held.get_mut(&result.0.key) {
                        h.renewing = false;
                    }
                    done.push(result);
                }
                Err(_) => break,
            }
        }
        done.extend(ahead.results.try_iter());
        for (renewal, result) in done {
            let Some(h) = self.held.get_mut(&renewal.key) else {
                continue;
            };
            h.renewing = false;
            match result {
                Ok(renewed) => self.apply(renewal, renewed, cost_ids)?,
                Err(_) => h.ahead_refused = true,
            }
        }
        Ok(())
    }

    /// Takes a reservation made for `renewal` into the lease it names (opening it).
    fn apply(
        &mut self,
        renewal: Renewal,
        renewed: Renewed,
        cost_ids: &mut HashMap<Vec<u8>, i64>,
    ) -> Result<(), StoreError> {
        cost_ids.extend(renewed.new_costs);
        self.budget_read = Some(renewed.budget);
        let zero = RdpCurve::zero(renewed.reserved.orders().clone());
        let h = self.held.entry(renewal.key).or_insert_with(|| Held {
            id: renewed.id,
            reserved: zero.clone(),
            used: zero,
            charges: 0,
            dirty: false,
            renewing: false,
            ahead_refused: false,
        });
        // One reservation at a time per lease, each made on the reserved curve it
        // extends: anything else would record a reserved curve the ledger lacks.
        if h.id != renewed.id || h.reserved != renewal.reserved {
            return Err(StoreError::Backend(
                "a lease was renewed on a reservation it no longer holds".into(),
            ));
        }
        h.reserved = renewed.reserved;
        h.ahead_refused = false;
        Ok(())
    }

    /// A clean stop: closes every lease held, giving back what it did not spend (see
    /// the module docs), in one serializable transaction. The leases are dropped
    /// whatever the outcome: a failed close leaves them counted, never spent twice.
    pub(super) fn close(
        &mut self,
        conn: &mut Connection,
        orders: &Orders,
    ) -> Result<(), StoreError> {
        // A reservation made ahead is part of what the lease holds and gives back.
        let renewals = self.take_renewals(&mut HashMap::new(), true);
        self.stop_renewals();
        let held = std::mem::take(&mut self.held);
        renewals?;
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

impl Leases {
    /// Stops the renewal thread once it has finished the request under way.
    fn stop_renewals(&mut self) {
        if let Some(mut ahead) = self.ahead.take() {
            ahead.requests = None;
            if let Some(thread) = ahead.thread.take() {
                let _ = thread.join();
            }
        }
    }
}

impl Ahead {
    /// The renewal thread, on `conn`: each request reserved as [`reserve`] does.
    fn start(conn: Connection, orders: Orders, replica: String, per_reservation: u64) -> Self {
        let (requests, asked) = mpsc::channel::<Renewal>();
        let (answer, results) = mpsc::channel();
        let thread = std::thread::Builder::new()
            .name("privmix-lease-renewal".into())
            .spawn(move || {
                let mut conn = conn;
                let mut cost_ids = HashMap::new();
                for renewal in asked {
                    let result = reserve(
                        &mut conn,
                        &orders,
                        &cost_ids,
                        &replica,
                        per_reservation,
                        &renewal,
                    );
                    if let Ok(r) = &result {
                        cost_ids.extend(r.new_costs.iter().cloned());
                    }
                    if answer.send((renewal, result)).is_err() {
                        break;
                    }
                }
            })
            .ok();
        Self {
            requests: thread.as_ref().map(|_| requests),
            results,
            thread,
        }
    }
}

/// Reserves more for a lease: `per_reservation` charges of the renewal's cost, halved
/// while a budget refuses, in one serializable transaction each try (opening the lease
/// when it has no id yet). `known` are the cost ids already committed.
fn reserve(
    conn: &mut Connection,
    orders: &Orders,
    known: &HashMap<Vec<u8>, i64>,
    replica: &str,
    per_reservation: u64,
    renewal: &Renewal,
) -> Result<Renewed, StoreError> {
    let describe = conn.describe.clone();
    let zero = RdpCurve::zero(orders.clone());
    let mut n = per_reservation;
    loop {
        let mut slice = zero.clone();
        for _ in 0..n {
            slice = slice.compose(&renewal.curve)?;
        }
        let after = renewal.reserved.compose(&slice)?;
        let charge = PendingCharge {
            tenant: renewal.tenant.clone(),
            cost: Cost::Curve(slice),
            label: LEASE_LABEL.into(),
        };
        let mut reservation = Prepared::new(&charge, orders)?;
        let tried = serializable(conn, |tx| {
            let id: i64 = match renewal.lease {
                Some(id) => id,
                None => tx
                    .query_one(
                        "INSERT INTO privmix_leases
                             (replica, tenant, reserved, used, charges, opened_at, updated_at)
                         VALUES ($1, $2, $3, $3, 0, clock_timestamp(), clock_timestamp())
                         RETURNING id",
                        &[&replica, &renewal.key, &zero.epsilons()],
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
                return Ok(Renewed {
                    id,
                    reserved: after,
                    new_costs,
                    budget,
                });
            }
            Err(StoreError::Refused { .. }) if n > 1 => n /= 2,
            Err(e) => return Err(e),
        }
    }
}
