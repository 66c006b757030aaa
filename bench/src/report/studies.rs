//! The Markdown and CSV of the studies ([`crate::experiment::studies`]), the
//! papers' Table 1 form of the main table, and the finding that opens the
//! report.

use std::fmt::Write as _;

use crate::experiment::ExperimentResults;
use crate::experiment::scoring::FINE_TUNED;
use crate::experiment::studies::{ABLATION, QUERIES, StudyRow};
use crate::stats::Interval;

use super::csv::field;

fn cell(i: Option<Interval>) -> String {
    i.map_or("∞".into(), |i| i.display(2))
}

/// Per-seed share of the gap from `from` to `to` that `x` closes, as an interval.
fn share(from: &[f64], to: &[f64], x: &[f64]) -> Option<Interval> {
    let s: Vec<f64> = from
        .iter()
        .zip(to)
        .zip(x)
        .map(|((f, t), x)| (f - x) / (f - t))
        .collect();
    // Paired over the seeds both have (an ablation run at another N covers the
    // main table's first seeds).
    Interval::of(&s).ok()
}

fn per_seed(r: &ExperimentResults, mechanism: &str, target: Option<f64>) -> Option<Vec<f64>> {
    r.row(mechanism, target)
        .map(|row| row.perplexity_per_seed.clone())
        .filter(|p| p.iter().all(|x| x.is_finite()))
}

/// Table 1's rows before the mechanisms, in the papers' order: the public
/// model, the non-private references (one fine-tuned model, the ensemble of
/// the members), then DP-SGD.
const TABLE1_FIRST: [&str; 4] = ["public", FINE_TUNED, "ensemble", "dp-sgd"];

/// The main table in the papers' form (AdaPMixED Table 1, arXiv:2410.02016:
/// public model, DP-SGD, then the private-prediction mechanisms; the
/// non-private fine-tuned model as SubMix's Fig. 2, arXiv:2201.00971, states
/// it, and the non-private ensemble beside it, after the public model):
/// absolute perplexity, one row per method, one column per ε, ascending.
pub fn table1(r: &ExperimentResults) -> String {
    let mut eps = r.config.epsilons.clone();
    eps.sort_by(f64::total_cmp);
    eps.dedup();
    let mut s = String::from(
        "### Table 1 in the papers' form\n\nAbsolute perplexity (geometric mean [95% interval] \
         over seeds) in the papers' row order: the public model (ε = 0), one model fine-tuned \
         on every training record and the ensemble of the members (both without privacy), \
         DP-SGD, then each private-prediction mechanism, at each target ε. The rows without \
         a target ε have one value, repeated in each column.\n\n| method |",
    );
    for e in &eps {
        let _ = write!(s, " ε = {e} |");
    }
    s.push_str("\n|---|");
    s.push_str(&"---|".repeat(eps.len()));
    s.push('\n');
    let mut methods: Vec<&str> = TABLE1_FIRST
        .iter()
        .copied()
        .filter(|m| r.summary.iter().any(|x| x.mechanism == *m))
        .collect();
    for m in &r.summary {
        if !methods.contains(&m.mechanism.as_str()) {
            methods.push(&m.mechanism);
        }
    }
    for m in methods {
        let _ = write!(s, "| {m} |");
        for &e in &eps {
            let target = if r.row(m, None).is_some() {
                None
            } else {
                Some(e)
            };
            let _ = write!(
                s,
                " {} |",
                r.row(m, target)
                    .map_or("—".into(), |row| cell(row.perplexity))
            );
        }
        s.push('\n');
    }
    s.push('\n');
    s
}

/// " (paired over the first n seeds only)" where the row `x` (an ablation run
/// at another N) has fewer seeds than the `all` it is compared with; else "".
fn fewer_seeds(x: &StudyRow, all: usize) -> String {
    let n = x.perplexity_per_seed.len();
    if n < all {
        format!(" (paired over the first {n} of the {all} seeds only)")
    } else {
        String::new()
    }
}

fn rows<'a>(r: &'a ExperimentResults, study: &str) -> Vec<&'a StudyRow> {
    r.studies.iter().filter(|x| x.key.study == study).collect()
}

