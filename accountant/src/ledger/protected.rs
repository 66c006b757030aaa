//! The identity of what a ledger protects: the set of private artefacts (for
//! privmix, the member adapters' weight files) whose privacy loss it adds up.
//!
//! A privacy budget only means something if every release about the same
//! private data is charged to the same ledger. A ledger therefore records, in
//! its header, which data it accounts for, and a caller loading private data
//! checks that the ledger it charges names exactly that data
//! ([`Ledger::check_protects`](super::Ledger::check_protects)); otherwise the
//! same data could be spent against several ledgers, each with a full budget.
//!
//! The accountant does not know what the members are: it stores opaque,
//! caller-chosen strings (privmix's command line uses `sha256:<hex>` of each
//! adapter's weight file) in a canonical order, so the same set loaded in
//! another order is the same identity.

use std::fmt;

/// Most members one protected set may name (bounds what a damaged header
/// can make a reader allocate).
pub const MAX_PROTECTED_MEMBERS: usize = 1 << 16;
/// Longest identity string of one member, in bytes.
pub const MAX_MEMBER_ID_BYTES: usize = 256;

/// The identities of the private members a ledger protects, sorted (byte
/// order) so that the order they were loaded in does not matter; a member
/// given twice is kept twice (the same data used twice is a different
/// configuration from the data used once).
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct ProtectedSet {
    members: Vec<String>,
}

impl ProtectedSet {
    /// A set from member identities, checked as [`ProtectedSet::new`] describes;
    /// `Err` is the message of [`LedgerError::BadProtectedSet`]. (`new` itself is
    /// in `ledger.rs`, above both this module and the error's, so that neither of
    /// the two imports the other's.)
    ///
    /// [`LedgerError::BadProtectedSet`]: super::LedgerError::BadProtectedSet
    pub(super) fn checked(mut members: Vec<String>) -> Result<Self, String> {
        if members.len() > MAX_PROTECTED_MEMBERS {
            return Err(format!(
                "{} members; at most {MAX_PROTECTED_MEMBERS} may be recorded",
                members.len()
            ));
        }
        for (i, m) in members.iter().enumerate() {
            if m.is_empty() || m.len() > MAX_MEMBER_ID_BYTES {
                return Err(format!(
                    "member {i}'s identity is {} bytes long; it must be 1 to {MAX_MEMBER_ID_BYTES}",
                    m.len()
                ));
            }
            if !m.bytes().all(|b| b.is_ascii_graphic()) {
                return Err(format!(
                    "member {i}'s identity {m:?} has a character other than printable ASCII"
                ));
            }
        }
        members.sort_unstable();
        Ok(Self { members })
    }

    /// The member identities, in canonical (sorted) order.
    pub fn members(&self) -> &[String] {
        &self.members
    }

    /// How many members the set names.
    pub fn len(&self) -> usize {
        self.members.len()
    }

    /// Whether the set names no member.
    pub fn is_empty(&self) -> bool {
        self.members.is_empty()
    }

    /// `; only in the ledger: […]; only in this run: […]` (the parts that apply), for
    /// messages about a ledger recording `self` opened for the members `loaded`.
    pub fn difference_text(&self, loaded: &Self) -> String {
        let mut out = String::new();
        let only_recorded = self.missing_from(loaded);
        if !only_recorded.is_empty() {
            out.push_str(&format!(
                "; only in the ledger: [{}]",
                only_recorded.join(", ")
            ));
        }
        let only_loaded = loaded.missing_from(self);
        if !only_loaded.is_empty() {
            out.push_str(&format!("; only in this run: [{}]", only_loaded.join(", ")));
        }
        out
    }

    /// The members of `self` that `other` lacks (counting repeats).
    pub fn missing_from(&self, other: &Self) -> Vec<String> {
        let mut rest: Vec<&String> = other.members.iter().collect();
        let mut missing = Vec::new();
        for m in &self.members {
            match rest.iter().position(|r| *r == m) {
                Some(i) => {
                    rest.swap_remove(i);
                }
                None => missing.push(m.clone()),
            }
        }
        missing
    }
}

impl fmt::Display for ProtectedSet {
    /// `{n} member(s) [a, b, …]`.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let s = if self.members.len() == 1 { "" } else { "s" };
        write!(
            f,
            "{} member{s} [{}]",
            self.members.len(),
            self.members.join(", ")
        )
    }
}
