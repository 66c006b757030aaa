//! The report folder of the privacy–utility experiment: `results.json` (every
//! measured value), `README.md` (run metadata, the claims, the tables),
//! `rows.csv` and `summary.csv`, and the SVG plots.

mod csv;
mod perplexity;

use std::fmt::Write as _;
use std::path::Path;

use serde::{Deserialize, Serialize};

use crate::claims::{Claim, markdown as claims_markdown};
use crate::error::BenchError;
use crate::experiment::ExperimentResults;
use crate::icl::{IclResult, IclResults};
use crate::plots::{Series, draw_all, epsilon_range, line_plot};
use crate::run_info::RunInfo;

/// Everything one run of the binary measured (`results.json`).
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Report {
    /// Commit, machine, compiler and phase times.
    pub run: RunInfo,
    /// The papers' claims with our figures and verdicts.
    pub claims: Vec<Claim>,
    /// The perplexity experiment at the record level (the papers' unit), when run.
    pub perplexity: Option<ExperimentResults>,
    /// The same experiment at the user level, when run.
    pub user_level: Option<ExperimentResults>,
    /// The ICL experiment, when run.
    pub icl: Option<IclResults>,
}

fn fmt_eps(e: Option<f64>) -> String {
    match e {
        Some(e) => format!("{e:.3}"),
        None => "∞".into(),
    }
}

fn icl_row(r: &IclResult) -> String {
    format!(
        "| {} | {} | {:.4} | {} | {} | {} | {} |",
        r.method,
        r.target_epsilon.map_or("—".into(), |e| format!("{e}")),
        r.rouge_l_f1,
        fmt_eps(r.spent_epsilon),
        r.tokens,
        r.mean_lambda.map_or("—".into(), |l| format!("{l:.3}")),
        r.parameters
    )
}

/// The Markdown section of the ICL experiment.
pub fn icl_markdown(icl: &IclResults, plot: Option<&str>) -> String {
    let c = &icl.config;
    let mut s = String::new();
    let _ = writeln!(
        s,
        "## In-context learning: DPS-MOZO on WordNet definitions\n"
    );
    let _ = writeln!(
        s,
        "Task: given a noun, write its definition; reference = WordNet 3.1's gloss \
         ({} nouns kept from `{}`). |D| = {} private demonstrations, {} test queries, {} public \
         inputs for +Off; {} shots per token, top-k {}, at most {} tokens per answer (stop at a \
         line break); δ = {}. ROUGE-L F1 as Google's rouge-score (no stemming). {}\n",
        icl.nouns,
        c.wordnet.display(),
        c.private_demos,
        c.test_queries,
        c.public_inputs,
        c.n_shots,
        c.top_k,
        c.max_tokens,
        c.delta,
        match &icl.embedding_skipped {
            Some(why) => format!("The Wu et al. (2023) embedding baseline did not run: {why}."),
            None => format!(
                "Wu et al. (2023) embedding-space aggregation (arXiv:2305.01639; DPS-MOZO, arXiv:2501.19287, Alg. 4): {} disjoint \
                 subsets of {} demonstrations decode greedily, all-MiniLM-L6-v2 embeds their \
                 outputs, Gaussian noise (sensitivity 2/N, σ calibrated to the {} queries by RDP) \
                 on the mean picks the closest of {} zero-shot candidates.",
                c.esa_subsets, c.esa_shots, c.test_queries, c.esa_candidates
            ),
        }
    );
    let _ = writeln!(
        s,
        "| method | target ε | ROUGE-L F1 | spent ε | tokens | mean λ (private diagnostic, not released) | parameters |\n|---|---|---|---|---|---|---|"
    );
    for r in &icl.results {
        let _ = writeln!(s, "{}", icl_row(r));
    }
    let _ = writeln!(s, "\nExamples (word — reference — prediction):\n");
    for r in &icl.results {
        if let Some((w, g, p)) = r.examples.first() {
            let eps = r
                .target_epsilon
                .map_or(String::new(), |e| format!(" ε = {e}"));
            let _ = writeln!(s, "- {}{eps}: *{w}* — {g} — {p:?}", r.method);
        }
    }
    if let Some(p) = plot {
        let _ = writeln!(s, "\n![{p}]({p})\n");
    }
    if !icl.mia.is_empty() {
        let m = icl.config.mia_examples.min(icl.config.test_queries);
        let _ = writeln!(
            s,
            "### Membership inference (DPS-MOZO, arXiv:2501.19287, §5.5)\n\n\
             {m} examples; attack j puts example j alone in the private set and scores every \
             example as a query by the mean probability of its reference definition's tokens \
             (teacher forcing); AUC-ROC of the {m} member scores against the {} non-member scores \
             (0.5 = chance). DPS-MOZO uses the per-token radius of DPS-MOZO+On at each ε.\n",
            m * (m - 1)
        );
        let _ = writeln!(
            s,
            "| method | ε of the radius | radius | AUC |\n|---|---|---|---|"
        );
        for r in &icl.mia {
            let _ = writeln!(
                s,
                "| {} | {} | {} | {:.3} |",
                r.method,
                r.target_epsilon.map_or("—".into(), |e| format!("{e}")),
                r.radius.map_or("—".into(), |b| format!("{b:.3e}")),
                r.auc
            );
        }
        s.push('\n');
    }
    s
}

