//! A durable privacy ledger: charge events to a ledger in a temporary
//! directory, reopen it as a restart would, list the records with their
//! events, and re-account the whole run over finer orders.
//!
//! Run: `cargo run -p privmix-accountant --example ledger`

use privmix_accountant::{
    DpEvent, EntryKind, Ledger, LedgerReader, Orders, PrivacyBudget, RdpCurve,
};

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let dir = std::env::temp_dir().join(format!("privmix-ledger-example-{}", std::process::id()));
    std::fs::create_dir_all(&dir)?;
    let path = dir.join("run.ledger");
    let delta = 1e-6;

    // A coarse order set for the live budget check.
    let coarse = Orders::new(vec![2.0, 4.0, 8.0, 16.0, 32.0, 64.0])?;
    let budget = PrivacyBudget::new(4.0, delta)?;
    let mut ledger = Ledger::create(&path, coarse.clone(), Some(budget))?;

    let sgd_epoch = DpEvent::gaussian(1.0)?
        .poisson_sampled(0.01)?
        .self_composed(100)?;
    let histogram = DpEvent::laplace(20.0)?;
    let survey = DpEvent::randomized_response(0.5, 4)?.sampled_without_replacement(10_000, 100)?;
    ledger.charge_event(&sgd_epoch, "sgd epoch 0")?;
    ledger.charge_event(&histogram, "label histogram")?;
    ledger.charge_event(&survey, "survey answers")?;
    ledger.charge_event(&sgd_epoch, "sgd epoch 1")?;
    // A charge known only by its measured curve carries no event.
    let measured = RdpCurve::from_fn(coarse.clone(), |a| a / 2000.0)?;
    ledger.charge(&measured, "measured release")?;
    let live = ledger.spent_epsilon(delta)?;
    drop(ledger);

    // After a restart: every record is still there.
    println!("ledger {}", path.display());
    for entry in LedgerReader::open(&path)? {
        let entry = entry?;
        if let EntryKind::Charge { label, curve } = &entry.kind {
            let event = entry.event().map_or("(curve only)", DpEvent::name);
            println!(
                "  #{} {label:<16} {event:<28} ε at α = 8: {:.6}",
                entry.sequence,
                curve.at(8.0)?
            );
        }
    }
    let ledger = Ledger::open(&path)?;
    println!(
        "spent, as charged over {} orders: ε = {:.6} at δ = {delta:e} (order {})",
        coarse.len(),
        live.epsilon,
        live.order
    );

    // Re-account the run from its events over dp_accounting's finer orders:
    // events are evaluated exactly there, the curve-only charge is read from
    // the next recorded order above.
    let fine = Orders::dp_accounting_default();
    let again = ledger.events()?.rdp(&fine)?.epsilon(delta)?;
    println!(
        "re-accounted over {} orders:      ε = {:.6} at δ = {delta:e} (order {})",
        fine.len(),
        again.epsilon,
        again.order
    );
    assert!(again.epsilon <= live.epsilon);
    drop(ledger);
    std::fs::remove_dir_all(&dir)?;
    Ok(())
}
