//! `rows.csv`: every row the report measured, one line per seed (RFC 4180
//! quoting), and `summary.csv`: the means and intervals over seeds (and over the
//! runs of blocks of the long deployment, when there is one).

use std::fmt::Write as _;

use crate::experiment::ExperimentResults;
use crate::stats::Interval;

/// Quotes a field when it holds a comma, a quote or a line break.
pub fn field(s: &str) -> String {
    if s.contains([',', '"', '\n', '\r']) {
        format!("\"{}\"", s.replace('"', "\"\""))
    } else {
        s.to_string()
    }
}

fn opt(x: Option<f64>) -> String {
    x.map_or(String::new(), |x| format!("{x}"))
}

/// An interval's mean, low and high; `inf` and two empty fields when there is
/// none (an infinite figure).
fn interval_fields(i: Option<Interval>) -> (String, String, String) {
    i.map_or((String::from("inf"), String::new(), String::new()), |i| {
        (i.mean.to_string(), i.low.to_string(), i.high.to_string())
    })
}

/// Header of [`per_seed_rows`].
pub const ROWS_HEADER: &str = "experiment,unit,seed,mechanism,target_epsilon,perplexity,spent_epsilon,queries,private_answers,screened,stopped,screening_epsilon,seconds,parameters";

/// One line per seed, mechanism and target of `results`, labelled `experiment`.
pub fn per_seed_rows(experiment: &str, results: &ExperimentResults) -> String {
    let mut s = String::new();
    for (seed, rows) in results.seeds.iter().enumerate() {
        for m in rows {
            let _ = writeln!(
                s,
                "{},{},{seed},{},{},{},{},{},{},{},{},{},{},{}",
                field(experiment),
                field(&results.unit),
                field(&m.mechanism),
                opt(m.target_epsilon),
                m.perplexity,
                opt(m.spent_epsilon),
                m.queries,
                m.private_answers,
                m.screened,
                m.stopped,
                opt(m.screening_epsilon),
                m.seconds,
                field(&m.parameters)
            );
        }
    }
    s
}

/// Header of [`summary_rows`].
pub const SUMMARY_HEADER: &str = "experiment,unit,mechanism,target_epsilon,seeds,perplexity_mean,perplexity_low,perplexity_high,spent_epsilon_mean,spent_epsilon_low,spent_epsilon_high,private_share,screened_share,stopped_share";

/// One line per mechanism and target of `results`.
pub fn summary_rows(experiment: &str, results: &ExperimentResults) -> String {
    let mut s = String::new();
    for m in &results.summary {
        let (pm, pl, ph) = interval_fields(m.perplexity);
        let (em, el, eh) = interval_fields(m.spent_epsilon);
        let _ = writeln!(
            s,
            "{},{},{},{},{},{pm},{pl},{ph},{em},{el},{eh},{},{},{}",
            field(experiment),
            field(&results.unit),
            field(&m.mechanism),
            opt(m.target_epsilon),
            m.perplexity_per_seed.len(),
            m.shares.0,
            m.shares.1,
            m.shares.2
        );
    }
    if let Some(d) = &results.long_deployment {
        // The long deployment's rows: "seeds" counts its runs of blocks.
        let experiment = format!("{experiment}, long deployment of {} queries", d.queries);
        for r in &d.rows {
            let (pm, pl, ph) = interval_fields(r.interval);
            let spent = r
                .spent_epsilon
                .map_or(String::from("inf"), |e| e.to_string());
            let _ = writeln!(
                s,
                "{},{},{},{},{},{pm},{pl},{ph},{spent},,,{},{},{}",
                field(&experiment),
                field(&results.unit),
                field(&r.mechanism),
                opt(r.target_epsilon),
                r.chunk_perplexities.len(),
                r.shares.0,
                r.shares.1,
                r.shares.2
            );
        }
    }
    s
}

#[cfg(test)]
mod tests {
    use super::field;

    #[test]
    fn quotes_as_rfc_4180() {
        assert_eq!(field("plain"), "plain");
        assert_eq!(field("a, b"), "\"a, b\"");
        assert_eq!(field("say \"hi\""), "\"say \"\"hi\"\"\"");
    }
}
