//! Where charges are recorded: the embedded file ledger (`privmix_accountant::Ledger`)
//! or a PostgreSQL ledger shared by several `privmix serve` replicas.
//!
//! Both give the same guarantees: a charge is durable before `charge` returns `Ok`
//! (so a token is released only after its charge would survive a crash), and the
//! budget check and the charge are one atomic step, for the members' total budget and
//! for the tenant's own budget together.
//!
//! Composition is Mironov's (Rényi Differential Privacy, arXiv:1702.07476, Prop. 1):
//! RDP values add order by order, each sum rounded up by `RdpCurve::compose`. A budget
//! is checked on the (ε, δ) conversion of `RdpCurve::epsilon` (Balle et al., Hypothesis
//! Testing Interpretations and Renyi Differential Privacy, arXiv:1905.09982, Thm 21),
//! which rounds ε up. Both stores use these two functions and nothing else, so a file
//! and a PostgreSQL ledger given the same charges in the same order hold the same bits.
//!
//! A tenant's budget is checked on the tenant's own charges, composed in the order they
//! were recorded; the total budget on everyone's. A charge is recorded only when both
//! could pay it.
//!
//! [`open_store`] picks the store from a spec: a `postgres://…`/`postgresql://…` URL, or
//! else a file path.

// `privmix serve` (cli/src/serve) opens, charges and reports stores through this module;
// until its request path is wired in, the binary's other commands use only the part the
// `privmix ledger` commands need. The tests use all of it.

pub mod account;
pub mod file;
pub mod open;
#[cfg(test)]
mod pg_lease_tests;
#[cfg(test)]
mod pg_rows_tests;
pub mod postgres;
pub mod snapshot;
pub mod step;
#[cfg(test)]
mod test_cluster;
#[cfg(test)]
mod tests;

use std::fmt;

use privmix_accountant::{
    AccountantError, EpsilonDelta, LedgerError, Orders, PrivacyBudget, ProtectedSet, RdpCurve,
};

// What `privmix serve` uses (see the allowance above).
pub use account::mechanism_error;
pub use open::{StorePlan, open_store, prepare_store};
pub use open::{StoreSpec, open_existing};
pub use postgres::PostgresStore;
pub use snapshot::{Record, Snapshot, StoreFormat, of_file as snapshot_of_file};
pub use step::{PendingCharge, StepAccount};

/// What a step commit says of each of its charges, in order: `Ok` when it was
/// recorded, [`StoreError::Refused`] when a budget could not pay it.
pub type StepOutcomes = Vec<Result<(), StoreError>>;

/// Longest tenant name, in bytes.
pub const MAX_TENANT_BYTES: usize = 128;

/// The label prefix that records a charge's tenant.
pub const TENANT_PREFIX: &str = "tenant=";

/// The tenant a recorded label names, and the label the caller gave.
pub fn split_label(label: &str) -> (Option<&str>, &str) {
    label
        .strip_prefix(TENANT_PREFIX)
        .and_then(|rest| rest.split_once(';'))
        .map_or((None, label), |(tenant, rest)| (Some(tenant), rest))
}

/// A tenant (an API key's owner) charging a store: its name and its own budget over
/// the same members. The members' total budget is the store's and is enforced too.
#[derive(Debug, Clone, PartialEq)]
pub struct Tenant {
    /// The tenant's name (recorded with each of its charges): 1 to
    /// [`MAX_TENANT_BYTES`] ASCII letters, digits or `-_.@:+/`.
    pub name: String,
    /// Its own budget, if it has one.
    pub budget: Option<PrivacyBudget>,
}

