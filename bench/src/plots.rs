//! SVG plots of the privacy–utility results (plotters' SVG backend: no fonts
//! or system libraries needed).

use std::path::Path;

use plotters::prelude::*;

use crate::error::BenchError;
use crate::experiment::ExperimentResults;

/// A named line of `(x, y)` points.
pub struct Series {
    /// Legend label.
    pub label: String,
    /// Points in x order.
    pub points: Vec<(f64, f64)>,
}

const COLORS: [RGBColor; 8] = [
    RGBColor(31, 119, 180),
    RGBColor(255, 127, 14),
    RGBColor(44, 160, 44),
    RGBColor(214, 39, 40),
    RGBColor(148, 103, 189),
    RGBColor(140, 86, 75),
    RGBColor(227, 119, 194),
    RGBColor(127, 127, 127),
];

/// Draws `series` as lines with markers into `path` (an SVG file).
pub fn line_plot(
    path: &Path,
    title: &str,
    (x_label, y_label): (&str, &str),
    series: &[Series],
    log_y: bool,
) -> Result<(), BenchError> {
    let name = path.display().to_string();
    let err = |e: &dyn std::fmt::Display| BenchError::Plot {
        name: name.clone(),
        message: e.to_string(),
    };
    let finite = series
        .iter()
        .flat_map(|s| s.points.iter())
        .filter(|(x, y)| x.is_finite() && y.is_finite() && (!log_y || *y > 0.0));
    let (mut x0, mut x1, mut y0, mut y1) = (f64::MAX, f64::MIN, f64::MAX, f64::MIN);
    for &(x, y) in finite {
        x0 = x0.min(x);
        x1 = x1.max(x);
        y0 = y0.min(y);
        y1 = y1.max(y);
    }
    if x0 > x1 {
        return Err(err(&"no finite point to plot"));
    }
    if x1 - x0 < 1e-12 {
        x1 = x0 + 1.0;
    }
    if y1 - y0 < 1e-12 {
        y1 = y0 + 1.0;
    }
    let pad = 0.05 * (y1 - y0);
    let root = SVGBackend::new(path, (720, 440)).into_drawing_area();
    root.fill(&WHITE).map_err(|e| err(&e))?;
    let mut builder = ChartBuilder::on(&root);
    builder
        .caption(title, ("sans-serif", 20))
        .margin(12)
        .x_label_area_size(40)
        .y_label_area_size(60);
    // One code path per axis kind (plotters types them differently).
    macro_rules! draw {
        ($chart:expr) => {{
            let mut chart = $chart;
            chart
                .configure_mesh()
                .x_desc(x_label)
                .y_desc(y_label)
                .draw()
                .map_err(|e| err(&e))?;
            for (i, s) in series.iter().enumerate() {
                let color = COLORS[i % COLORS.len()];
                let pts: Vec<(f64, f64)> = s
                    .points
                    .iter()
                    .copied()
                    .filter(|(x, y)| x.is_finite() && y.is_finite() && (!log_y || *y > 0.0))
                    .collect();
                chart
                    .draw_series(LineSeries::new(pts.clone(), color.stroke_width(2)))
                    .map_err(|e| err(&e))?
                    .label(s.label.clone())
                    .legend(move |(x, y)| {
                        PathElement::new(vec![(x, y), (x + 18, y)], color.stroke_width(2))
                    });
                if pts.len() <= 40 {
                    chart
                        .draw_series(pts.iter().map(|&p| Circle::new(p, 3, color.filled())))
                        .map_err(|e| err(&e))?;
                }
            }
            chart
                .configure_series_labels()
                .background_style(WHITE.mix(0.85))
                .border_style(BLACK)
                .draw()
                .map_err(|e| err(&e))?;
        }};
    }
    if log_y {
        draw!(
            builder
                .build_cartesian_2d(x0..x1, (y0 * 0.95..y1 * 1.05).log_scale())
                .map_err(|e| err(&e))?
        );
    } else {
        draw!(
            builder
                .build_cartesian_2d(x0..x1, (y0 - pad)..(y1 + pad))
                .map_err(|e| err(&e))?
        );
    }
    root.present().map_err(|e| err(&e))?;
    Ok(())
}

