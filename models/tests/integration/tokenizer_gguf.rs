//! The tokenizer rebuilt from GGUF metadata gives exactly llama.cpp's ids on
//! 26 fixed strings (ASCII, runs of spaces, newlines, tabs, digits,
//! contractions, accents, CJK, emoji, code), with and without BOS, and decodes
//! them back to the text. Golden ids: `fixtures/tokenizer/make_tokens.py`
//! (llama-cpp-python 0.3.36, `Llama(vocab_only=True).tokenize`). The GGUF
//! files are not in the repository; a missing one prints `skipped:`.

use crate::runtime_support;

use privmix_models::gguf::GgufFile;
use privmix_models::{ModelError, Tokenizer};
use serde_json::Value;

fn check(gguf: &str, golden: &str, bos: Option<u32>, eos: Option<u32>) {
    let Some(path) = runtime_support::real_weights(gguf) else {
        return;
    };
    let file = GgufFile::open(&path).expect("open gguf");
    let tok = Tokenizer::from_gguf(&file).expect("tokenizer from gguf");
    assert_eq!(tok.bos_id(), bos);
    assert_eq!(tok.eos_id(), eos);
    let text = std::fs::read_to_string(runtime_support::fixture(&format!("tokenizer/{golden}")))
        .expect("golden json");
    let doc: Value = serde_json::from_str(&text).expect("json");
    let ids = |v: &Value| -> Vec<u32> {
        v.as_array()
            .expect("ids")
            .iter()
            .map(|x| x.as_u64().expect("id") as u32)
            .collect()
    };
    let mut mismatches = Vec::new();
    for case in doc["cases"].as_array().expect("cases") {
        let s = case["text"].as_str().expect("text");
        let want = ids(&case["ids"]);
        let want_special = ids(&case["ids_add_special"]);
        let got = tok.encode(s, false).expect("encode");
        let got_special = tok.encode(s, true).expect("encode");
        if got != want || got_special != want_special {
            mismatches.push(format!("{s:?}: ours {got:?} llama.cpp {want:?}"));
            continue;
        }
        assert_eq!(tok.decode(&want).expect("decode"), s, "decode of {s:?}");
    }
    assert!(
        mismatches.is_empty(),
        "{gguf}: {} strings differ from llama.cpp:\n{}",
        mismatches.len(),
        mismatches.join("\n")
    );
}

#[test]
fn smollm2_bpe_matches_llama_cpp() {
    check("smollm2.gguf", "smollm2.json", Some(1), Some(2));
}

#[test]
fn gemma3_sentencepiece_matches_llama_cpp() {
    check("gemma3.gguf", "gemma3.json", Some(2), Some(1));
}

#[test]
fn decode_rejects_out_of_vocabulary_ids() {
    let Some(path) = runtime_support::real_weights("smollm2.gguf") else {
        return;
    };
    let tok = Tokenizer::from_gguf(&GgufFile::open(&path).expect("open")).expect("tokenizer");
    assert_eq!(tok.vocab_size(), 49152);
    assert!(matches!(
        tok.decode(&[1, 49152]),
        Err(ModelError::Tokenizer(_))
    ));
}