/// The queries curve and the attribution ablation.
pub fn markdown(r: &ExperimentResults) -> String {
    let mut s = String::new();
    let curve = rows(r, QUERIES);
    if !curve.is_empty() {
        s.push_str(
            "### PMixED against the number of queries, at fixed ε\n\nEach seed's first k \
             queries, PMixED's radius calibrated to exactly k of them; the public model, \
             the non-private ensemble and the table's DP-SGD model at the same ε read on the \
             same queries. Share: the part of the public → ensemble gap on those queries that \
             the row closes (per seed, then the interval). Mean λ is a private \
             diagnostic (a function of the members' data), shown for analysis only.\n\n\
             | queries | method | ε | perplexity | gap share | mean λ | parameters |\n\
             |---|---|---|---|---|---|---|\n",
        );
        for x in &curve {
            let k = x.key.queries;
            let of = |m: &str| {
                curve
                    .iter()
                    .find(|y| y.key.queries == k && y.mechanism == m)
                    .map(|y| y.perplexity_per_seed.clone())
            };
            let gap = match (of("public"), of("ensemble")) {
                (Some(p), Some(e)) if x.target_epsilon.is_some() => {
                    share(&p, &e, &x.perplexity_per_seed).map_or("—".into(), |i| i.display(2))
                }
                _ => "—".into(),
            };
            let _ = writeln!(
                s,
                "| {k} | {} | {} | {} | {gap} | {} | {} |",
                x.mechanism,
                x.target_epsilon.map_or("—".into(), |e| e.to_string()),
                cell(x.perplexity),
                if x.mechanism == "pmixed" {
                    format!("{:.4}", x.mean_lambda)
                } else {
                    "—".into()
                },
                x.parameters
            );
        }
        s.push('\n');
    }
    let ablation = rows(r, ABLATION);
    if !ablation.is_empty() {
        let top = r.config.largest_epsilon();
        let base = per_seed(r, "pmixed", Some(top));
        let dp = per_seed(r, "dp-sgd", Some(top));
        let _ = writeln!(
            s,
            "### Attribution ablation of PMixED's gap to DP-SGD (ε = {top})\n\nEach row changes \
             one thing in the table's PMixED (α_c {}, N = {}, the proven bound) over every \
             seed's queries; \"gap share\" is the part of the PMixED → DP-SGD gap the change \
             accounts for (per seed: (PMixED − row)/(PMixED − DP-SGD)). The paper's-accounting \
             row runs PMixED at the radius the paper's own accounting allows (arXiv:2410.02016, \
             Thm 3.1 at every order, converted at the best one; unproven for a constraint at one \
             order): **not a DP guarantee**; its spent ε is what the proven bound charges for \
             that radius. The N rows are runs of their own over the main table's first \
             {} seeds only: their perplexity is the mean over those seeds, and their gap share \
             is paired with the table's PMixED and DP-SGD over the same seeds (the \
             \"seeds\" column); the other rows use all {} seeds.\n\n\
             | change | seeds | perplexity | gap share | ε spent (proven) | mean λ | parameters |\n\
             |---|---|---|---|---|---|---|",
            r.config.scoring.pmixed_alpha_c,
            r.config.members,
            r.config
                .studies
                .as_ref()
                .map_or(0, |p| p.members_seeds.clamp(1, r.config.seeds.max(1))),
            r.config.seeds
        );
        for x in &ablation {
            let gap = match (&base, &dp) {
                (Some(b), Some(d)) => {
                    share(b, d, &x.perplexity_per_seed).map_or("—".into(), |i| i.display(2))
                }
                _ => "— (no DP-SGD row)".into(),
            };
            let _ = writeln!(
                s,
                "| {} | {} | {} | {gap} | {} | {:.4} | {} |",
                x.key.change,
                x.perplexity_per_seed.len(),
                cell(x.perplexity),
                x.spent_epsilon.map_or("∞".into(), |i| i.display(3)),
                x.mean_lambda,
                x.parameters
            );
        }
        s.push('\n');
    }
    s
}

