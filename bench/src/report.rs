//! The report folder of the privacy–utility experiment: `results.json` (every
//! measured value), `README.md` (the tables) and the SVG plots.

use std::fmt::Write as _;
use std::path::Path;

use crate::error::BenchError;
use crate::experiment::{ExperimentResults, MechanismResult};
use crate::plots::draw_all;

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

/// The Markdown text of the report.
pub fn markdown(results: &ExperimentResults, plots: &[String]) -> String {
    let c = &results.config;
    let mut s = String::new();
    let queries = results.results.first().map_or(0, |m| m.queries);
    let _ = writeln!(s, "# privmix privacy–utility report\n");
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
        "\n## Perplexity and privacy (Tables 1–2 of the papers)\n\n\
         Every held-out position is one query, charged as if its token were released; \
         perplexity is exp(mean NLL) per block, then the mean over blocks. \
         'spent ε' is the accountant's (ε, δ) after all queries, rounded up: PMixED is calibrated \
         to spend the target over exactly these queries; AdaPMixED answers until its (ε, δ) budget \
         refuses a charge, then the public model answers; SubMix stops (STOP) when a part's RDP \
         budget would be exceeded; DP-SGD's ε is its training's.\n"
    );
    let _ = writeln!(
        s,
        "| mechanism | target ε | perplexity | spent ε | private answers | screened | budget out / STOP | parameters |\n|---|---|---|---|---|---|---|---|"
    );
    for m in &results.results {
        let _ = writeln!(s, "{}", row(m));
    }
    let _ = writeln!(s, "\n## Plots\n");
    for p in plots {
        let _ = writeln!(s, "![{p}]({p})\n");
    }
    s
}

/// Writes `results.json`, the plots and `README.md` into `dir`.
pub fn write_report(dir: &Path, results: &ExperimentResults) -> Result<(), BenchError> {
    std::fs::create_dir_all(dir).map_err(|e| BenchError::io(dir, e))?;
    let json = dir.join("results.json");
    let text = serde_json::to_string_pretty(results)
        .map_err(|e| BenchError::Config(format!("results do not serialise: {e}")))?;
    std::fs::write(&json, text).map_err(|e| BenchError::io(&json, e))?;
    let plots = draw_all(dir, results)?;
    let md = dir.join("README.md");
    std::fs::write(&md, markdown(results, &plots)).map_err(|e| BenchError::io(&md, e))?;
    Ok(())
}
