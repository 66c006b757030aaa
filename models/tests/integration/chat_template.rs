//! Chat templates render exactly what transformers' `apply_chat_template`
//! renders, and the end-of-turn stop ids come from the files transformers and
//! llama.cpp read them from.
//!
//! `fixtures/chat/make_chat_fixtures.py` wrote the hand-made Hugging Face folder
//! `fixtures/chat/hf` and `fixtures/chat/expected.json`: transformers' renders of
//! each conversation (or the exception it raised) for that folder and for
//! SmolLM2-135M-Instruct's GGUF template. The GGUF is not in the repository
//! (`cargo xtask fetch-models` installs it into `models-cache/`); when it is
//! absent its part prints `skipped:` and passes.

use crate::runtime_support;

use std::path::{Path, PathBuf};

use privmix_models::gguf::GgufFile;
use privmix_models::{ChatMessage, ChatTemplate, ModelError, Tokenizer};
use serde_json::Value;

fn chat_fixture(rel: &str) -> PathBuf {
    runtime_support::fixture(&format!("chat/{rel}"))
}

fn expected(key: &str) -> Vec<Value> {
    let text = std::fs::read_to_string(chat_fixture("expected.json")).unwrap();
    let all: Value = serde_json::from_str(&text).unwrap();
    all[key].as_array().unwrap().clone()
}

fn messages(case: &Value) -> Vec<ChatMessage> {
    serde_json::from_value(case["messages"].clone()).unwrap()
}

/// Renders every case of `expected.json[key]` with `template` and compares with
/// transformers' text, or checks the render fails with transformers' message.
fn check_cases(template: &ChatTemplate, key: &str) {
    let cases = expected(key);
    assert!(cases.len() >= 5, "{key}: {} cases", cases.len());
    for (i, case) in cases.iter().enumerate() {
        let generation = case["add_generation_prompt"].as_bool().unwrap();
        let got = template.render(&messages(case), generation);
        match (case.get("text"), case.get("error")) {
            (Some(text), None) => {
                let got = got.unwrap_or_else(|e| panic!("{key}[{i}]: {e}"));
                assert_eq!(got, text.as_str().unwrap(), "{key}[{i}]");
            }
            (None, Some(error)) => {
                let error = error.as_str().unwrap();
                match got {
                    Err(ModelError::ChatTemplate(message)) => {
                        // The empty conversation: transformers' own check, worded here.
                        let wanted = if error.contains("empty conversation") {
                            "empty conversation"
                        } else {
                            error
                        };
                        assert!(message.contains(wanted), "{key}[{i}]: {message}");
                    }
                    other => panic!("{key}[{i}]: expected the error {error:?}, got {other:?}"),
                }
            }
            _ => panic!("{key}[{i}]: a case has a text or an error"),
        }
    }
}

#[test]
fn hf_folder_template_renders_as_transformers() {
    let template = ChatTemplate::from_hf_folder(chat_fixture("hf")).unwrap();
    assert_eq!(
        template
            .special_tokens()
            .get("eos_token")
            .map(String::as_str),
        Some("<|im_end|>")
    );
    check_cases(&template, "hf");
}

#[test]
fn gguf_template_renders_as_transformers() {
    let Some(path) = runtime_support::real_weights("smollm2.gguf") else {
        return;
    };
    let file = GgufFile::open(&path).unwrap();
    let template = ChatTemplate::from_gguf(&file).unwrap();
    check_cases(&template, "smollm2_gguf");
    // The GGUF's own end of turn: <|im_end|> (id 2) is its EOS.
    let tokenizer = Tokenizer::from_gguf(&file).unwrap();
    assert_eq!(tokenizer.stop_ids(), [2]);
    let text = template
        .render(&[ChatMessage::new("user", "Hi")], true)
        .unwrap();
    let ids = tokenizer.encode(&text, false).unwrap();
    assert_eq!(ids[0], 1, "<|im_start|> opens the render: {ids:?}");
    assert!(ids.contains(&2));
}

/// A temporary copy of the fixture folder holding only `files`.
struct Copy(PathBuf);

