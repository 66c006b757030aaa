//! The embedded store: one `privmix_accountant::Ledger` file, with tenants.
//!
//! The file format has no tenant field, so a tenant's charge carries it in its label:
//! `tenant=<name>;<label>` (tenant names hold no `;`, see `check_tenant_name`). Opening
//! reads every record back and composes each tenant's charges in file order, the same
//! order and the same rounded-up composition the ledger uses for its total, and keeps
//! those curves in memory; the ledger's exclusive lock means no other writer can add a
//! charge behind this handle's back.
//!
//! A tenant charge is checked against the tenant's budget first, then handed to
//! `Ledger::charge`, which checks the total budget and syncs the record before it
//! returns: a charge either budget refuses writes nothing. A step's charges are checked
//! the same way one after another, and the accepted ones handed to
//! `Ledger::charge_step` (one write, one sync, one compact record).

use std::collections::BTreeMap;
use std::path::Path;

use privmix_accountant::{
    EntryKind, Ledger, LedgerError, Orders, PrivacyBudget, ProtectedSet, RdpCurve, StepCharge,
    StepCost,
};

#[cfg(test)]
use super::StoreReceipt;
use super::snapshot::{self, Snapshot};
use super::step::{Cost, PendingCharge};
use super::{
    LedgerStore, StepOutcomes, StoreError, TENANT_PREFIX, Tenant, check_budget, check_tenant_name,
    split_label,
};

/// A file ledger with per-tenant spending. See the module docs.
#[derive(Debug)]
pub struct FileStore {
    ledger: Ledger,
    tenants: BTreeMap<String, RdpCurve>,
}

impl FileStore {
    /// Opens the ledger at `path` (taking its lock, dropping a torn final write) and
    /// rebuilds every tenant's spending from its records.
    pub fn open(path: impl AsRef<Path>) -> Result<Self, StoreError> {
        let path = path.as_ref();
        let ledger = Ledger::open(path).map_err(|e| StoreError::file(path, e))?;
        Self::from_ledger(ledger)
    }

    /// Creates a ledger at `path` protecting `protected`, with `budget`; refuses with
    /// [`StoreError::AlreadyExists`] if `path` exists.
    pub fn create(
        path: impl AsRef<Path>,
        orders: Orders,
        budget: Option<PrivacyBudget>,
        protected: ProtectedSet,
    ) -> Result<Self, StoreError> {
        let path = path.as_ref();
        match Ledger::create_protecting(path, orders, budget, protected) {
            Ok(ledger) => Self::from_ledger(ledger),
            Err(LedgerError::AlreadyExists(_)) => Err(StoreError::AlreadyExists {
                store: path.display().to_string(),
            }),
            Err(e) => Err(StoreError::file(path, e)),
        }
    }

    /// Wraps an open ledger, reading its records for the tenants' spending.
    pub fn from_ledger(ledger: Ledger) -> Result<Self, StoreError> {
        let path = ledger.path().to_path_buf();
        let fail = |e| StoreError::file(&path, e);
        let mut tenants: BTreeMap<String, RdpCurve> = BTreeMap::new();
        let mut total = RdpCurve::zero(ledger.orders().clone());
        let mut charges = 0u64;
        let mut add = |curve: &RdpCurve, label: &str| -> Result<(), StoreError> {
            total = total.compose(curve)?;
            charges += 1;
            if let (Some(name), _) = split_label(label) {
                let spent = match tenants.remove(name) {
                    Some(spent) => spent.compose(curve)?,
                    None => curve.clone(),
                };
                tenants.insert(name.to_owned(), spent);
            }
            Ok(())
        };
        for entry in ledger.entries().map_err(fail)? {
            match entry.map_err(fail)?.kind {
                EntryKind::Charge { curve, label } => add(&curve, &label)?,
                EntryKind::Step(runs) => {
                    for run in &runs {
                        for _ in 0..run.count {
                            add(&run.curve, &run.label)?;
                        }
                    }
                }
                _ => {}
            }
        }
        // The records read must be the ones the ledger counted when it opened.
        if charges != ledger.charges() || &total != ledger.spent() {
            return Err(StoreError::Inconsistent {
                store: path.display().to_string(),
                reason: format!(
                    "its records hold {charges} charges, the open ledger counted {}",
                    ledger.charges()
                ),
            });
        }
        Ok(Self { ledger, tenants })
    }

