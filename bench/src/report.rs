//! The report folder of the privacy–utility experiment: `results.json` (every
//! measured value), `README.md` (the tables) and the SVG plots.

use std::fmt::Write as _;
use std::path::Path;

use serde::{Deserialize, Serialize};

use crate::error::BenchError;
use crate::experiment::canary::CanaryAudit;
use crate::experiment::{ExperimentResults, MechanismResult};
use crate::icl::IclResults;
use crate::plots::draw_all;

mod icl;
pub use icl::icl_markdown;
use icl::icl_plot;

/// Everything one run of the binary measured (`results.json`).
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Report {
    /// The perplexity experiment, when run.
    pub perplexity: Option<ExperimentResults>,
    /// The ICL experiment, when run.
    pub icl: Option<IclResults>,
}

fn fmt_eps(e: Option<f64>) -> String {
    match e {
        Some(e) => format!("{e:.3}"),
        None => "∞".into(),
    }
}

fn row(m: &MechanismResult) -> String {
    let share = |k: u64| format!("{:.1}%", 100.0 * k as f64 / m.queries.max(1) as f64);
    format!(
        "| {} | {} | {:.3} | {} | {} | {} | {} | {} |",
        m.mechanism,
        m.target_epsilon.map_or("—".into(), |e| format!("{e}")),
        m.perplexity,
        fmt_eps(m.spent_epsilon),
        m.private_answers,
        share(m.screened),
        share(m.stopped),
        m.parameters
    )
}

/// The Markdown section of the perplexity experiment.
pub fn markdown(results: &ExperimentResults, plots: &[String]) -> String {
    let c = &results.config;
    let mut s = String::new();
    let queries = results.results.first().map_or(0, |m| m.queries);
    let _ = writeln!(
        s,
        "## Perplexity against ε (PMixED, AdaPMixED, SubMix, DP-SGD)\n"
    );
    let _ = writeln!(
        s,
        "Model `{}`; private corpus `{}` with users = {}; {} users ({} in training parts, {} held out). \
         {} members (LoRA rank {}, {} steps of {} blocks of {} tokens, lr {}), {} SubMix parts of two halves. \
         {} held-out blocks = {queries} queries. δ = {}. Seed {}.\n",
        c.model.display(),
        c.corpus_dir.display(),
        c.user_unit,
        results.users.0,
        results.users.1,
        results.users.2,
        c.members,
        c.training.rank,
        c.training.steps,
        c.training.batch,
        c.block,
        c.training.learning_rate,
        c.members / 2,
        c.eval_blocks,
        c.delta,
        c.seed,
    );
    let _ = writeln!(
        s,
        "Time: data {:.0} s, fine-tuning {:.0} s{}, scoring {:.0} s.\n",
        results.seconds.0,
        results.seconds.1,
        if results.members_cached {
            " (adapters from the cache)"
        } else {
            ""
        },
        results.seconds.2
    );
    let _ = writeln!(
        s,
        "## Members\n\n| member | training blocks | held-out loss before → after |\n|---|---|---|"
    );
    for (i, (blocks, (before, after))) in results
        .member_blocks
        .iter()
        .zip(&results.member_losses)
        .enumerate()
    {
        let _ = writeln!(s, "| {i} | {blocks} | {before:.4} → {after:.4} |");
    }
    let _ = writeln!(
        s,
        "\n### Perplexity and privacy (Tables 1–2 of the papers)\n\n\
         Every held-out position is one query, charged as if its token were released; \
         perplexity is exp(mean NLL) per block, then the mean over blocks. \
         'spent ε' is the accountant's (ε, δ) after all queries, rounded up. Unit and adjacency \
         of the PMixED, AdaPMixED and SubMix rows: a user in one member's (part's) shard, \
         changed-member adjacency (one member's model changes arbitrarily, N fixed). The DP-SGD \
         rows protect a different unit under a different adjacency (add/remove one training \
         block, Poisson-sampled), so their ε is not on the same axis. PMixED and SubMix are \
         calibrated to spend the target over exactly these queries; AdaPMixED's member filter is \
         calibrated so the whole run fits the target, and a member that would overspend leaves; \
         when the (ε, δ) budget refuses a charge the public model answers ('budget out'); DP-SGD's \
         ε is its training's.\n"
    );
    let _ = writeln!(
        s,
        "| mechanism | target ε | perplexity | spent ε | private answers | screened | budget out | parameters |\n|---|---|---|---|---|---|---|---|"
    );
    for m in &results.results {
        let _ = writeln!(s, "{}", row(m));
    }
    let _ = writeln!(
        s,
        "\n### Plots\n\nThe λ plot shows private diagnostics: λ is computed from the members' \
         data, is never released by a mechanism, and is shown here for analysis only.\n"
    );
    for p in plots {
        let _ = writeln!(s, "![{p}]({p})\n");
    }
    if let Some(audit) = &results.canary {
        s.push_str(&canary_markdown(audit));
    }
    s
}

fn canary_markdown(audit: &CanaryAudit) -> String {
    let p = &audit.plan;
    let mut s = String::new();
    let _ = writeln!(
        s,
        "### Canary extraction (SubMix, arXiv:2201.00971, §4.2)\n\n\
         {} canaries `Record k: the PIN of account <name> is d d d d d d`, each repeated {} times \
         as one user's text, given to member k mod N beside as many of its own blocks; audit \
         members fine-tuned {} steps at lr {} ({:.0} s with the scoring). Hit rate = the \
         probability that one sampled continuation of the prefix reproduces the six digits \
         (product of the released probabilities of the true digits, teacher-forced), averaged \
         over canaries; a uniform guess scores {:.0e}. Each mechanism has its own account over \
         exactly these queries.\n",
        p.canaries,
        p.repeats,
        p.train_steps,
        p.learning_rate,
        audit.seconds,
        audit.uniform_hit_rate
    );
    let _ = writeln!(
        s,
        "| mechanism | target ε | hit rate | log₁₀ P per canary | spent ε |\n|---|---|---|---|---|"
    );
    for r in &audit.results {
        let logs: Vec<String> = r
            .log10_probabilities
            .iter()
            .map(|l| format!("{l:.1}"))
            .collect();
        let _ = writeln!(
            s,
            "| {} | {} | {:.3e} | {} | {} |",
            r.mechanism,
            r.target_epsilon.map_or("—".into(), |e| format!("{e}")),
            r.hit_rate,
            logs.join(", "),
            fmt_eps(r.spent_epsilon)
        );
    }
    s.push('\n');
    s
}

/// Writes `results.json`, the plots and `README.md` into `dir`.
pub fn write_report(dir: &Path, report: &Report) -> Result<(), BenchError> {
    std::fs::create_dir_all(dir).map_err(|e| BenchError::io(dir, e))?;
    let json = dir.join("results.json");
    let text = serde_json::to_string_pretty(report)
        .map_err(|e| BenchError::Config(format!("results do not serialise: {e}")))?;
    std::fs::write(&json, text).map_err(|e| BenchError::io(&json, e))?;
    let mut md = String::from("# privmix privacy–utility report\n\n");
    if let Some(results) = &report.perplexity {
        let plots = draw_all(dir, results)?;
        md.push_str(&markdown(results, &plots));
    }
    if let Some(icl) = &report.icl {
        let plot = if icl.config.epsilons.is_empty() {
            None
        } else {
            Some(icl_plot(dir, icl)?)
        };
        md.push_str(&icl_markdown(icl, plot.as_deref()));
    }
    let path = dir.join("README.md");
    std::fs::write(&path, md).map_err(|e| BenchError::io(&path, e))?;
    Ok(())
}
