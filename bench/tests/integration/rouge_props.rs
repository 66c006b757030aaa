//! Properties of ROUGE-L that hold for every pair of texts.

use privmix_bench::rouge::{rouge_l, rouge_l_tokens, tokenize};
use proptest::prelude::*;

fn text() -> impl Strategy<Value = String> {
    // Small vocabulary so that pairs share words; punctuation and non-ASCII as separators.
    prop::collection::vec(
        prop_oneof!["[a-d]{1,2}", "[ ,.!é日]{1,3}", "[A-D0-9]{1,2}"],
        0..30,
    )
    .prop_map(|parts| parts.concat())
}

proptest! {
    #[test]
    fn scores_lie_in_unit_interval(a in text(), b in text()) {
        let s = rouge_l(&a, &b);
        for v in [s.precision, s.recall, s.fmeasure] {
            prop_assert!((0.0..=1.0).contains(&v), "{v} out of [0, 1]");
        }
    }

    #[test]
    fn f1_is_symmetric_and_precision_recall_swap(a in text(), b in text()) {
        let ab = rouge_l(&a, &b);
        let ba = rouge_l(&b, &a);
        // LCS is symmetric, so P and R swap exactly; 2PR/(P+R) is then the same f64
        // expression up to commutative products and sums, which IEEE evaluates identically.
        prop_assert_eq!(ab.precision, ba.recall);
        prop_assert_eq!(ab.recall, ba.precision);
        prop_assert_eq!(ab.fmeasure, ba.fmeasure);
    }

    #[test]
    fn identical_nonempty_text_scores_one(a in text()) {
        let s = rouge_l(&a, &a);
        if tokenize(&a).is_empty() {
            prop_assert_eq!(s.fmeasure, 0.0);
        } else {
            prop_assert_eq!((s.precision, s.recall, s.fmeasure), (1.0, 1.0, 1.0));
        }
    }

    #[test]
    fn lcs_never_exceeds_the_shorter_side(a in prop::collection::vec(0u8..4, 0..40),
                                          b in prop::collection::vec(0u8..4, 0..40)) {
        let s = rouge_l_tokens(&a, &b);
        if !a.is_empty() && !b.is_empty() {
            let lcs = (s.precision * b.len() as f64).round() as usize;
            prop_assert!(lcs <= a.len().min(b.len()));
        }
    }
}
