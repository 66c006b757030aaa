//! The Markdown of one perplexity experiment (a privacy unit's table).

use std::fmt::Write as _;

use crate::experiment::canary::CanaryAudit;
use crate::experiment::long::LongDeployment;
use crate::experiment::{DpSgdRun, ExperimentResults, SummaryRow};

fn fmt_interval(i: Option<crate::stats::Interval>, digits: usize) -> String {
    i.map_or("∞".into(), |i| i.display(digits))
}

fn row(m: &SummaryRow) -> String {
    let pct = |x: f64| format!("{:.1}%", 100.0 * x);
    format!(
        "| {} | {} | {} | {} | {} | {} | {} | {} |",
        m.mechanism,
        m.target_epsilon.map_or("—".into(), |e| format!("{e}")),
        fmt_interval(m.perplexity, 2),
        m.spent_epsilon.map_or("∞".into(), |i| i.display(3)),
        pct(m.shares.0),
        pct(m.shares.1),
        pct(m.shares.2),
        m.parameters
    )
}

fn sweep_row(r: &DpSgdRun) -> String {
    format!(
        "| {} | {} | {} | {} | {:.4} | {:.4} | {:.3} | {} | {:.4} | {} |",
        r.target_epsilon,
        r.learning_rate,
        r.epochs,
        r.steps,
        r.q,
        r.sigma,
        r.epsilon,
        r.epsilon_pld.map_or("—".into(), |e| format!("{e:.3}")),
        r.validation_loss,
        if r.chosen { "chosen" } else { "" }
    )
}

