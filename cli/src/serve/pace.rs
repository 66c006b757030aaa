//! `privmix serve --step-time-ms N`: every request's events on a fixed release schedule.
//!
//! The engine sends each request one [`Note`] per step, as soon as the step is done,
//! and [`Note::Started`] when its first step starts. Without a schedule the relay
//! forwards the events at once. With one, step k's events (its piece of text, the end
//! of the request) are released at the deadline `start + (k + 1)·N`, `start` being
//! when the request's first step started ([`Pacer::deadline`], the schedule of
//! `privmix generate --step-time-ms`): however long the step took — the λ solvers'
//! evaluations, λ = 1 shortcuts, AdaPMixED's screening, SubMix's stopping, all of
//! which depend on the private members — the client receives its output at the same
//! moment. A step that releases nothing (text held back for a stop string) releases
//! nothing at its deadline, which is a function of the released text alone.
//!
//! A step not done by its deadline cannot be released on schedule. The relay does
//! not wait for it: at the deadline it ends the request with
//! `finish_reason: "step_overran"` (a data-independent moment), withholds whatever
//! that step produces (its token was charged: an over-count, the safe side) and drops
//! the engine's channel, so that the engine stops decoding the request at its next
//! step. The usage then sent is that of the steps released on time (the overrunning
//! step's charge, if any, is in the ledger only). That a deadline was missed remains
//! visible; choose N with a margin over the slowest step under the expected load.

use std::time::Instant;

use tokio::sync::mpsc::{UnboundedReceiver, UnboundedSender, unbounded_channel};

use super::engine::{Event, Finish, Note, PrivacyUsage, Usage};
use crate::pacing::Pacer;

/// Relays a request's notes as the events its handler sends, paced by `step_time_ms`
/// when it is set (see the module docs). `prompt_tokens`: for the usage of a request
/// that overran before any step was on time. When the returned receiver is dropped
/// (the client left), the relay drops `notes` at the next note, which ends the
/// request's decoding.
pub fn relay(
    notes: UnboundedReceiver<Note>,
    step_time_ms: Option<u64>,
    prompt_tokens: usize,
    delta: f64,
) -> UnboundedReceiver<Event> {
    let (tx, rx) = unbounded_channel();
    tokio::spawn(async move {
        match step_time_ms {
            None => forward(notes, tx).await,
            Some(ms) => paced(notes, ms, prompt_tokens, delta, tx).await,
        }
    });
    rx
}

/// Forwards every event as soon as its note arrives.
async fn forward(mut notes: UnboundedReceiver<Note>, tx: UnboundedSender<Event>) {
    while let Some(note) = notes.recv().await {
        let events = match note {
            Note::Now(e) => vec![e],
            Note::Started(_) => continue,
            Note::Step { events, .. } => events,
        };
        for e in events {
            let end = e.ends();
            if tx.send(e).is_err() || end {
                return;
            }
        }
        if tx.is_closed() {
            return;
        }
    }
}