    /// The ledger underneath.
    #[cfg(test)]
    pub fn ledger(&self) -> &Ledger {
        &self.ledger
    }

    fn fail(&self, e: LedgerError) -> StoreError {
        StoreError::file(self.ledger.path(), e)
    }

    #[cfg(test)]
    fn path_buf(&self) -> std::path::PathBuf {
        self.ledger.path().to_path_buf()
    }

    /// The label a charge is recorded under: `tenant=NAME;label` for a tenant's; a
    /// label of no tenant may not look like a tenant's.
    fn full_label(tenant: Option<&Tenant>, label: &str) -> Result<String, StoreError> {
        match tenant {
            None if label.starts_with(TENANT_PREFIX) => Err(StoreError::BadLabel {
                reason: format!(
                    "a label starting with {TENANT_PREFIX:?} would be read back as a tenant's charge"
                ),
            }),
            None => Ok(label.to_owned()),
            Some(t) => {
                check_tenant_name(&t.name)?;
                Ok(format!("{TENANT_PREFIX}{};{label}", t.name))
            }
        }
    }
}

impl LedgerStore for FileStore {
    fn describe(&self) -> String {
        self.ledger.path().display().to_string()
    }

    fn orders(&self) -> &Orders {
        self.ledger.orders()
    }

    fn budget(&self) -> Option<PrivacyBudget> {
        self.ledger.budget()
    }

    fn protected_set(&self) -> Option<&ProtectedSet> {
        self.ledger.protected_set()
    }

    fn spent(&mut self, tenant: Option<&str>) -> Result<RdpCurve, StoreError> {
        Ok(match tenant {
            None => self.ledger.spent().clone(),
            Some(name) => self
                .tenants
                .get(name)
                .cloned()
                .unwrap_or_else(|| RdpCurve::zero(self.ledger.orders().clone())),
        })
    }

    #[cfg(test)]
    fn charge_receipt(
        &mut self,
        tenant: Option<&Tenant>,
        curve: &RdpCurve,
        label: &str,
    ) -> Result<StoreReceipt, StoreError> {
        if curve.orders() != self.ledger.orders() {
            return Err(privmix_accountant::AccountantError::OrdersDiffer.into());
        }
        let (full_label, tenant_check) = match tenant {
            None => {
                if label.starts_with(TENANT_PREFIX) {
                    return Err(StoreError::BadLabel {
                        reason: format!(
                            "a label starting with {TENANT_PREFIX:?} would be read back as a tenant's charge"
                        ),
                    });
                }
                (label.to_owned(), None)
            }
            Some(t) => {
                check_tenant_name(&t.name)?;
                let zero;
                let spent = match self.tenants.get(&t.name) {
                    Some(s) => s,
                    None => {
                        zero = RdpCurve::zero(self.ledger.orders().clone());
                        &zero
                    }
                };
                let (composed, at_delta) =
                    check_budget(|| format!("tenant {}", t.name), spent, curve, t.budget)?;
                (
                    format!("{TENANT_PREFIX}{};{label}", t.name),
                    Some((t.name.clone(), composed, at_delta)),
                )
            }
        };
        let receipt = match self.ledger.charge(curve, &full_label) {
            Ok(r) => r,
            Err(LedgerError::BudgetExceeded {
                budget,
                would_spend,
            }) => {
                let spent = self
                    .ledger
                    .spent_epsilon(budget.delta())
                    .map_err(|e| self.fail(e))?;
                return Err(StoreError::Refused {
                    budget: "total".into(),
                    spent: spent.epsilon,
                    would_spend: would_spend.epsilon,
                    epsilon: budget.epsilon(),
                    delta: budget.delta(),
                });
            }
            Err(e) => return Err(StoreError::file(&self.path_buf(), e)),
        };
        let tenant_spent = match tenant_check {
            Some((name, composed, at_delta)) => {
                self.tenants.insert(name, composed);
                at_delta
            }
            None => None,
        };
        Ok(StoreReceipt {
            sequence: receipt.sequence,
            spent: receipt.spent,
            tenant_spent,
        })
    }