fn icl_plot(dir: &Path, icl: &IclResults) -> Result<String, BenchError> {
    let mut series = Vec::new();
    for name in ["dps-mozo+on", "dps-mozo+off", "wu-embedding-agg"] {
        let points: Vec<(f64, f64)> = icl
            .results
            .iter()
            .filter(|r| r.method == name)
            .filter_map(|r| Some((r.target_epsilon?, r.rouge_l_f1)))
            .collect();
        if !points.is_empty() {
            series.push(Series {
                label: name.into(),
                points,
            });
        }
    }
    let eps = &icl.config.epsilons;
    let (lo, hi) = epsilon_range(eps);
    for r in icl.results.iter().filter(|r| r.target_epsilon.is_none()) {
        series.push(Series {
            label: format!("{} (no ε)", r.method),
            points: vec![(lo, r.rouge_l_f1), (hi, r.rouge_l_f1)],
        });
    }
    let file = "rouge_l_vs_epsilon.svg";
    line_plot(
        &dir.join(file),
        "WordNet definitions: ROUGE-L F1 against the target ε",
        ("target ε", "ROUGE-L F1"),
        &series,
        false,
    )?;
    Ok(file.to_string())
}

/// Writes `results.json`, the CSVs, the plots and `README.md` into `dir`.
pub fn write_report(dir: &Path, report: &Report) -> Result<(), BenchError> {
    std::fs::create_dir_all(dir).map_err(|e| BenchError::io(dir, e))?;
    let write = |name: &str, text: &str| -> Result<(), BenchError> {
        let path = dir.join(name);
        std::fs::write(&path, text).map_err(|e| BenchError::io(&path, e))
    };
    let json = serde_json::to_string_pretty(report)
        .map_err(|e| BenchError::Config(format!("results do not serialise: {e}")))?;
    write("results.json", &json)?;
    let experiments: Vec<(&str, &str, &ExperimentResults)> = [
        (
            "record",
            "Perplexity against ε — record level (the papers' unit; headline)",
            report.perplexity.as_ref(),
        ),
        (
            "user",
            "Perplexity against ε — user level",
            report.user_level.as_ref(),
        ),
    ]
    .into_iter()
    .filter_map(|(k, t, r)| Some((k, t, r?)))
    .collect();
    let mut rows = format!("{}\n", csv::ROWS_HEADER);
    let mut summary = format!("{}\n", csv::SUMMARY_HEADER);
    for (key, _, r) in &experiments {
        rows.push_str(&csv::per_seed_rows(key, r));
        summary.push_str(&csv::summary_rows(key, r));
    }
    write("rows.csv", &rows)?;
    write("summary.csv", &summary)?;

    let mut md = String::from("# privmix privacy–utility report\n\n");
    md.push_str(&report.run.markdown());
    md.push_str(&claims_markdown(&report.claims));
    for (key, title, r) in &experiments {
        let plots = draw_all(dir, &format!("{key}_"), r)?;
        md.push_str(&perplexity::markdown(title, r, &plots));
    }
    if let Some(icl) = &report.icl {
        let plot = if icl.config.epsilons.is_empty() {
            None
        } else {
            Some(icl_plot(dir, icl)?)
        };
        md.push_str(&icl_markdown(icl, plot.as_deref()));
    }
    let _ = writeln!(
        md,
        "Every row: `rows.csv` (per seed) and `summary.csv` (means and intervals); every value: `results.json`."
    );
    write("README.md", &md)
}
