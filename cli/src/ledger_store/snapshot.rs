//! What a ledger says about itself, read consistently, the same for a file and for
//! PostgreSQL: what `privmix ledger show` prints and a server reports.

use std::collections::BTreeMap;
use std::path::Path;

use privmix_accountant::{
    DpEvent, EntryKind, LedgerReader, LedgerSummary, Orders, PrivacyBudget, ProtectedSet, RdpCurve,
};

use super::{StoreError, split_label};

/// Where and in which layout a ledger is kept.
#[derive(Debug, Clone, PartialEq)]
pub enum StoreFormat {
    /// A ledger file of this format version.
    File {
        /// `privmix_accountant::FORMAT_VERSION` when written by this build.
        version: u32,
        /// Bytes of a torn final write after the last intact record (never
        /// acknowledged; dropped when a writer next opens the file).
        torn_tail_bytes: u64,
    },
    /// PostgreSQL tables of this schema version.
    Postgres {
        /// The schema version.
        schema_version: i32,
    },
}

/// One change of the total budget after creation.
#[derive(Debug, Clone, PartialEq)]
pub struct BudgetChange {
    /// Its record number.
    pub sequence: u64,
    /// When it was recorded (ms since the Unix epoch).
    pub time_ms: u64,
    /// The budget from then on (`None`: removed, which only old file ledgers record).
    pub budget: Option<PrivacyBudget>,
    /// How many charges were recorded before it.
    pub after_charges: u64,
}

/// One tenant's spending.
#[derive(Debug, Clone, PartialEq)]
pub struct TenantSpent {
    /// How many charges it made.
    pub charges: u64,
    /// Their composition, in the order recorded (rounded up).
    pub spent: RdpCurve,
}

/// One record of a ledger, in sequence order.
#[derive(Debug, Clone, PartialEq)]
pub enum Record {
    /// A charge.
    Charge {
        /// Its record number.
        sequence: u64,
        /// When it was recorded (ms since the Unix epoch).
        time_ms: u64,
        /// The tenant it was charged to, if any.
        tenant: Option<String>,
        /// The label given with it (without a file ledger's tenant prefix).
        label: String,
        /// How many charges of `curve` the record holds, recorded together and
        /// composed in turn (1 for a record of one charge).
        count: u64,
        /// What each of them spent.
        curve: RdpCurve,
        /// The data-independent event `curve` was computed from, when recorded.
        event: Option<DpEvent>,
        /// The budget lease this charge reserves for, when it is a reservation.
        lease: Option<u64>,
    },
    /// A budget lease closed on a clean stop, giving back what it did not spend
    /// (PostgreSQL ledgers): its tenant's and the total's spending dropped by `unspent`
    /// (rounded up, see `ledger_store/postgres/lease.rs`).
    Release {
        /// Its record number.
        sequence: u64,
        /// When it was recorded (ms since the Unix epoch).
        time_ms: u64,
        /// The tenant of the lease, if any.
        tenant: Option<String>,
        /// The lease it closes.
        lease: u64,
        /// What it gave back (its reservation less its use, rounded down).
        unspent: RdpCurve,
    },
    /// A budget change.
    Budget(BudgetChange),
}

/// A budget lease (PostgreSQL ledgers): what a replica reserved, recorded as spent,
/// and what it has spent of it.
#[derive(Debug, Clone, PartialEq)]
pub struct LeaseUse {
    /// Its id.
    pub id: u64,
    /// The replica holding it.
    pub replica: String,
    /// The tenant whose charges it pays (`None`: requests without a tenant).
    pub tenant: Option<String>,
    /// What its reservations composed to (recorded as spent).
    pub reserved: RdpCurve,
    /// What the charges spent from it composed to, as last written.
    pub used: RdpCurve,
    /// How many charges were spent from it, as last written.
    pub charges: u64,
    /// How many reservations it made (each a charge record of the ledger).
    pub reservations: u64,
    /// It was closed on a clean stop, its unspent part given back (its reserved curve
    /// is then what it used).
    pub closed: bool,
}