/// The section of one experiment, under `title`; `plots` are file names in the
/// report folder.
pub fn markdown(title: &str, results: &ExperimentResults, plots: &[String]) -> String {
    let c = &results.config;
    let mut s = String::new();
    let queries = results.summary.first().map_or(0, |m| m.queries);
    let _ = writeln!(s, "## {title}\n");
    let _ = writeln!(
        s,
        "**Privacy unit: {}. Adjacency: add or remove one unit.** Every unit is assigned to a \
         member by a keyed hash of its id, so a neighbouring dataset changes one member's data \
         and no other placement: the changed-member charge of PMixED, AdaPMixED, SubMix, \
         S&A-Laplace and GNMax covers it, and DP-SGD's Poisson-sampled add/remove accounting \
         (the RDP of its Poisson-subsampled discrete Gaussian noise) is over the same unit. \
         Every ε is rounded up; δ = {}.\n",
        results.unit, c.delta
    );
    let (public_loss, member_losses) = &results.validation;
    let mean_member = member_losses.iter().sum::<f64>() / member_losses.len().max(1) as f64;
    let (lo, hi) = member_losses
        .iter()
        .fold((f64::INFINITY, f64::NEG_INFINITY), |(a, b), &x| {
            (a.min(x), b.max(x))
        });
    let blocks: usize = results.member_blocks.iter().sum();
    let _ = writeln!(
        s,
        "Model `{}`; corpus `{}`: {} units trained on ({blocks} blocks of {} tokens), plays held \
         out for evaluation: {}. {} members (LoRA rank {} on {}, {} epochs, batch {}, lr {}; \
         {}–{} steps each), {} SubMix parts of two members. {} seeds, each an independent \
         deployment with its own {} held-out blocks = {queries} queries, randomness and budgets.\n",
        c.model.display(),
        c.corpus_dir.display(),
        results.units,
        c.block,
        results.held_out_plays.join(", "),
        c.members,
        c.training.rank,
        c.training.targets.join("/"),
        c.training.epochs,
        c.training.batch,
        c.training.learning_rate,
        results.member_steps.iter().min().unwrap_or(&0),
        results.member_steps.iter().max().unwrap_or(&0),
        c.members / 2,
        results.seeds.len(),
        c.eval_blocks,
    );
    let _ = writeln!(
        s,
        "Validation loss (nats per token, {} held-out blocks): public model {public_loss:.4}; \
         members {mean_member:.4} on average ({lo:.4}–{hi:.4}) — the members' figures are a \
         private diagnostic (computed from their weights, released by no mechanism){}.\n",
        c.validation_blocks,
        if results.members_cached {
            "; adapters from the cache"
        } else {
            ""
        }
    );
    if !results.member_lr_sweep.is_empty() {
        let _ = writeln!(
            s,
            "The members' learning rate is tuned over the same grid as DP-SGD's (and the \
             plan's own), by their mean validation loss: {}; chosen {}.\n",
            results
                .member_lr_sweep
                .iter()
                .map(|(lr, loss)| format!("lr {lr}: {loss:.4}"))
                .collect::<Vec<_>>()
                .join(", "),
            c.training.learning_rate
        );
    }
    if c.training_per_seed {
        let _ = writeln!(
            s,
            "**Training variance.** Each seed row fine-tunes its own members, DP-SGD models \
             and fine-tuned model (training seeds apart per row), so every interval holds the \
             variance of training as well as of the queries and the mechanisms' randomness; \
             the DP-SGD sweep and the members' learning rate are chosen once, on seed row 0, \
             whose models also serve the long deployment and whose validation losses are \
             shown.\n"
        );
    }
    if !results.dp_sgd_sweep.is_empty() {
        let _ = writeln!(
            s,
            "### DP-SGD: the sweep and the chosen setting\n\n\
             Each learning rate × epochs pair is trained at the largest target ε with σ from the \
             accountant for its steps and sampling rate, and validated on the held-out \
             validation blocks; the lowest validation loss is chosen and trained at every ε. \
             (The selection reads validation blocks only and is not charged, in DP-SGD's \
             favour.) ε is charged by the RDP of the Poisson-subsampled discrete Gaussian \
             noise, as the mixing methods are charged through RDP; ε by the PLD accountant \
             (of the continuous Gaussian, dp_accounting's grid) is shown beside it.\n\n\
             | target ε | lr | epochs | steps | q | σ | ε (RDP) | ε (PLD) | validation loss | |\n\
             |---|---|---|---|---|---|---|---|---|---|"
        );
        for r in &results.dp_sgd_sweep {
            let _ = writeln!(s, "{}", sweep_row(r));
        }
        let _ = writeln!(
            s,
            "\nAt every target ε:\n\n| target ε | lr | epochs | steps | q | σ | ε (RDP) | ε (PLD) | validation loss | |\n|---|---|---|---|---|---|---|---|---|---|"
        );
        for r in &results.dp_sgd {
            let _ = writeln!(s, "{}", sweep_row(r));
        }
        s.push('\n');
    }
    let _ = writeln!(
        s,
        "### Perplexity and privacy\n\n\
         Every held-out position is one query, charged as if its token were released; \
         perplexity is exp(mean NLL) over a seed's queries, reported as the geometric mean over \
         seeds [95% Student-t interval of the seeds' log-perplexities, mapped back by exp]. 'spent ε' is the accountant's (ε, δ) after all of a seed's \
         queries. PMixED and SubMix are calibrated to spend the target over exactly these \
         queries; AdaPMixED's member filter is calibrated so the whole run fits the target; when \
         a budget refuses a charge the public model answers ('budget out'). S&A-Laplace and \
         GNMax are calibrated to the run's queries and, in the `(B=1)` rows, to a single query \
         (each query then a deployment of its own, as the SubMix paper's Fig. 2 end point); \
         their perplexity is read from the law of the released token (S&A: the ratio of \
         expectations; GNMax: the SubMix paper's lower bound on perplexity, in its favour). \
         DP-SGD's ε is its training's.\n"
    );
    let _ = writeln!(
        s,
        "| mechanism | target ε | perplexity | spent ε | private answers | screened | budget out | parameters |\n|---|---|---|---|---|---|---|---|"
    );
    for m in &results.summary {
        let _ = writeln!(s, "{}", row(m));
    }
    let _ = writeln!(s, "\nPhases:");
    for (phase, secs) in &results.phases {
        let _ = writeln!(s, "- {phase}: {secs:.0} s");
    }
    let _ = writeln!(
        s,
        "\n### Plots\n\nPerplexity is the mean over seeds; the traces are seed 0's. The λ plot \
         shows private diagnostics: λ is computed from the members' data, is never released by a \
         mechanism, and is shown here for analysis only.\n"
    );
    for p in plots {
        let _ = writeln!(s, "![{p}]({p})\n");
    }
    if let Some(long) = &results.long_deployment {
        s.push_str(&long_markdown(long));
    }
    if let Some(audit) = &results.canary {
        s.push_str(&canary_markdown(audit));
    }
    s
}