/// The smallest and largest target ε (where the flat baselines are drawn).
pub fn epsilon_range(eps: &[f64]) -> (f64, f64) {
    (
        eps.iter().copied().fold(f64::MAX, f64::min),
        eps.iter().copied().fold(f64::MIN, f64::max),
    )
}

/// The report's four plots, written into `dir` with file names starting with
/// `prefix`; returns their file names. Perplexity is the mean over seeds; the
/// traces are seed 0's.
pub fn draw_all(
    dir: &Path,
    prefix: &str,
    results: &ExperimentResults,
) -> Result<Vec<String>, BenchError> {
    let mut files = Vec::new();
    let Some(r) = results.seeds.first() else {
        return Ok(files);
    };
    let summary = &results.summary;
    let eps = &results.config.epsilons;
    let flat = |name: &str| -> Option<f64> {
        summary
            .iter()
            .find(|m| m.mechanism == name)
            .and_then(|m| Some(m.perplexity?.mean))
    };
    let mut series = Vec::new();
    for name in ["pmixed", "adapmixed", "submix", "dp-sgd"] {
        let points: Vec<(f64, f64)> = summary
            .iter()
            .filter(|m| m.mechanism == name)
            .filter_map(|m| Some((m.target_epsilon?, m.perplexity?.mean)))
            .collect();
        if !points.is_empty() {
            series.push(Series {
                label: name.into(),
                points,
            });
        }
    }
    let (lo, hi) = epsilon_range(eps);
    for name in ["public", "ensemble"] {
        if let Some(p) = flat(name) {
            series.push(Series {
                label: format!("{name} (no ε)"),
                points: vec![(lo, p), (hi, p)],
            });
        }
    }
    let file = format!("{prefix}perplexity_vs_epsilon.svg");
    line_plot(
        &dir.join(&file),
        "Held-out perplexity against the target ε",
        ("target ε (δ as configured)", "perplexity"),
        &series,
        false,
    )?;
    files.push(file);

    let top = hi;
    let at_top = |name: &str| {
        r.iter()
            .find(|m| m.mechanism == name && m.target_epsilon == Some(top))
    };
    let mut spent = Vec::new();
    let mut lambdas = Vec::new();
    for name in ["pmixed", "adapmixed", "submix"] {
        if let Some(m) = at_top(name) {
            spent.push(Series {
                label: name.into(),
                points: m
                    .spent_trace
                    .iter()
                    .enumerate()
                    .map(|(i, &e)| ((i + 1) as f64, e))
                    .collect(),
            });
            lambdas.push(Series {
                label: name.into(),
                points: m
                    .lambda_trace
                    .iter()
                    .enumerate()
                    .map(|(i, &l)| ((i + 1) as f64, l))
                    .collect(),
            });
        }
    }
    let file = format!("{prefix}spent_epsilon_over_queries.svg");
    line_plot(
        &dir.join(&file),
        &format!("ε spent over the queries (target ε = {top})"),
        ("query", "ε spent"),
        &spent,
        false,
    )?;
    files.push(file);
    let file = format!("{prefix}lambda_over_tokens.svg");
    line_plot(
        &dir.join(&file),
        &format!("Private diagnostic, not released: mean λ per token (target ε = {top})"),
        ("query", "mean λ"),
        &lambdas,
        false,
    )?;
    files.push(file);

    let screening: Vec<(f64, f64)> = r
        .iter()
        .filter(|m| m.mechanism == "adapmixed")
        .filter_map(|m| {
            Some((
                m.target_epsilon?,
                m.screened as f64 / m.queries.max(1) as f64,
            ))
        })
        .collect();
    let stopped = |name: &str| -> Vec<(f64, f64)> {
        r.iter()
            .filter(|m| m.mechanism == name)
            .filter_map(|m| {
                Some((
                    m.target_epsilon?,
                    m.stopped as f64 / m.queries.max(1) as f64,
                ))
            })
            .collect()
    };
    let file = format!("{prefix}screening_rate.svg");
    line_plot(
        &dir.join(&file),
        "Share of queries answered from the public model",
        ("target ε", "share of queries"),
        &[
            Series {
                label: "AdaPMixED screened".into(),
                points: screening,
            },
            Series {
                label: "AdaPMixED budget out".into(),
                points: stopped("adapmixed"),
            },
            Series {
                label: "SubMix budget out".into(),
                points: stopped("submix"),
            },
        ],
        false,
    )?;
    files.push(file);
    Ok(files)
}
