//! ROUGE-L against Google's `rouge-score` 0.1.2 (`RougeScorer(["rougeL"], use_stemmer=False)`)
//! on the pairs of `tests/fixtures/rouge/make_rouge.py` (empty texts, punctuation, unicode,
//! repeated words, texts of up to 1200 words).

use privmix_bench::rouge::rouge_l;
use serde::Deserialize;

#[derive(Deserialize)]
struct Case {
    target: String,
    prediction: String,
    precision: f64,
    recall: f64,
    fmeasure: f64,
}

#[derive(Deserialize)]
struct Fixture {
    cases: Vec<Case>,
}

#[test]
fn rouge_l_equals_rouge_score() {
    let text = include_str!("../fixtures/rouge/rouge_l.json");
    let fixture: Fixture = serde_json::from_str(text).expect("fixture parses");
    assert!(fixture.cases.len() >= 35);
    // Both sides compute the same ratios of integers with the same f64 operations, so they
    // should agree exactly; 1e-12 leaves room only for a different operation order.
    for case in &fixture.cases {
        let got = rouge_l(&case.target, &case.prediction);
        for (name, ours, theirs) in [
            ("precision", got.precision, case.precision),
            ("recall", got.recall, case.recall),
            ("fmeasure", got.fmeasure, case.fmeasure),
        ] {
            assert!(
                (ours - theirs).abs() <= 1e-12,
                "{name} of ({:?}, {:?}): ours {ours}, rouge-score {theirs}",
                case.target,
                case.prediction
            );
        }
    }
}
