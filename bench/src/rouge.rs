//! ROUGE-L (Lin 2004, "ROUGE: A Package for Automatic Evaluation of Summaries", §3.1):
//! precision, recall and F1 of the longest common subsequence of two token sequences.
//!
//! Tokenisation and scores follow Google's `rouge-score` package (`RougeScorer(["rougeL"])`,
//! version 0.1.2) exactly: lowercase the text, replace every run of characters outside
//! `[a-z0-9]` by a space, split on whitespace, drop empty tokens. Precision is
//! `LCS / |prediction|`, recall `LCS / |target|`, F1 `2PR / (P + R)` (0 when `P + R = 0`), and
//! an empty side scores 0 everywhere. `tests/integration/rouge_golden.rs` checks this against scores that
//! `rouge-score` itself produced (`tests/fixtures/rouge/make_rouge.py`).
//!
//! Stemming (`use_stemmer=True` in `rouge-score`, NLTK's Porter stemmer in its NLTK_EXTENSIONS
//! mode) is not offered: no Rust crate we know of implements that exact variant (Snowball's
//! English stemmer, as in `rust-stemmers`, is Porter2 and stems differently), so scores here
//! equal `rouge-score` with `use_stemmer=False`.

/// Precision, recall and F1 of one ROUGE-L comparison, each in `[0, 1]`.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct RougeScore {
    /// LCS length over the number of prediction tokens.
    pub precision: f64,
    /// LCS length over the number of target tokens.
    pub recall: f64,
    /// Harmonic mean of precision and recall (0 when both are 0).
    pub fmeasure: f64,
}

/// Tokens of `text` as `rouge-score`'s default tokenizer makes them (no stemming): lowercase,
/// every character outside ASCII `[a-z0-9]` (after lowercasing) separates tokens.
pub fn tokenize(text: &str) -> Vec<String> {
    // Lowercase the whole string first, like Python's `str.lower()`: a few characters map to
    // ASCII letters only when lowercased (e.g. KELVIN SIGN → 'k', 'İ' → "i\u{307}").
    let lowered = text.to_lowercase();
    lowered
        .split(|c: char| !(c.is_ascii_lowercase() || c.is_ascii_digit()))
        .filter(|token| !token.is_empty())
        .map(str::to_owned)
        .collect()
}

/// Length of the longest common subsequence of `a` and `b`, in O(|a|·|b|) time and
/// O(min(|a|, |b|)) memory (one row of the classic dynamic-programming table).
pub fn lcs_length<T: PartialEq>(a: &[T], b: &[T]) -> usize {
    let (long, short) = if a.len() >= b.len() { (a, b) } else { (b, a) };
    let mut row = vec![0usize; short.len() + 1];
    for x in long {
        // `diagonal` holds table[i-1][j-1] while row[j] still holds table[i-1][j].
        let mut diagonal = 0;
        for (j, y) in short.iter().enumerate() {
            let above = row[j + 1];
            row[j + 1] = if x == y {
                diagonal + 1
            } else {
                above.max(row[j])
            };
            diagonal = above;
        }
    }
    row[short.len()]
}

/// ROUGE-L of two token sequences: `target` is the reference, `prediction` the candidate.
pub fn rouge_l_tokens<T: PartialEq>(target: &[T], prediction: &[T]) -> RougeScore {
    if target.is_empty() || prediction.is_empty() {
        return RougeScore {
            precision: 0.0,
            recall: 0.0,
            fmeasure: 0.0,
        };
    }
    let lcs = lcs_length(target, prediction) as f64;
    let precision = lcs / prediction.len() as f64;
    let recall = lcs / target.len() as f64;
    // Same operation order as rouge-score's `scoring.fmeasure`, so results agree bit for bit.
    let fmeasure = if precision + recall > 0.0 {
        2.0 * precision * recall / (precision + recall)
    } else {
        0.0
    };
    RougeScore {
        precision,
        recall,
        fmeasure,
    }
}

/// ROUGE-L of two texts, tokenised like `rouge-score` (see [`tokenize`]).
pub fn rouge_l(target: &str, prediction: &str) -> RougeScore {
    rouge_l_tokens(&tokenize(target), &tokenize(prediction))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tokenizer_splits_on_non_alphanumerics() {
        assert_eq!(
            tokenize("Hello, World! it's 3.14"),
            ["hello", "world", "it", "s", "3", "14"]
        );
        assert_eq!(tokenize("Café"), ["caf"]);
        assert_eq!(tokenize("\u{212a}elvin"), ["kelvin"]);
        assert!(tokenize(" ,.; ").is_empty());
    }

    #[test]
    fn lcs_of_known_pairs() {
        assert_eq!(lcs_length(&[1, 2, 3, 4], &[2, 4]), 2);
        assert_eq!(lcs_length(&[1, 2, 3], &[3, 2, 1]), 1);
        assert_eq!(lcs_length::<u8>(&[], &[1]), 0);
        assert_eq!(lcs_length(b"ABCBDAB", b"BDCABA"), 4);
    }

    #[test]
    fn empty_side_scores_zero() {
        let s = rouge_l("", "a b");
        assert_eq!((s.precision, s.recall, s.fmeasure), (0.0, 0.0, 0.0));
    }
}