/// Checks a tenant name: the characters allowed keep a file ledger's `tenant=NAME;`
/// label prefix unambiguous (no `;` or `=`), listings one line, and leave `*` free as
/// the PostgreSQL ledger's key of the total.
pub fn check_tenant_name(name: &str) -> Result<(), StoreError> {
    let bad = |reason: &str| StoreError::BadTenant {
        name: name.chars().take(MAX_TENANT_BYTES).collect(),
        reason: reason.into(),
    };
    if name.is_empty() || name.len() > MAX_TENANT_BYTES {
        return Err(bad(&format!(
            "it is {} bytes long; a tenant name has 1 to {MAX_TENANT_BYTES}",
            name.len()
        )));
    }
    let allowed = |b: u8| b.is_ascii_alphanumeric() || b"-_.@:+/".contains(&b);
    if !name.bytes().all(allowed) {
        return Err(bad("only ASCII letters, digits and -_.@:+/ are allowed"));
    }
    Ok(())
}

/// What a recorded charge returns: proof it is durable, and the totals it led to.
#[cfg(test)]
#[derive(Debug, Clone, PartialEq)]
pub struct StoreReceipt {
    /// The charge's record number (file records and PostgreSQL records alike count
    /// charges and budget changes together, from 0).
    pub sequence: u64,
    /// Everyone's spend including this charge, at the total budget's δ (rounded up);
    /// `None` without a total budget.
    pub spent: Option<EpsilonDelta>,
    /// The tenant's spend including this charge, at its budget's δ; `None` without a
    /// tenant or without a tenant budget.
    pub tenant_spent: Option<EpsilonDelta>,
}