fn long_markdown(d: &LongDeployment) -> String {
    let pct = |x: f64| format!("{:.1}%", 100.0 * x);
    let mut s = String::new();
    let _ = writeln!(
        s,
        "### One long deployment (AdaPMixED, arXiv:2410.02016, Table 1: 99,840 queries)\n\n\
         {} queries over {} held-out blocks, one budget per mechanism calibrated to all of them, \
         at the largest target ε. Perplexity over all the queries; the interval is over {} \
         consecutive runs of the blocks (one deployment: the runs share the mechanisms' \
         state).\n",
        d.queries,
        d.blocks,
        d.rows.first().map_or(0, |r| r.chunk_perplexities.len())
    );
    let _ = writeln!(
        s,
        "| mechanism | target ε | perplexity | over runs | spent ε | private answers | screened | budget out | parameters |\n|---|---|---|---|---|---|---|---|---|"
    );
    for r in &d.rows {
        let _ = writeln!(
            s,
            "| {} | {} | {:.2} | {} | {} | {} | {} | {} | {} |",
            r.mechanism,
            r.target_epsilon.map_or("—".into(), |e| format!("{e}")),
            r.perplexity,
            fmt_interval(r.interval, 2),
            r.spent_epsilon.map_or("∞".into(), |e| format!("{e:.3}")),
            pct(r.shares.0),
            pct(r.shares.1),
            pct(r.shares.2),
            r.parameters
        );
    }
    s.push('\n');
    s
}

fn canary_markdown(audit: &CanaryAudit) -> String {
    let p = &audit.plan;
    let mut s = String::new();
    let _ = writeln!(
        s,
        "### Canary extraction (SubMix, arXiv:2201.00971, §4.2)\n\n\
         {} canaries `Record k: the PIN of account <name> is d d d d d d`, each repeated {} times \
         as one unit's text, given to member k mod N beside as many of its own blocks; audit \
         members fine-tuned {} epochs at lr {} ({:.0} s with the scoring). Recall = the share of \
         canaries that greedy decoding from the prefix reproduces (the SubMix paper's Fig. 4); \
         hit rate = the probability that one sampled continuation reproduces the six digits, \
         averaged over canaries; a uniform guess scores {:.0e}. Each mechanism has its own \
         account over exactly these queries.\n",
        p.canaries, p.repeats, p.epochs, p.learning_rate, audit.seconds, audit.uniform_hit_rate
    );
    let _ = writeln!(
        s,
        "| mechanism | target ε | recall | hit rate | log₁₀ P per canary | spent ε |\n|---|---|---|---|---|---|"
    );
    for r in &audit.results {
        let logs: Vec<String> = r
            .log10_probabilities
            .iter()
            .map(|l| format!("{l:.1}"))
            .collect();
        let _ = writeln!(
            s,
            "| {} | {} | {:.2} | {:.3e} | {} | {} |",
            r.mechanism,
            r.target_epsilon.map_or("—".into(), |e| format!("{e}")),
            r.recall,
            r.hit_rate,
            logs.join(", "),
            r.spent_epsilon.map_or("∞".into(), |e| format!("{e:.3}"))
        );
    }
    s.push('\n');
    s
}
