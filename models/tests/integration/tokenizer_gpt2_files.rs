//! GPT-2-format tokenizer files (`vocab.json` + `merges.txt`) through
//! `Tokenizer::from_gpt2_files`, and the same BPE as one `tokenizer.json`
//! through `Tokenizer::from_file`, against transformers' slow, pure-Python
//! `GPT2Tokenizer` on the GPT-2 files: ids, decoded text, `<|endoftext|>` as
//! BOS/EOS and as special-token text. The files (a 1000-token byte-level BPE
//! trained on two Shakespeare plays) and the reference ids were written by
//! `fixtures/tokenizer/make_gpt2_files.py`.

use std::path::PathBuf;

use privmix_models::{ModelError, Tokenizer};
use serde_json::Value;

fn dir() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/tokenizer/gpt2_tiny")
}

fn load() -> Tokenizer {
    Tokenizer::from_gpt2_files(dir().join("vocab.json"), dir().join("merges.txt"))
        .expect("load GPT-2 files")
}

/// Checks `tok` against every reference case.
fn check_against_golden(tok: &Tokenizer) {
    let golden: Value =
        serde_json::from_str(&std::fs::read_to_string(dir().join("golden.json")).unwrap()).unwrap();
    assert_eq!(
        tok.vocab_size() as u64,
        golden["vocab_size"].as_u64().unwrap()
    );
    let eot = golden["endoftext"].as_u64().unwrap() as u32;
    assert_eq!(tok.bos_id(), Some(eot));
    assert_eq!(tok.eos_id(), Some(eot));
    let cases = golden["cases"].as_array().unwrap();
    assert!(cases.len() >= 5);
    for case in cases {
        let text = case["text"].as_str().unwrap();
        let want: Vec<u32> = serde_json::from_value(case["ids"].clone()).unwrap();
        // GPT-2 adds nothing on encode, with or without `add_special`.
        for add_special in [false, true] {
            let got = tok.encode(text, add_special).unwrap();
            assert_eq!(got, want, "{text:?} (add_special {add_special})");
        }
        assert_eq!(
            tok.decode(&want).unwrap(),
            case["decoded"].as_str().unwrap(),
            "decode of {text:?}"
        );
    }
}

#[test]
fn gpt2_files_match_transformers_slow_tokenizer() {
    check_against_golden(&load());
}

#[test]
fn tokenizer_json_of_the_same_bpe_matches_transformers_slow_tokenizer() {
    let tok = Tokenizer::from_file(dir().join("tokenizer.json")).expect("tokenizer.json");
    check_against_golden(&tok);
}

#[test]
fn missing_or_corrupt_gpt2_files_are_typed_errors() {
    let absent = Tokenizer::from_file(dir().join("nope.json"));
    assert!(
        matches!(absent, Err(ModelError::Tokenizer(_))),
        "{absent:?}"
    );
    let missing = Tokenizer::from_gpt2_files(dir().join("nope.json"), dir().join("merges.txt"));
    assert!(
        matches!(missing, Err(ModelError::Tokenizer(_))),
        "{missing:?}"
    );
    // The merges file given as the vocabulary: not JSON.
    let corrupt = Tokenizer::from_gpt2_files(dir().join("merges.txt"), dir().join("merges.txt"));
    assert!(
        matches!(corrupt, Err(ModelError::Tokenizer(_))),
        "{corrupt:?}"
    );
    // Out-of-vocabulary ids are refused on decode.
    let tok = load();
    assert!(matches!(
        tok.decode(&[tok.vocab_size() as u32]),
        Err(ModelError::Tokenizer(_))
    ));
}