    fn commit_step(&mut self, charges: &[PendingCharge]) -> Result<StepOutcomes, StoreError> {
        let orders = self.ledger.orders().clone();
        let budget = self.ledger.budget();
        // Checked in order, as the ledger will check the total again: the tenant's
        // budget first, then the total's, each on what the step accepted before.
        let mut total = self.ledger.spent().clone();
        let mut tenants: BTreeMap<String, RdpCurve> = BTreeMap::new();
        let mut outcomes = Vec::with_capacity(charges.len());
        let mut accepted: Vec<(&Cost, String)> = Vec::new();
        for charge in charges {
            let curve = charge.cost.curve(&orders)?;
            let label = Self::full_label(charge.tenant.as_ref(), &charge.label)?;
            let mut tenant_after = None;
            if let Some(t) = &charge.tenant {
                let zero = RdpCurve::zero(orders.clone());
                let spent = tenants
                    .get(&t.name)
                    .or_else(|| self.tenants.get(&t.name))
                    .unwrap_or(&zero);
                match check_budget(|| format!("tenant {}", t.name), spent, &curve, t.budget) {
                    Ok((composed, _)) => tenant_after = Some((t.name.clone(), composed)),
                    Err(e @ StoreError::Refused { .. }) => {
                        outcomes.push(Err(e));
                        continue;
                    }
                    Err(e) => return Err(e),
                }
            }
            match check_budget(|| "total".into(), &total, &curve, budget) {
                Ok((composed, _)) => total = composed,
                Err(e @ StoreError::Refused { .. }) => {
                    outcomes.push(Err(e));
                    continue;
                }
                Err(e) => return Err(e),
            }
            tenants.extend(tenant_after);
            accepted.push((&charge.cost, label));
            outcomes.push(Ok(()));
        }
        let step: Vec<StepCharge<'_>> = accepted
            .iter()
            .map(|(cost, label)| StepCharge {
                cost: match cost {
                    Cost::Curve(c) => StepCost::Curve(c),
                    Cost::Event(e) => StepCost::Event(e),
                },
                label,
            })
            .collect();
        let receipt = self.ledger.charge_step(&step).map_err(|e| self.fail(e))?;
        // The ledger checks the total with the same compositions in the same order.
        if receipt.accepted.iter().any(|ok| !ok) || self.ledger.spent() != &total {
            return Err(StoreError::Inconsistent {
                store: self.describe(),
                reason: "the ledger's total after a step differs from the store's check".into(),
            });
        }
        self.tenants.extend(tenants);
        Ok(outcomes)
    }

    fn raise(&mut self, budget: PrivacyBudget) -> Result<u64, StoreError> {
        let sequence = self.ledger.next_sequence();
        match self.ledger.set_budget(Some(budget)) {
            Ok(()) => Ok(sequence),
            Err(LedgerError::BudgetBelowSpent { budget, spent }) => {
                Err(StoreError::BudgetBelowSpent {
                    store: self.describe(),
                    budget,
                    spent,
                })
            }
            Err(e) => Err(self.fail(e)),
        }
    }

    fn snapshot(&mut self) -> Result<Snapshot, StoreError> {
        snapshot::of_file(self.ledger.path())
    }
}
