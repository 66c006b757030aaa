//! Where a step's charge goes before its token is released.

use privmix_accountant::{AccountantError, Budget, DpEvent, Ledger, LedgerError, Orders, RdpCurve};

use crate::MechanismError;

/// A privacy account: an in-memory budget, a durable ledger, or both.
///
/// `charge` must make the charge permanent (a ledger syncs it to disk) before it
/// returns `Ok`, and must refuse — returning [`MechanismError::ChargeRefused`]
/// and recording nothing — a charge that would exceed the account's budget.
pub trait Account {
    /// The orders charges must be expressed at.
    fn orders(&self) -> &Orders;
    /// Records a charge, or refuses it.
    fn charge(&mut self, curve: &RdpCurve, label: &str) -> Result<(), MechanismError>;

    /// Records the charge of a structured event (its RDP curve at
    /// [`orders`](Account::orders)), or refuses it. An account that keeps records
    /// (the [`Ledger`]) stores the event itself, so the run can be re-accounted
    /// later with another method; by default only its curve is charged.
    fn charge_event(&mut self, event: &DpEvent, label: &str) -> Result<(), MechanismError> {
        let curve = event.rdp(self.orders())?;
        self.charge(&curve, label)
    }
}

/// The accountant's in-memory (ε, δ) budget: a charge that would take the
/// composed spend above ε at δ is refused and changes nothing.
impl Account for Budget {
    fn orders(&self) -> &Orders {
        self.spent().orders()
    }

    fn charge(&mut self, curve: &RdpCurve, _label: &str) -> Result<(), MechanismError> {
        match self.try_charge(curve) {
            Ok(_) => Ok(()),
            Err(e @ AccountantError::BudgetExceeded { .. }) => {
                Err(MechanismError::ChargeRefused(e.to_string()))
            }
            Err(e) => Err(e.into()),
        }
    }
}

/// The accountant's durable ledger: `Ledger::charge` syncs the record to disk
/// before it returns `Ok`, so a token is released only after its charge would
/// survive a crash. A budget refusal becomes [`MechanismError::ChargeRefused`]
/// with the ledger's message; other ledger failures are
/// [`MechanismError::Ledger`].
impl Account for Ledger {
    fn orders(&self) -> &Orders {
        Ledger::orders(self)
    }

    fn charge(&mut self, curve: &RdpCurve, label: &str) -> Result<(), MechanismError> {
        ledger_outcome(Ledger::charge(self, curve, label).map(|_| ()))
    }

    /// The event is stored in the ledger's record beside its curve; a ledger file
    /// of a format older than events (before 3) records the curve alone.
    fn charge_event(&mut self, event: &DpEvent, label: &str) -> Result<(), MechanismError> {
        match Ledger::charge_event(self, event, label) {
            Err(LedgerError::EventsNeedVersion { .. }) => {
                let curve = event.rdp(Ledger::orders(self))?;
                ledger_outcome(Ledger::charge(self, &curve, label).map(|_| ()))
            }
            outcome => ledger_outcome(outcome.map(|_| ())),
        }
    }
}

/// A ledger's budget refusal as [`MechanismError::ChargeRefused`], its other
/// failures as [`MechanismError::Ledger`].
fn ledger_outcome(outcome: Result<(), LedgerError>) -> Result<(), MechanismError> {
    match outcome {
        Ok(()) => Ok(()),
        Err(e @ LedgerError::BudgetExceeded { .. }) => {
            Err(MechanismError::ChargeRefused(e.to_string()))
        }
        Err(e) => Err(e.into()),
    }
}

/// An account with NO budget: it accepts every charge, including +∞, and only
/// sums them (rounded up, like every composition).
///
/// For non-private baselines (whose honest charge is +∞) and benchmarks. It
/// provides no privacy protection whatsoever: never serve private text through it.
#[derive(Debug, Clone, PartialEq)]
pub struct Unbudgeted {
    spent: RdpCurve,
    charges: u64,
}

impl Unbudgeted {
    /// A fresh account over `orders`.
    pub fn new(orders: Orders) -> Self {
        Self {
            spent: RdpCurve::zero(orders),
            charges: 0,
        }
    }

    /// Everything charged so far, composed (may be +∞).
    pub fn spent(&self) -> &RdpCurve {
        &self.spent
    }

    /// How many charges were accepted.
    pub fn charges(&self) -> u64 {
        self.charges
    }
}

impl Account for Unbudgeted {
    fn orders(&self) -> &Orders {
        self.spent.orders()
    }

