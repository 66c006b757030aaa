//! The report folder of the privacy–utility experiment: `results.json` (every
//! measured value), `README.md` (run metadata, the claims, the tables),
//! `rows.csv` and `summary.csv`, and the SVG plots.

mod csv;
mod icl;
mod perplexity;
mod studies;

pub use icl::icl_markdown;
use icl::icl_plot;

use std::fmt::Write as _;
use std::path::Path;

use serde::{Deserialize, Serialize};

use crate::claims::{Claim, markdown as claims_markdown};
use crate::error::BenchError;
use crate::experiment::ExperimentResults;
use crate::icl::IclResults;
use crate::plots::draw_all;
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
        rows.push_str(&studies::per_seed_rows(key, r));
        summary.push_str(&csv::summary_rows(key, r));
        summary.push_str(&studies::summary_rows(key, r));
    }
    write("rows.csv", &rows)?;
    write("summary.csv", &summary)?;

    let mut md = String::from("# privmix privacy–utility report\n\n");
    if let Some(finding) = report.perplexity.as_ref().and_then(studies::finding) {
        md.push_str(&finding);
    }
    md.push_str(&report.run.markdown());
    md.push_str(&claims_markdown(&report.claims));
    for (key, title, r) in &experiments {
        let plots = draw_all(dir, &format!("{key}_"), r)?;
        md.push_str(&perplexity::markdown(title, r, &plots));
        md.push_str(&studies::table1(r));
        md.push_str(&studies::markdown(r));
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