impl Copy {
    fn of(files: &[&str], tag: &str) -> Self {
        let dir = std::env::temp_dir().join(format!("privmix-chat-{tag}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        for f in files {
            std::fs::copy(chat_fixture(&format!("hf/{f}")), dir.join(f)).unwrap();
        }
        Self(dir)
    }
    fn path(&self) -> &Path {
        &self.0
    }
}

impl Drop for Copy {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

#[test]
fn stop_ids_come_from_generation_config_then_tokenizer_config() {
    // generation_config.json's list.
    let t = Tokenizer::from_file(chat_fixture("hf/tokenizer.json")).unwrap();
    assert_eq!(t.stop_ids(), [2, 3]);
    assert!(t.is_stop(2) && t.is_stop(3) && !t.is_stop(1));
    // EOS is tokenizer_config.json's <|im_end|>, not the <|endoftext|> in the
    // vocabulary (SmolLM2-Instruct's folder: the turn ends at <|im_end|>).
    assert_eq!(t.eos_id(), Some(2));
    assert_eq!(t.bos_id(), Some(1));

    // Without generation_config.json: tokenizer_config.json's eos_token.
    let copy = Copy::of(
        &["tokenizer.json", "tokenizer_config.json"],
        "no-generation",
    );
    let t = Tokenizer::from_file(copy.path().join("tokenizer.json")).unwrap();
    assert_eq!(t.stop_ids(), [2]);

    // A single id.
    std::fs::write(
        copy.path().join("generation_config.json"),
        r#"{"eos_token_id": 3}"#,
    )
    .unwrap();
    let t = Tokenizer::from_file(copy.path().join("tokenizer.json")).unwrap();
    assert_eq!(t.stop_ids(), [3]);

    // Neither config: the vocabulary guess (<|endoftext|>).
    let bare = Copy::of(&["tokenizer.json"], "bare");
    let t = Tokenizer::from_file(bare.path().join("tokenizer.json")).unwrap();
    assert_eq!(t.stop_ids(), [3]);
    assert_eq!(t.eos_id(), Some(3));
}

#[test]
fn malformed_configs_are_typed_errors() {
    let copy = Copy::of(&["tokenizer.json", "tokenizer_config.json"], "bad");
    let tok = copy.path().join("tokenizer.json");
    let generation = copy.path().join("generation_config.json");
    for bad in [
        r#"{"eos_token_id": 256}"#,
        r#"{"eos_token_id": "x"}"#,
        r#"{"eos_token_id": [2, -1]}"#,
        "not json",
    ] {
        std::fs::write(&generation, bad).unwrap();
        let err = Tokenizer::from_file(&tok).unwrap_err();
        assert!(
            matches!(&err, ModelError::ConfigJson { path, .. } if path.contains("generation_config")),
            "{bad}: {err}"
        );
    }
    std::fs::remove_file(&generation).unwrap();
    let config = copy.path().join("tokenizer_config.json");
    std::fs::write(&config, r#"{"eos_token": "<|not-a-token|>"}"#).unwrap();
    let err = Tokenizer::from_file(&tok).unwrap_err();
    assert!(err.to_string().contains("<|not-a-token|>"), "{err}");

    // No template at all, a list without "default", a template that does not compile.
    std::fs::write(&config, r#"{"eos_token": "<|im_end|>"}"#).unwrap();
    let err = ChatTemplate::from_hf_folder(copy.path()).unwrap_err();
    assert!(err.to_string().contains("no chat template"), "{err}");
    std::fs::write(
        &config,
        r#"{"chat_template": [{"name": "tool_use", "template": "x"}]}"#,
    )
    .unwrap();
    let err = ChatTemplate::from_hf_folder(copy.path()).unwrap_err();
    assert!(err.to_string().contains("\"default\""), "{err}");
    std::fs::write(&config, r#"{"chat_template": "{% for m in messages %}"}"#).unwrap();
    let err = ChatTemplate::from_hf_folder(copy.path()).unwrap_err();
    assert!(
        matches!(&err, ModelError::ChatTemplate(m) if m.contains("does not compile")),
        "{err}"
    );
    // chat_template.jinja takes precedence over the config's field.
    std::fs::write(
        copy.path().join("chat_template.jinja"),
        "{% for m in messages %}[{{ m.role }}] {{ m.content }}\n{% endfor %}",
    )
    .unwrap();
    let t = ChatTemplate::from_hf_folder(copy.path()).unwrap();
    let text = t
        .render(
            &[
                ChatMessage::new("user", "a"),
                ChatMessage::new("assistant", "b"),
            ],
            false,
        )
        .unwrap();
    assert_eq!(text, "[user] a\n[assistant] b\n");
}

/// Single templates over one message (`snippets` in expected.json): `tojson`'s
/// options follow Python's `json.dumps` and `none`/`true` print as Python prints
/// them, as transformers renders them.
#[test]
fn tojson_and_python_printing_render_as_transformers() {
    let cases = expected("snippets");
    assert!(cases.len() >= 5);
    for case in &cases {
        let source = case["template"].as_str().unwrap();
        let template = ChatTemplate::new(source, Default::default()).unwrap();
        let got = template
            .render(&messages(case), false)
            .unwrap_or_else(|e| panic!("{source}: {e}"));
        assert_eq!(got, case["text"].as_str().unwrap(), "{source}");
    }
}