    fn charge(&mut self, curve: &RdpCurve, _label: &str) -> Result<(), MechanismError> {
        self.spent = self.spent.compose(curve)?;
        self.charges += 1;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use privmix_accountant::PrivacyBudget;

    /// A folder of this test's own and the path of a ledger in it that does not exist yet.
    fn fresh_ledger_path(tag: &str) -> (std::path::PathBuf, std::path::PathBuf) {
        let dir = std::env::temp_dir().join(format!(
            "privmix-mech-{tag}-{}-{:?}",
            std::process::id(),
            std::thread::current().id()
        ));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("ledger");
        let _ = std::fs::remove_file(&path);
        (dir, path)
    }

    fn step_curve(orders: &Orders) -> RdpCurve {
        RdpCurve::from_fn(orders.clone(), |a| a / 50.0).unwrap()
    }

    #[test]
    fn budget_refuses_the_overspending_charge_and_keeps_its_state() {
        let orders = Orders::default();
        let mut budget = Budget::new(orders.clone(), 1.0, 1e-5).unwrap();
        let mut accepted = 0;
        loop {
            let before = budget.clone();
            match Account::charge(&mut budget, &step_curve(&orders), "t") {
                Ok(()) => accepted += 1,
                Err(MechanismError::ChargeRefused(msg)) => {
                    assert!(msg.contains("exceed") || msg.contains("budget"), "{msg}");
                    assert_eq!(budget, before);
                    break;
                }
                Err(e) => panic!("{e}"),
            }
        }
        assert!(accepted >= 1);
        assert!(budget.spent_epsilon(1e-5).unwrap().epsilon <= 1.0);
        // A zero charge (public answer) is still accepted when spent.
        Account::charge(&mut budget, &RdpCurve::zero(orders.clone()), "p0").unwrap();
        // Orders that differ are an accountant error, not a refusal.
        let other = RdpCurve::zero(Orders::integers(4).unwrap());
        assert!(matches!(
            Account::charge(&mut budget, &other, "x"),
            Err(MechanismError::Accountant(_))
        ));
    }

    #[test]
    fn ledger_is_durable_and_refusals_are_typed() {
        let (dir, path) = fresh_ledger_path("account");
        let orders = Orders::default();
        let budget = PrivacyBudget::new(1.0, 1e-5).unwrap();
        let mut accepted = 0u64;
        {
            let mut ledger = Ledger::create(&path, orders.clone(), Some(budget)).unwrap();
            assert_eq!(Account::orders(&ledger), &orders);
            loop {
                match Account::charge(&mut ledger, &step_curve(&orders), "step") {
                    Ok(()) => accepted += 1,
                    Err(MechanismError::ChargeRefused(msg)) => {
                        assert!(msg.contains("refused"), "{msg}");
                        break;
                    }
                    Err(e) => panic!("{e}"),
                }
            }
            let long = "x".repeat(privmix_accountant::MAX_LABEL_BYTES + 1);
            assert!(matches!(
                Account::charge(&mut ledger, &RdpCurve::zero(orders.clone()), &long),
                Err(MechanismError::Ledger(_))
            ));
        }
        let reopened = Ledger::open(&path).unwrap();
        assert_eq!(reopened.charges(), accepted);
        drop(reopened);
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn unbudgeted_sums_everything_including_infinity() {
        let orders = Orders::integers(8).unwrap();
        let mut acc = Unbudgeted::new(orders.clone());
        acc.charge(&step_curve(&orders), "a").unwrap();
        acc.charge(&step_curve(&orders), "b").unwrap();
        assert_eq!(acc.spent().at(5.0).unwrap(), 0.2);
        let inf = RdpCurve::from_fn(orders.clone(), |_| f64::INFINITY).unwrap();
        acc.charge(&inf, "np").unwrap();
        assert_eq!(acc.spent().at(2.0).unwrap(), f64::INFINITY);
        assert_eq!(acc.charges(), 3);
    }

    /// An event charged to a ledger is stored with its record and read back; a
    /// budget charged an event only has its curve; a refused event charge records
    /// nothing.
    #[test]
    fn ledger_stores_charged_events() {
        let (dir, path) = fresh_ledger_path("events");
        let orders = Orders::default();
        let budget = PrivacyBudget::new(1.0, 1e-5).unwrap();
        let gaussian = DpEvent::gaussian(20.0).unwrap();
        {
            let mut ledger = Ledger::create(&path, orders.clone(), Some(budget)).unwrap();
            Account::charge_event(&mut ledger, &DpEvent::NoOp, "public").unwrap();
            Account::charge_event(&mut ledger, &gaussian, "gnmax").unwrap();
            let huge = DpEvent::gaussian(1e-3).unwrap();
            assert!(matches!(
                Account::charge_event(&mut ledger, &huge, "too much"),
                Err(MechanismError::ChargeRefused(_))
            ));
        }
        let ledger = Ledger::open(&path).unwrap();
        let events: Vec<Option<DpEvent>> = ledger
            .entries()
            .unwrap()
            .map(|e| e.unwrap().event)
            .collect();
        assert_eq!(events, vec![Some(DpEvent::NoOp), Some(gaussian.clone())]);
        assert_eq!(ledger.spent(), &gaussian.rdp(&orders).unwrap());

        let mut in_memory = Budget::new(orders.clone(), 1.0, 1e-5).unwrap();
        Account::charge_event(&mut in_memory, &gaussian, "gnmax").unwrap();
        assert_eq!(in_memory.spent(), &gaussian.rdp(&orders).unwrap());
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