/// Why a store refused or failed a charge, or could not be opened.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum StoreError {
    /// The charge would take a budget above its ε at its δ; nothing was recorded.
    #[error(
        "privacy budget {budget} exhausted: spent ε = {spent} of ε = {epsilon} at δ = {delta}; the charge would take it to ε = {would_spend}"
    )]
    Refused {
        /// Which budget: "total" or "tenant `<name>`".
        budget: String,
        /// ε spent on it so far (rounded up), at `delta`.
        spent: f64,
        /// ε it would have reached with the refused charge (rounded up), at `delta`.
        would_spend: f64,
        /// Its ε.
        epsilon: f64,
        /// Its δ.
        delta: f64,
    },
    /// The store could not be read or written for a reason no other variant names.
    #[error("{0}")]
    Backend(String),
    /// The file ledger failed (I/O, lock, corruption, label too long, …).
    #[error("ledger {}: {source}", path.display())]
    File {
        /// The ledger file.
        path: std::path::PathBuf,
        /// Why.
        #[source]
        source: LedgerError,
    },
    /// PostgreSQL refused a connection or a statement.
    #[error(
        "ledger {store}: PostgreSQL failed while {during}: {}",
        pg_text(source)
    )]
    Postgres {
        /// The store (the URL without its password).
        store: String,
        /// What the store was doing.
        during: &'static str,
        /// The driver's error.
        #[source]
        source: ::postgres::Error,
    },
    /// An accounting step failed (curves over other orders, an invalid δ, …).
    #[error(transparent)]
    Accountant(#[from] AccountantError),
    /// The spec names no ledger yet, and nothing says how to create one.
    #[error(
        "ledger {store} does not exist yet: pass --epsilon (and --delta) to create it with a budget"
    )]
    NotFound {
        /// The store asked for.
        store: String,
    },
    /// A new ledger was asked for where one exists.
    #[error("ledger {store} already exists")]
    AlreadyExists {
        /// The store.
        store: String,
    },
    /// The spec could not be parsed (the text is not repeated: it may hold a password).
    #[error("bad ledger spec: {reason}")]
    BadSpec {
        /// What is wrong with it.
        reason: String,
    },
    /// The PostgreSQL server may acknowledge a commit that is not on disk.
    #[error(
        "ledger {store}: the PostgreSQL server has {setting} = {value}, so a COMMIT can return before the charge is on disk and a crash could forget a charge whose token was already released; set {setting} = on"
    )]
    UnsafeServer {
        /// The store.
        store: String,
        /// The setting (`fsync` or `synchronous_commit`).
        setting: &'static str,
        /// Its value on the server.
        value: String,
    },
    /// The PostgreSQL schema was written by a newer or unknown build.
    #[error("ledger {store} has schema version {found}; this build reads version {supported}")]
    UnsupportedSchema {
        /// The store.
        store: String,
        /// The version recorded.
        found: i32,
        /// The version this build reads and writes.
        supported: i32,
    },
    /// What the store holds breaks an invariant (a total that is not the composition of
    /// its charges, a gap in the records, a malformed value): it is not used.
    #[error("ledger {store} is inconsistent: {reason}")]
    Inconsistent {
        /// The store.
        store: String,
        /// What is wrong.
        reason: String,
    },
    /// Serialization failures went on past the retry limit; nothing was recorded.
    #[error(
        "ledger {store}: the charge still conflicted with concurrent charges after {attempts} attempts; nothing was recorded"
    )]
    Contention {
        /// The store.
        store: String,
        /// How many transactions were tried.
        attempts: u32,
    },
    /// The ledger accounts for other private members than the caller loads.
    #[error(
        "ledger {store} protects a different set of private members: it records {recorded}, this run loads {loaded}{}",
        recorded.difference_text(loaded)
    )]
    ProtectedSetDiffers {
        /// The store.
        store: String,
        /// The set it records.
        recorded: ProtectedSet,
        /// The set the caller loads.
        loaded: ProtectedSet,
    },
    /// The ledger names no protected set, so it cannot say which data it accounts for.
    #[error(
        "ledger {store} does not record which private members it protects, so it cannot be charged for these; start a new ledger"
    )]
    NoProtectedSet {
        /// The store.
        store: String,
    },
    /// An existing ledger without a budget cannot be charged by a private run.
    #[error(
        "ledger {store} has no budget: set one with `privmix ledger raise {store} --epsilon E`"
    )]
    NoBudget {
        /// The store.
        store: String,
    },
    /// `--epsilon`/`--delta` ask for more than an existing ledger's budget.
    #[error(
        "ledger {store} has the budget ε = {}, δ = {}; --epsilon/--delta ask for ε = {}, δ = {}. Raising a budget is an explicit, recorded act: run `privmix ledger raise {store} --epsilon {} --delta {}` first",
        recorded.epsilon(), recorded.delta(), requested.epsilon(), requested.delta(),
        requested.epsilon(), requested.delta()
    )]
    BudgetRaiseNeeded {
        /// The store.
        store: String,
        /// Its budget.
        recorded: PrivacyBudget,
        /// What the flags ask for.
        requested: PrivacyBudget,
    },
    /// `--epsilon`/`--delta` ask for less than an existing ledger's budget.
    #[error(
        "ledger {store} has the budget ε = {}, δ = {}; the flags may only repeat it (omit them to use it); a budget changes only with `privmix ledger raise`",
        recorded.epsilon(), recorded.delta()
    )]
    BudgetNotRepeated {
        /// The store.
        store: String,
        /// Its budget.
        recorded: PrivacyBudget,
    },
    /// A new budget is below what the ledger has already spent.
    #[error(
        "ledger {store}: budget ε = {} at δ = {} is below the ε = {} already spent",
        budget.epsilon(), budget.delta(), spent.epsilon
    )]
    BudgetBelowSpent {
        /// The store.
        store: String,
        /// The refused budget.
        budget: PrivacyBudget,
        /// What has been spent, at the refused budget's δ.
        spent: EpsilonDelta,
    },
    /// A tenant name that cannot be recorded.
    #[error("tenant name {name:?} cannot be used: {reason}")]
    BadTenant {
        /// The name (at most its first [`MAX_TENANT_BYTES`] characters).
        name: String,
        /// Why.
        reason: String,
    },
    /// Tenants' budgets are kept only by PostgreSQL ledgers.
    #[error(
        "ledger {store} cannot hold tenants' budgets: only a PostgreSQL ledger does (a file ledger's tenants have the budgets of the server's API keys file)"
    )]
    TenantBudgetsUnsupported {
        /// The store.
        store: String,
    },
    /// Budget leases cannot be used as asked.
    #[error("budget leases: {reason}")]
    BadLease {
        /// Why.
        reason: String,
    },
    /// A label that cannot be recorded.
    #[error("charge label cannot be recorded: {reason}")]
    BadLabel {
        /// Why.
        reason: String,
    },
}

