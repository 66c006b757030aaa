//! Opening a store from a spec: a `postgres://…`/`postgresql://…` URL, or a file path.
//!
//! Every command that charges (`generate`, `serve`) and every `privmix ledger` command
//! opens its ledger here, so the rules are written once, for either store:
//!
//! - a store charges only for the adapter set it was created for (its protected set);
//!   another set, or none, is refused, and creating a store is announced on stderr;
//! - `--epsilon`/`--delta` create a store's budget, and for an existing store may only
//!   repeat it: a budget changes only through `privmix ledger raise`.

use std::path::PathBuf;

use privmix_accountant::{Orders, PrivacyBudget, ProtectedSet};

use super::file::FileStore;
use super::postgres::{self as pg, PostgresStore};
use super::{LedgerStore, StoreError};
use crate::ledger_common::{DEFAULT_DELTA, utc};

/// Which store a spec names.
#[derive(Debug, Clone)]
pub enum StoreSpec {
    /// A ledger file.
    File(PathBuf),
    /// A PostgreSQL ledger: the URL as given (it may hold a password: never print it)
    /// and its description without the password.
    Postgres {
        /// The URL.
        url: String,
        /// The URL without its password.
        describe: String,
    },
}

impl StoreSpec {
    /// Reads a spec: a `postgres://` or `postgresql://` URL (checked to parse), else a
    /// file path.
    pub fn parse(spec: &str) -> Result<Self, StoreError> {
        if pg::is_postgres_url(spec) {
            let config = pg::parse_url(spec)?;
            return Ok(Self::Postgres {
                url: spec.to_owned(),
                describe: pg::describe_config(&config),
            });
        }
        if spec.is_empty() {
            return Err(StoreError::BadSpec {
                reason: "the ledger spec is empty: give a file path or a postgres:// URL".into(),
            });
        }
        Ok(Self::File(PathBuf::from(spec)))
    }

    /// The spec for messages (never a password).
    pub fn describe(&self) -> String {
        match self {
            Self::File(path) => path.display().to_string(),
            Self::Postgres { describe, .. } => describe.clone(),
        }
    }
}

/// Opens the existing store `spec` (for `privmix ledger raise` and the like); a store
/// that does not exist is [`StoreError::NotFound`].
pub fn open_existing(spec: &str) -> Result<Box<dyn LedgerStore>, StoreError> {
    Ok(match StoreSpec::parse(spec)? {
        StoreSpec::File(path) => {
            if !path.exists() {
                return Err(StoreError::NotFound {
                    store: path.display().to_string(),
                });
            }
            Box::new(FileStore::open(&path)?)
        }
        StoreSpec::Postgres { url, .. } => Box::new(PostgresStore::open(&url)?),
    })
}

/// The store a run will charge: an existing one, opened and checked, or the budget of
/// one to create once the run's inputs have loaded (so that a run failing on bad input
/// leaves no new ledger behind).
#[derive(Debug)]
pub enum StorePlan {
    /// An existing store protecting the run's adapters, with its budget.
    Open(Box<dyn LedgerStore>, PrivacyBudget),
    /// No store yet: create one at the spec with this budget.
    Create(StoreSpec, PrivacyBudget),
}

/// Opens and checks the store `spec` for charging releases computed from the adapters
/// `protected`, or, when it is absent, checks that `epsilon` (with `delta`, default
/// 1e-5) gives the budget to create it with ([`StorePlan::finish`] creates it).
///
/// An existing store must protect exactly `protected` and have a budget, and
/// `epsilon`/`delta` may only repeat that budget: more is
/// [`StoreError::BudgetRaiseNeeded`], less [`StoreError::BudgetNotRepeated`]. An absent
/// store without `epsilon` is [`StoreError::NotFound`].
pub fn prepare_store(
    spec: &str,
    protected: &ProtectedSet,
    epsilon: Option<f64>,
    delta: Option<f64>,
) -> Result<StorePlan, StoreError> {
    let spec = StoreSpec::parse(spec)?;
    let existing: Result<Box<dyn LedgerStore>, StoreError> = match &spec {
        StoreSpec::File(path) if !path.exists() => Err(StoreError::NotFound {
            store: spec.describe(),
        }),
        StoreSpec::File(path) => FileStore::open(path).map(|s| Box::new(s) as _),
        StoreSpec::Postgres { url, .. } => PostgresStore::open(url).map(|s| Box::new(s) as _),
    };
    match existing {
        Ok(store) => {
            let budget = check_existing(&*store, protected, epsilon, delta)?;
            Ok(StorePlan::Open(store, budget))
        }
        Err(StoreError::NotFound { store }) => {
            let Some(eps) = epsilon else {
                return Err(StoreError::NotFound { store });
            };
            let budget = PrivacyBudget::new(eps, delta.unwrap_or(DEFAULT_DELTA))?;
            Ok(StorePlan::Create(spec, budget))
        }
        Err(e) => Err(e),
    }
}

