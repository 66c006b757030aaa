//! The ICL section of the report: ROUGE-L F1 per method and ε as the mean over
//! seeds with its 95% interval, the membership-inference AUC with its interval over
//! repetitions, example answers, and the ROUGE-L-against-ε plot.

use std::fmt::Write as _;
use std::path::Path;

use crate::error::BenchError;
use crate::icl::{IclResults, IclSummary};
use crate::plots::{Series, epsilon_range, line_plot};

fn target(e: Option<f64>) -> String {
    e.map_or("—".into(), |e| format!("{e}"))
}

fn per_seed(values: &[f64]) -> String {
    let v: Vec<String> = values.iter().map(|x| format!("{x:.3}")).collect();
    v.join(", ")
}

fn icl_row(r: &IclSummary) -> String {
    format!(
        "| {} | {} | {} | {} | {} | {} | {} | {:.0} | {} |",
        r.method,
        target(r.target_epsilon),
        r.rouge_l_f1.display(4),
        per_seed(&r.per_seed),
        fmt_eps(r.spent_epsilon),
        r.tokens,
        r.mean_lambda.map_or("—".into(), |l| format!("{l:.3}")),
        r.seconds,
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
         ({} nouns kept from `{}`). {} seeds × {} test queries = {} test queries in all \
         (different nouns); each seed is an independent deployment with its own |D| = {} \
         private demonstrations, {} public inputs for +Off, mechanism randomness and budget \
         (calibrated to its {} queries). {} shots per token, top-k {}, at most {} tokens per \
         answer (stop at a line break); δ = {}. ROUGE-L F1 as Google's rouge-score (no \
         stemming), averaged over a seed's queries; the table gives the mean over seeds with \
         its 95% Student-t interval `mean [low, high]`, and each seed's value. 'spent ε' is the \
         largest any seed spent, rounded up; tokens and seconds are summed over seeds. {}\n",
        icl.nouns,
        c.wordnet.display(),
        c.seeds,
        c.test_queries,
        c.seeds * c.test_queries,
        c.private_demos,
        c.public_inputs,
        c.test_queries,
        c.n_shots,
        c.top_k,
        c.max_tokens,
        c.delta,
        match &icl.embedding_skipped {
            Some(why) => format!("The Wu et al. (2023) embedding baseline did not run: {why}."),
            None => format!(
                "Wu et al. (2023) embedding-space aggregation (arXiv:2305.01639; DPS-MOZO, \
                 arXiv:2501.19287, Alg. 4): {} disjoint subsets of {} demonstrations decode \
                 greedily, all-MiniLM-L6-v2 embeds their outputs, Gaussian noise (sensitivity \
                 2/N, σ calibrated to a seed's {} queries by RDP) on the mean picks the closest \
                 of {} zero-shot candidates.",
                c.esa_subsets, c.esa_shots, c.test_queries, c.esa_candidates
            ),
        }
    );
    let _ = writeln!(
        s,
        "| method | target ε | ROUGE-L F1, mean [95% interval] | per seed | spent ε | tokens | \
         mean λ (private diagnostic, not released) | seconds | parameters |\n\
         |---|---|---|---|---|---|---|---|---|"
    );
    for r in &icl.summary {
        let _ = writeln!(s, "{}", icl_row(r));
    }
    let _ = writeln!(
        s,
        "\nThe whole ICL run took {:.0} s.\n\nExamples of the first seed (word — reference — \
         prediction):\n",
        icl.seconds
    );
    for r in &icl.summary {
        if let Some((w, g, p)) = r.examples.first() {
            let eps = r
                .target_epsilon
                .map_or(String::new(), |e| format!(" ε = {e}"));
            let _ = writeln!(s, "- {}{eps}: *{w}* — {g} — {p:?}", r.method);
        }
    }
    if let Some(p) = plot {
        let _ = writeln!(
            s,
            "\n![{p}]({p})\n\nThe plot shows the means over seeds; their intervals are in the \
             table.\n"
        );
    }
    if let Some(mia) = &icl.mia {
        let m = mia.examples;
        let _ = writeln!(
            s,
            "### Membership inference (DPS-MOZO, arXiv:2501.19287, §5.5 and App. D.1)\n\n\
             {} repetitions × {m} examples = {} examples in all (disjoint sets, none a test query). \
             In each repetition, attack j puts example j alone in the private set (one shot) and \
             scores all {m} examples as queries by the mean probability of their reference \
             definition's tokens (teacher forcing); AUC-ROC of the {m} member scores against the \
             {} non-member scores pooled over the {m} attacks (0.5 = chance); the table gives the \
             mean over repetitions with its 95% interval, and each repetition's AUC. Few-shot is \
             the one-shot output without privacy (ε = ∞); DPS-MOZO+On uses its per-token radius \
             at each ε; zero-shot does not read the demonstration (AUC 0.5 by construction). The \
             forwards are shared by every method and ε: {:.0} s of forwards, {:.0} s applying \
             the methods.\n",
            mia.repetitions,
            mia.repetitions * m,
            m * (m - 1),
            mia.forward_seconds,
            mia.mixing_seconds
        );
        let _ = writeln!(
            s,
            "| method | ε of the radius | radius | AUC, mean [95% interval] | per repetition |\n\
             |---|---|---|---|---|"
        );
        for r in &mia.results {
            let _ = writeln!(
                s,
                "| {} | {} | {} | {} | {} |",
                r.method,
                r.target_epsilon.map_or("∞".into(), |e| format!("{e}")),
                r.radius.map_or("—".into(), |b| format!("{b:.3e}")),
                r.auc.display(3),
                per_seed(&r.per_repetition)
            );
        }
        s.push('\n');
    }
    s
}

/// Draws ROUGE-L F1 (mean over seeds) against the target ε; returns the file name.
pub fn icl_plot(dir: &Path, icl: &IclResults) -> Result<String, BenchError> {
    let mut series = Vec::new();
    for name in ["dps-mozo+on", "dps-mozo+off", "wu-embedding-agg"] {
        let points: Vec<(f64, f64)> = icl
            .summary
            .iter()
            .filter(|r| r.method == name)
            .filter_map(|r| Some((r.target_epsilon?, r.rouge_l_f1.mean)))
            .collect();
        if !points.is_empty() {
            series.push(Series {
                label: name.into(),
                points,
            });
        }
    }
    let (lo, hi) = epsilon_range(&icl.config.epsilons);
    for r in icl.summary.iter().filter(|r| r.target_epsilon.is_none()) {
        series.push(Series {
            label: format!("{} (no ε)", r.method),
            points: vec![(lo, r.rouge_l_f1.mean), (hi, r.rouge_l_f1.mean)],
        });
    }
    let file = "rouge_l_vs_epsilon.svg";
    line_plot(
        &dir.join(file),
        "WordNet definitions: ROUGE-L F1 (mean over seeds) against the target ε",
        ("target ε", "ROUGE-L F1"),
        &series,
        false,
    )?;
    Ok(file.to_string())
}

fn fmt_eps(e: Option<f64>) -> String {
    match e {
        Some(e) => format!("{e:.3}"),
        None => "∞".into(),
    }
}