impl StoreError {
    /// A file ledger error.
    pub(crate) fn file(path: &std::path::Path, source: LedgerError) -> Self {
        Self::File {
            path: path.to_path_buf(),
            source,
        }
    }

    /// Whether the flags or the spec are at fault (a missing `--epsilon` for a new
    /// ledger, a budget the flags may not change, a malformed spec): the command line's
    /// usage exit status.
    pub fn is_usage(&self) -> bool {
        matches!(
            self,
            Self::NotFound { .. }
                | Self::BudgetRaiseNeeded { .. }
                | Self::BudgetNotRepeated { .. }
                | Self::BadSpec { .. }
        )
    }

    /// Whether this is a budget refusal (nothing recorded because a budget could not
    /// pay), as opposed to a failure.
    #[cfg(test)]
    pub fn is_refusal(&self) -> bool {
        matches!(self, Self::Refused { .. })
    }
}

/// The driver's message, with the server's detail when it sent one.
fn pg_text(e: &::postgres::Error) -> String {
    match e.as_db_error() {
        Some(db) => format!("{} (SQLSTATE {})", db.message(), db.code().code()),
        None => e.to_string(),
    }
}

/// What a store holds and how it charges. Object safe: the server holds a
/// `Box<dyn LedgerStore>` and calls it from blocking threads.
pub trait LedgerStore: Send {
    /// A description for messages (a file path, or the PostgreSQL URL without password).
    fn describe(&self) -> String;
    /// The orders every charge is expressed at.
    fn orders(&self) -> &Orders;
    /// The members' total budget, as of the last time this handle read it (opening, a
    /// charge, `spent` or `raise`); every charge checks the budget in force when it is
    /// recorded, whatever this returns.
    fn budget(&self) -> Option<PrivacyBudget>;
    /// The private members the ledger accounts for, if it names them.
    fn protected_set(&self) -> Option<&ProtectedSet>;
    /// The composed spend of everyone (`None`) or of one tenant, as recorded now.
    fn spent(&mut self, tenant: Option<&str>) -> Result<RdpCurve, StoreError>;
    /// (Tests: one charge at a time, the path a step of one request takes.)
    #[cfg(test)]
    /// Records `curve` for `tenant` with `label`, durably, or refuses it with
    /// [`StoreError::Refused`] when either the total budget or the tenant's budget
    /// could not pay it (then nothing is recorded). Returns the receipt.
    ///
    /// **Contract:** release what the charge pays for only after `Ok`. On any error
    /// nothing was acknowledged; a failure other than a refusal may leave the charge
    /// recorded (an over-count, which is safe) or not.
    fn charge_receipt(
        &mut self,
        tenant: Option<&Tenant>,
        curve: &RdpCurve,
        label: &str,
    ) -> Result<StoreReceipt, StoreError>;
    /// Records the charges of one decoding step (see `step.rs`): each checked in
    /// order against its tenant's budget and the total budget, composed onto what
    /// the charges before it in the step left; a charge either budget refuses is dropped (its outcome is
    /// [`StoreError::Refused`]) and the next is checked. The accepted ones are
    /// recorded durably together: one write and one sync for a file, one transaction
    /// for PostgreSQL.
    ///
    /// **Contract:** release what an accepted charge pays for only after `Ok`. An
    /// error fails the whole step: nothing of it was acknowledged (a failure after the
    /// write may leave charges recorded, an over-count, which is safe).
    fn commit_step(&mut self, charges: &[PendingCharge]) -> Result<StepOutcomes, StoreError>;
    /// Sets a new total budget, recorded with its time (the budget's history is kept);
    /// a budget below what is already spent (at its δ) is
    /// [`StoreError::BudgetBelowSpent`]. Returns the budget record's sequence number.
    fn raise(&mut self, budget: PrivacyBudget) -> Result<u64, StoreError>;
    /// Everything the ledger says about itself, read consistently.
    fn snapshot(&mut self) -> Result<Snapshot, StoreError>;