/// PMixED's and DP-SGD's gap shares at one query count of the curve.
struct CurvePoint {
    queries: u64,
    /// PMixED's share of the public → ensemble gap on these queries.
    pmixed: Interval,
    /// DP-SGD's share on the same queries, and the paired perplexity
    /// difference PMixED − DP-SGD (None: no DP-SGD row at this count).
    dp_sgd: Option<(Interval, Interval)>,
}

/// The curve's points at target `top`, each share with the public model and
/// the ensemble read on the same queries as the row.
fn curve_at_top(curve: &[&StudyRow], top: f64) -> Vec<CurvePoint> {
    let at = |k: u64, m: &str, target: Option<f64>| {
        curve
            .iter()
            .find(|y| y.key.queries == k && y.mechanism == m && y.target_epsilon == target)
            .map(|y| y.perplexity_per_seed.clone())
    };
    curve
        .iter()
        .filter(|x| x.mechanism == "pmixed" && x.target_epsilon == Some(top))
        .filter_map(|x| {
            let k = x.key.queries;
            let (public, ensemble) = (at(k, "public", None)?, at(k, "ensemble", None)?);
            let pmixed = &x.perplexity_per_seed;
            let dp_sgd = at(k, "dp-sgd", Some(top)).and_then(|d| {
                Some((
                    share(&public, &ensemble, &d)?,
                    Interval::of_differences(pmixed, &d).ok()?,
                ))
            });
            Some(CurvePoint {
                queries: k,
                pmixed: share(&public, &ensemble, pmixed)?,
                dp_sgd,
            })
        })
        .collect()
}

/// The finding that opens the report: does private prediction beat DP-SGD at
/// equal ε, with the numbers (None: the record-level table has no PMixED or
/// DP-SGD row at its largest ε).
pub fn finding(r: &ExperimentResults) -> Option<String> {
    let top = r.config.largest_epsilon();
    let public = per_seed(r, "public", None)?;
    let ensemble = per_seed(r, "ensemble", None)?;
    let pmixed = per_seed(r, "pmixed", Some(top))?;
    let dp = per_seed(r, "dp-sgd", Some(top))?;
    let ps = share(&public, &ensemble, &pmixed)?;
    let ds = share(&public, &ensemble, &dp)?;
    let diff = Interval::of_differences(&pmixed, &dp).ok()?;
    let verdict = if diff.below(0.0) {
        "yes: PMixED is below DP-SGD"
    } else if diff.above(0.0) {
        "no: DP-SGD is below PMixED"
    } else {
        "not decided: the paired difference's interval contains 0"
    };
    let mut s = format!(
        "## Finding\n\n**Does private prediction beat DP-SGD at equal ε? At the record level, \
         ε = {top}, {} seeds of {} queries: {verdict}.** PMixED {} against DP-SGD {} \
         (paired difference {}); of the public → non-private-ensemble gap, PMixED closes {} \
         and DP-SGD {}.",
        pmixed.len(),
        r.summary.first().map_or(0, |m| m.queries),
        cell(r.row("pmixed", Some(top)).and_then(|x| x.perplexity)),
        cell(r.row("dp-sgd", Some(top)).and_then(|x| x.perplexity)),
        diff.display(2),
        ps.display(2),
        ds.display(2)
    );
    let curve = rows(r, QUERIES);
    let at_counts = curve_at_top(&curve, top);
    if !at_counts.is_empty() {
        let _ = write!(
            s,
            " On each seed's first k queries, with PMixED's radius calibrated to those k and \
             DP-SGD, the public model and the ensemble read on the same k queries, the gap \
             share at ε = {top} is "
        );
        let parts: Vec<String> = at_counts
            .iter()
            .map(|c| match &c.dp_sgd {
                Some((share, diff)) => format!(
                    "{} for PMixED against {} for DP-SGD at {} queries (paired difference {})",
                    c.pmixed.display(2),
                    share.display(2),
                    c.queries,
                    diff.display(2)
                ),
                None => format!(
                    "{} for PMixED at {} queries (DP-SGD not read on them)",
                    c.pmixed.display(2),
                    c.queries
                ),
            })
            .collect();
        s.push_str(&parts.join(", "));
        s.push('.');
    }
    let ablation = rows(r, ABLATION);
    if !ablation.is_empty() {
        let parts: Vec<String> = ablation
            .iter()
            .filter_map(|x| {
                let g = share(&pmixed, &dp, &x.perplexity_per_seed)?;
                Some(format!(
                    "{}: {}{}",
                    x.key.change,
                    g.display(2),
                    fewer_seeds(x, pmixed.len())
                ))
            })
            .collect();
        let _ = write!(
            s,
            " Share of the PMixED → DP-SGD gap each single change accounts for: {}.",
            parts.join("; ")
        );
    }
    s.push_str("\n\n");
    Some(s)
}