/// Releases step k's events at `start + (k + 1)·period`, or ends the request at that
/// deadline when step k is not done by then.
async fn paced(
    mut notes: UnboundedReceiver<Note>,
    period_ms: u64,
    prompt_tokens: usize,
    delta: f64,
    tx: UnboundedSender<Event>,
) {
    // Before the first step only an admission failure can come (sent at once: no
    // private data was read).
    let start = match notes.recv().await {
        Some(Note::Started(at)) => at,
        Some(Note::Now(e)) => {
            let _ = tx.send(e);
            return;
        }
        Some(Note::Step { .. }) => Instant::now(),
        None => return,
    };
    let Ok(pacer) = Pacer::new(start, period_ms) else {
        return;
    };
    let mut usage = Usage {
        prompt_tokens,
        completion_tokens: 0,
        privacy: PrivacyUsage {
            epsilon_spent: 0.0,
            delta,
            total_epsilon_left: None,
            tenant_epsilon_left: None,
        },
    };
    let mut k = 0usize;
    loop {
        let deadline = tokio::time::Instant::from_std(pacer.deadline(k));
        match tokio::time::timeout_at(deadline, notes.recv()).await {
            Ok(Some(Note::Step {
                k: step,
                events,
                usage: after,
            })) => {
                debug_assert_eq!(step, k, "one note per step, in order");
                tokio::time::sleep_until(deadline).await;
                for e in events {
                    let end = e.ends();
                    if tx.send(e).is_err() || end {
                        return;
                    }
                }
                if tx.is_closed() {
                    return;
                }
                if let Some(after) = after {
                    usage = after;
                }
                k += 1;
            }
            // Not sent after the first step.
            Ok(Some(Note::Started(_) | Note::Now(_))) => {}
            // The engine let the request go (shutdown, or an engine failure).
            Ok(None) => return,
            Err(_) => {
                let _ = tx.send(Event::Done {
                    finish: Finish::StepOverran,
                    usage,
                });
                return;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    fn usage(tokens: usize) -> Usage {
        Usage {
            prompt_tokens: 3,
            completion_tokens: tokens,
            privacy: PrivacyUsage {
                epsilon_spent: 0.1 * tokens as f64,
                delta: 1e-5,
                total_epsilon_left: None,
                tenant_epsilon_left: None,
            },
        }
    }

    /// A fake engine: `steps` steps, step k taking `cost(k)`, each releasing one piece
    /// of text and the last the end. Returns when (after the first step started) each
    /// event reached the handler, and the events.
    async fn run(
        period_ms: u64,
        steps: usize,
        cost: impl Fn(usize) -> Duration + Send + 'static,
    ) -> (Vec<Duration>, Vec<Event>) {
        let (notes_tx, notes) = unbounded_channel();
        let mut events = relay(notes, Some(period_ms), 3, 1e-5);
        let start = Instant::now();
        std::thread::spawn(move || {
            let _ = notes_tx.send(Note::Started(start));
            for k in 0..steps {
                std::thread::sleep(cost(k));
                let mut ev = vec![Event::Text(format!("t{k}"))];
                if k + 1 == steps {
                    ev.push(Event::Done {
                        finish: Finish::Length,
                        usage: usage(k + 1),
                    });
                }
                if notes_tx
                    .send(Note::Step {
                        k,
                        events: ev,
                        usage: Some(usage(k + 1)),
                    })
                    .is_err()
                {
                    return;
                }
            }
        });
        let (mut at, mut got) = (Vec::new(), Vec::new());
        while let Some(e) = events.recv().await {
            at.push(start.elapsed());
            got.push(e);
        }
        (at, got)
    }

    /// Steps that take 1 ms and steps that take up to 70 ms (both under the 100 ms
    /// period) release the same events at the same offsets, k·100 ms + 100 ms, to the
    /// timer's precision (the tolerance, 40 ms, is for a loaded test machine; a relay
    /// that did not wait would release before the deadline and fail).
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn release_times_do_not_depend_on_the_steps_work() {
        let (fast_at, fast) = run(100, 4, |_| Duration::from_millis(1)).await;
        let (slow_at, slow) = run(100, 4, |k| Duration::from_millis(10 + 20 * k as u64)).await;
        assert_eq!(fast, slow);
        assert_eq!(fast.len(), 5);
        // The text of step k and (for the last step) the end, at step k's deadline.
        let step_of = [0, 1, 2, 3, 3];
        for (i, k) in step_of.iter().enumerate() {
            let want = Duration::from_millis(100 * (*k as u64 + 1));
            for at in [fast_at[i], slow_at[i]] {
                assert!(at >= want, "event {i} at {at:?} before {want:?}");
                assert!(
                    at < want + Duration::from_millis(40),
                    "event {i} at {at:?}, due {want:?}"
                );
            }
        }
    }

    /// A step done after its deadline is withheld: the request ends at that deadline
    /// with `step_overran` and the usage of the steps released on time.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn an_overrunning_step_is_withheld_and_ends_the_request_at_its_deadline() {
        let (at, got) = run(60, 4, |k| {
            Duration::from_millis(if k == 2 { 300 } else { 1 })
        })
        .await;
        assert_eq!(got.len(), 3, "{got:?}");
        assert_eq!(got[0], Event::Text("t0".into()));
        assert_eq!(got[1], Event::Text("t1".into()));
        assert_eq!(
            got[2],
            Event::Done {
                finish: Finish::StepOverran,
                usage: usage(2),
            }
        );
        // Released at step 2's deadline, 180 ms, not when step 2 finished (~302 ms).
        assert!(at[2] >= Duration::from_millis(180), "{:?}", at[2]);
        assert!(at[2] < Duration::from_millis(240), "{:?}", at[2]);
    }

    /// Without a schedule, events pass at once; an admission failure is sent at once.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn unpaced_and_admission_failures_pass_at_once() {
        let (tx, notes) = unbounded_channel();
        let mut events = relay(notes, None, 1, 1e-5);
        tx.send(Note::Started(Instant::now())).unwrap();
        tx.send(Note::Step {
            k: 0,
            events: vec![Event::Text("a".into())],
            usage: None,
        })
        .unwrap();
        assert_eq!(events.recv().await, Some(Event::Text("a".into())));
        let (tx, notes) = unbounded_channel();
        let mut events = relay(notes, Some(10_000), 1, 1e-5);
        tx.send(Note::Now(Event::Failed("no".into()))).unwrap();
        let t = Instant::now();
        assert_eq!(events.recv().await, Some(Event::Failed("no".into())));
        assert!(t.elapsed() < Duration::from_secs(1));
        assert_eq!(events.recv().await, None);
    }
}