impl StorePlan {
    /// The store of the plan: the opened one, or a new one protecting `protected`
    /// (dp_accounting's default orders), announced on stderr. A store another process
    /// or replica created in between is opened and checked like any other (`epsilon`
    /// and `delta` are the flags [`prepare_store`] was given).
    pub fn finish(
        self,
        protected: &ProtectedSet,
        epsilon: Option<f64>,
        delta: Option<f64>,
    ) -> Result<(Box<dyn LedgerStore>, PrivacyBudget), StoreError> {
        let (spec, budget) = match self {
            Self::Open(store, budget) => return Ok((store, budget)),
            Self::Create(spec, budget) => (spec, budget),
        };
        match create(&spec, budget, protected) {
            Ok(created) => {
                announce(&*created, budget);
                Ok((created, budget))
            }
            // Created by another process or replica in between: use theirs, checked
            // like any other.
            Err(StoreError::AlreadyExists { .. }) => {
                let store = open_existing_spec(&spec)?;
                let budget = check_existing(&*store, protected, epsilon, delta)?;
                Ok((store, budget))
            }
            Err(e) => Err(e),
        }
    }
}

/// Opens the store `spec` for charging releases computed from the adapters
/// `protected`, creating it when absent with the budget `epsilon` (required then) and
/// `delta` (default 1e-5) over dp_accounting's default orders, announced on stderr:
/// [`prepare_store`] then [`StorePlan::finish`] at once.
pub fn open_store(
    spec: &str,
    protected: &ProtectedSet,
    epsilon: Option<f64>,
    delta: Option<f64>,
) -> Result<Box<dyn LedgerStore>, StoreError> {
    prepare_store(spec, protected, epsilon, delta)?
        .finish(protected, epsilon, delta)
        .map(|(store, _)| store)
}

fn open_existing_spec(spec: &StoreSpec) -> Result<Box<dyn LedgerStore>, StoreError> {
    Ok(match spec {
        StoreSpec::File(path) => Box::new(FileStore::open(path)?),
        StoreSpec::Postgres { url, .. } => Box::new(PostgresStore::open(url)?),
    })
}

fn create(
    spec: &StoreSpec,
    budget: PrivacyBudget,
    protected: &ProtectedSet,
) -> Result<Box<dyn LedgerStore>, StoreError> {
    let orders = Orders::dp_accounting_default();
    Ok(match spec {
        StoreSpec::File(path) => Box::new(FileStore::create(
            path,
            orders,
            Some(budget),
            protected.clone(),
        )?),
        StoreSpec::Postgres { url, .. } => Box::new(PostgresStore::create(
            url,
            orders,
            Some(budget),
            Some(protected.clone()),
        )?),
    })
}

/// An existing store must protect `protected`, have a budget, and the flags may only
/// repeat that budget.
pub(crate) fn check_existing(
    store: &dyn LedgerStore,
    protected: &ProtectedSet,
    epsilon: Option<f64>,
    delta: Option<f64>,
) -> Result<PrivacyBudget, StoreError> {
    store.check_protects(protected)?;
    let budget = store.budget().ok_or_else(|| StoreError::NoBudget {
        store: store.describe(),
    })?;
    if epsilon.is_none() && delta.is_none() {
        return Ok(budget);
    }
    let requested = PrivacyBudget::new(
        epsilon.unwrap_or(budget.epsilon()),
        delta.unwrap_or(budget.delta()),
    )?;
    if requested == budget {
        return Ok(budget);
    }
    if requested.epsilon() > budget.epsilon() || requested.delta() > budget.delta() {
        return Err(StoreError::BudgetRaiseNeeded {
            store: store.describe(),
            recorded: budget,
            requested,
        });
    }
    Err(StoreError::BudgetNotRepeated {
        store: store.describe(),
        recorded: budget,
    })
}

/// Creating a store is visible: printed once, on stderr.
fn announce(store: &dyn LedgerStore, budget: PrivacyBudget) {
    let set = store
        .protected_set()
        .map_or_else(|| "no adapter set".into(), ToString::to_string);
    eprintln!(
        "privmix: created ledger {} at {} with the budget ε = {}, δ = {}, protecting {set}",
        store.describe(),
        utc(now_ms()),
        budget.epsilon(),
        budget.delta()
    );
}

fn now_ms() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX))
}