    /// Sets `tenant`'s own budget in the ledger, recorded with its time (its history is
    /// kept); every later charge of the tenant must fit it, whichever replica records
    /// it. A budget below what the tenant has spent is [`StoreError::BudgetBelowSpent`].
    /// Only a PostgreSQL ledger holds tenants' budgets: any other store returns
    /// [`StoreError::TenantBudgetsUnsupported`].
    fn set_tenant_budget(&mut self, tenant: &str, budget: PrivacyBudget) -> Result<(), StoreError> {
        let _ = (tenant, budget);
        Err(StoreError::TenantBudgetsUnsupported {
            store: self.describe(),
        })
    }

    /// From now on, step commits spend from budget leases of `per_reservation` charges
    /// each, reserved (and recorded as spent) a slice at a time, instead of taking the
    /// ledger's lock at every step: see `ledger_store/postgres/lease.rs`. Only a
    /// PostgreSQL ledger has leases; any other store returns [`StoreError::BadLease`].
    fn use_leases(&mut self, per_reservation: u64) -> Result<(), StoreError> {
        let _ = per_reservation;
        Err(StoreError::BadLease {
            reason: format!(
                "ledger {} is not a PostgreSQL ledger; leases are for replicas sharing one",
                self.describe()
            ),
        })
    }

    /// A clean stop: closes the budget leases this handle holds (see
    /// [`Self::use_leases`]), giving back to the total's and tenants' spending what they
    /// did not spend, rounded so that the recorded spending still bounds everything
    /// released. Call it only once no step commit is in flight and none will follow
    /// whose tokens were released before; a handle without leases has nothing to do.
    fn close_leases(&mut self) -> Result<(), StoreError> {
        Ok(())
    }

    /// [`Self::charge_receipt`] without the receipt.
    #[cfg(test)]
    fn charge(
        &mut self,
        tenant: Option<&Tenant>,
        curve: &RdpCurve,
        label: &str,
    ) -> Result<(), StoreError> {
        self.charge_receipt(tenant, curve, label).map(drop)
    }

    /// Checks that the ledger accounts for exactly the members `loaded` (same
    /// identities and multiplicities, any order), as a caller about to charge
    /// releases computed from them must.
    fn check_protects(&self, loaded: &ProtectedSet) -> Result<(), StoreError> {
        match self.protected_set() {
            None => Err(StoreError::NoProtectedSet {
                store: self.describe(),
            }),
            Some(recorded) if recorded != loaded => Err(StoreError::ProtectedSetDiffers {
                store: self.describe(),
                recorded: recorded.clone(),
                loaded: loaded.clone(),
            }),
            Some(_) => Ok(()),
        }
    }
}

impl fmt::Debug for dyn LedgerStore {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "LedgerStore({})", self.describe())
    }
}

/// The check both stores make before recording: `spent` composed with `curve` must
/// stay within `budget` (at its δ). Returns the composition and, with a budget, its ε;
/// a charge it cannot pay is [`StoreError::Refused`] naming `which`.
pub(crate) fn check_budget(
    which: impl FnOnce() -> String,
    spent: &RdpCurve,
    curve: &RdpCurve,
    budget: Option<PrivacyBudget>,
) -> Result<(RdpCurve, Option<EpsilonDelta>), StoreError> {
    let total = spent.compose(curve)?;
    let Some(budget) = budget else {
        return Ok((total, None));
    };
    let would = total.epsilon(budget.delta())?;
    if would.epsilon > budget.epsilon() {
        return Err(StoreError::Refused {
            budget: which(),
            spent: spent.epsilon(budget.delta())?.epsilon,
            would_spend: would.epsilon,
            epsilon: budget.epsilon(),
            delta: budget.delta(),
        });
    }
    Ok((total, Some(would)))
}