/// `rows.csv` lines of the studies (one per seed), in [`super::csv::ROWS_HEADER`]'s columns.
pub fn per_seed_rows(experiment: &str, r: &ExperimentResults) -> String {
    let mut s = String::new();
    for x in &r.studies {
        for (seed, p) in x.perplexity_per_seed.iter().enumerate() {
            let _ = writeln!(
                s,
                "{},{},{seed},{},{},{p},,{},,,,,,{}",
                field(&format!("{experiment}, {}: {}", x.key.study, x.key.change)),
                field(&r.unit),
                field(&x.mechanism),
                x.target_epsilon.map_or(String::new(), |e| e.to_string()),
                x.key.queries,
                field(&x.parameters)
            );
        }
    }
    s
}

/// `summary.csv` lines of the studies, in [`super::csv::SUMMARY_HEADER`]'s columns.
pub fn summary_rows(experiment: &str, r: &ExperimentResults) -> String {
    let mut s = String::new();
    for x in &r.studies {
        let (pm, pl, ph) = x
            .perplexity
            .map_or(("inf".into(), String::new(), String::new()), |i| {
                (i.mean.to_string(), i.low.to_string(), i.high.to_string())
            });
        let (em, el, eh) = x
            .spent_epsilon
            .map_or(("inf".into(), String::new(), String::new()), |i| {
                (i.mean.to_string(), i.low.to_string(), i.high.to_string())
            });
        let _ = writeln!(
            s,
            "{},{},{},{},{},{pm},{pl},{ph},{em},{el},{eh},,,",
            field(&format!("{experiment}, {}: {}", x.key.study, x.key.change)),
            field(&r.unit),
            field(&x.mechanism),
            x.target_epsilon.map_or(String::new(), |e| e.to_string()),
            x.perplexity_per_seed.len(),
        );
    }
    s
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::claims::tests::experiment;
    use crate::experiment::studies::StudyKey;

    fn study(
        study: &str,
        change: &str,
        queries: u64,
        m: &str,
        t: Option<f64>,
        ppl: Vec<f64>,
    ) -> StudyRow {
        StudyRow {
            key: StudyKey {
                study: study.into(),
                change: change.into(),
                queries,
            },
            mechanism: m.into(),
            target_epsilon: t,
            perplexity: Interval::geometric(&ppl).ok(),
            perplexity_per_seed: ppl,
            spent_epsilon: None,
            mean_lambda: 0.0,
            parameters: String::new(),
        }
    }

    /// `base` minus `gap` times `share` on each seed.
    fn closing(base: &[f64], gap: f64, share: f64) -> Vec<f64> {
        base.iter().map(|p| p - gap * share).collect()
    }

    /// Review case: the finding compared PMixED's share on each seed's first k
    /// queries with DP-SGD's share over all the seed's queries. It must read
    /// DP-SGD (and the gap's ends) on the same first k queries, and say that
    /// the ablation's N rows are paired over fewer seeds.
    #[test]
    fn the_finding_compares_pmixed_and_dp_sgd_on_the_same_queries() {
        let public = vec![100.0, 110.0, 120.0, 130.0, 140.0];
        let ensemble = closing(&public, 40.0, 1.0);
        let mut r = experiment(
            &[8.0],
            &[
                ("public", None, public.clone()),
                ("ensemble", None, ensemble.clone()),
                ("pmixed", Some(8.0), closing(&public, 40.0, 0.0625)),
                ("dp-sgd", Some(8.0), closing(&public, 40.0, 0.875)),
            ],
        );
        r.config.studies = Some(crate::experiment::studies::StudyPlan {
            query_counts: vec![16],
            query_epsilons: vec![8.0],
            alpha_cs: vec![8.0],
            paper_accounting: false,
            members: vec![32],
            members_seeds: 3,
        });
        // On the first 16 queries the gap is another (public 80, ensemble 60
        // on each seed); DP-SGD closes a quarter of it there, PMixED half.
        let (p16, e16) = (vec![80.0; 5], vec![60.0; 5]);
        let q = QUERIES;
        r.studies = vec![
            study(q, "16 queries", 16, "public", None, p16.clone()),
            study(q, "16 queries", 16, "ensemble", None, e16),
            study(
                q,
                "16 queries",
                16,
                "pmixed",
                Some(8.0),
                closing(&p16, 20.0, 0.5),
            ),
            study(
                q,
                "16 queries",
                16,
                "dp-sgd",
                Some(8.0),
                closing(&p16, 20.0, 0.25),
            ),
            study(
                ABLATION,
                "α_c = 8",
                1016,
                "pmixed",
                Some(8.0),
                closing(&public, 40.0, 0.5),
            ),
            study(
                ABLATION,
                "N = 32",
                1016,
                "pmixed",
                Some(8.0),
                closing(&public[..3], 40.0, 0.5),
            ),
        ];
        let shown = |x: f64, n: usize| Interval::of(&vec![x; n]).unwrap().display(2);
        let finding = finding(&r).unwrap();
        assert!(
            finding.contains(&format!(
                "{} for PMixED against {} for DP-SGD at 16 queries",
                shown(0.5, 5),
                shown(0.25, 5)
            )),
            "{finding}"
        );
        // The whole-run shares stay the whole run's.
        assert!(
            finding.contains(&format!(
                "PMixED closes {} and DP-SGD {}",
                shown(0.0625, 5),
                shown(0.875, 5)
            )),
            "{finding}"
        );
        // (0.5 − 0.0625) / (0.875 − 0.0625) of the PMixED → DP-SGD gap.
        let ablation = shown(0.4375 / 0.8125, 5);
        assert!(
            finding.contains(&format!("α_c = 8: {ablation};")),
            "{finding}"
        );
        let n32 = shown(0.4375 / 0.8125, 3);
        assert!(
            finding.contains(&format!(
                "N = 32: {n32} (paired over the first 3 of the 5 seeds only)"
            )),
            "{finding}"
        );
        let md = markdown(&r);
        assert!(md.contains("| N = 32 | 3 | "), "{md}");
        assert!(md.contains("first 3 seeds only"), "{md}");
        assert!(md.contains("| 16 | dp-sgd | 8 | "), "{md}");
    }

    /// Table 1 lists the public model, the non-private references and DP-SGD
    /// first, in the papers' order, then the mechanisms, at ascending ε.
    #[test]
    fn table1_is_in_the_papers_order() {
        let s = |x: f64| vec![x, x * 1.05, x * 0.97];
        let r = experiment(
            &[8.0, 1.0],
            &[
                ("public", None, s(70.0)),
                ("ensemble", None, s(50.0)),
                ("pmixed", Some(1.0), s(69.0)),
                ("pmixed", Some(8.0), s(66.0)),
                ("dp-sgd", Some(1.0), s(60.0)),
                ("dp-sgd", Some(8.0), s(55.0)),
                (FINE_TUNED, None, s(45.0)),
            ],
        );
        let t = table1(&r);
        let at = |row: &str| t.find(&format!("\n| {row} |")).unwrap_or(usize::MAX);
        let order = ["public", FINE_TUNED, "ensemble", "dp-sgd", "pmixed"].map(at);
        assert!(
            order.windows(2).all(|w| w[0] < w[1] && w[1] != usize::MAX),
            "{t}"
        );
        assert!(t.contains("| method | ε = 1 | ε = 8 |"), "{t}");
    }
}