/// Everything a ledger says about itself.
#[derive(Debug, Clone, PartialEq)]
pub struct Snapshot {
    /// The store (a path, or the URL without password).
    pub store: String,
    /// Its layout.
    pub format: StoreFormat,
    /// When it was created (ms since the Unix epoch), when recorded.
    pub created_ms: Option<u64>,
    /// The private members it accounts for, when recorded.
    pub protected_set: Option<ProtectedSet>,
    /// Its orders.
    pub orders: Orders,
    /// The budget it was created with.
    pub initial_budget: Option<PrivacyBudget>,
    /// The budget in force.
    pub budget: Option<PrivacyBudget>,
    /// Every budget change since creation, in order.
    pub history: Vec<BudgetChange>,
    /// How many charges it holds.
    pub charges: u64,
    /// Everyone's spending (rounded up).
    pub spent: RdpCurve,
    /// Each tenant's spending, by name.
    pub tenants: BTreeMap<String, TenantSpent>,
    /// The budget leases (none for a file ledger).
    pub leases: Vec<LeaseUse>,
    /// Each tenant's own budget in force, as the ledger records it (PostgreSQL
    /// ledgers; a file ledger's tenants have their API keys' budgets).
    pub tenant_budgets: BTreeMap<String, PrivacyBudget>,
}

/// The snapshot of the ledger file at `path`, read without its lock and without
/// writing (a torn final write is reported, not removed).
pub fn of_file(path: &Path) -> Result<Snapshot, StoreError> {
    let fail = |e| StoreError::file(path, e);
    let summary: LedgerSummary = privmix_accountant::verify(path).map_err(fail)?;
    let reader = LedgerReader::open(path).map_err(fail)?;
    let header = reader.header().clone();
    let mut history = Vec::new();
    let mut tenants: BTreeMap<String, TenantSpent> = BTreeMap::new();
    let mut charges = 0u64;
    for entry in reader {
        let entry = entry.map_err(fail)?;
        let mut add = |curve: &RdpCurve, label: &str| -> Result<(), StoreError> {
            charges += 1;
            if let (Some(name), _) = split_label(label) {
                match tenants.get_mut(name) {
                    Some(t) => {
                        t.charges += 1;
                        t.spent = t.spent.compose(curve)?;
                    }
                    None => {
                        tenants.insert(
                            name.to_owned(),
                            TenantSpent {
                                charges: 1,
                                spent: curve.clone(),
                            },
                        );
                    }
                }
            }
            Ok(())
        };
        match entry.kind {
            EntryKind::Charge { curve, label } => add(&curve, &label)?,
            // A step's runs, each charge in turn (as the ledger composes them).
            EntryKind::Step(runs) => {
                for run in &runs {
                    for _ in 0..run.count {
                        add(&run.curve, &run.label)?;
                    }
                }
            }
            EntryKind::Budget(budget) => history.push(BudgetChange {
                sequence: entry.sequence,
                time_ms: entry.time_ms,
                budget,
                after_charges: charges,
            }),
            // The accountant may add record kinds; they do not change spending.
            _ => {}
        }
    }
    // `verify` and this pass read the same file; a writer appending in between would
    // make them differ, and the summary is then not this listing's.
    if charges != summary.charges {
        return Err(StoreError::Inconsistent {
            store: path.display().to_string(),
            reason: "the file changed while it was read; read it again".into(),
        });
    }
    Ok(Snapshot {
        store: path.display().to_string(),
        format: StoreFormat::File {
            version: summary.version,
            torn_tail_bytes: summary.torn_tail_bytes,
        },
        created_ms: summary.created_ms,
        protected_set: summary.protected_set,
        orders: summary.orders,
        initial_budget: header.initial_budget,
        budget: summary.budget,
        history,
        charges: summary.charges,
        spent: summary.spent,
        tenants,
        leases: Vec::new(),
        tenant_budgets: BTreeMap::new(),
    })
}
