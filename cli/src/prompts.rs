//! Where prompts come from (`--prompt`, `--prompt-ids`, `--prompt-file PATH|-`
//! with or without `--jsonl`) and how one becomes token ids (`--chat`: through the
//! chat template).

use std::io::Read;
use std::path::Path;

use privmix_models::{ChatMessage, ChatTemplate, Tokenizer};
use serde_json::Value;

use crate::error::CliError;

/// One prompt as given.
#[derive(Debug, Clone, PartialEq)]
pub enum PromptInput {
    /// A text (a single user turn under `--chat`).
    Text(String),
    /// A conversation (needs `--chat`).
    Messages(Vec<ChatMessage>),
    /// Token ids, used as they are.
    Ids(Vec<u32>),
    /// No prompt: the tokenizer's BOS alone.
    Start,
}

/// The name of `path` in messages: the path, or "standard input" for `-`.
pub fn input_name(path: &Path) -> String {
    if path == Path::new("-") {
        "standard input".into()
    } else {
        path.display().to_string()
    }
}

/// The text of `path`, or all of standard input for `-`.
pub fn read_input(path: &Path) -> Result<String, CliError> {
    let io = |source| CliError::Io {
        what: format!("reading {}", input_name(path)),
        source,
    };
    if path == Path::new("-") {
        let mut text = String::new();
        std::io::stdin().read_to_string(&mut text).map_err(io)?;
        Ok(text)
    } else {
        std::fs::read_to_string(path).map_err(io)
    }
}

/// The prompts of `path`: its whole text as one prompt, or with `jsonl` one per
/// non-blank line, each `{"prompt": "…"}` or `{"messages": [{"role", "content"}, …]}`
/// (the latter only with `chat`). No prompt at all is an error.
pub fn read_prompts(path: &Path, jsonl: bool, chat: bool) -> Result<Vec<PromptInput>, CliError> {
    let text = read_input(path)?;
    let name = input_name(path);
    if !jsonl {
        return Ok(vec![PromptInput::Text(text)]);
    }
    let mut prompts = Vec::new();
    for (i, line) in text.lines().enumerate() {
        if line.trim().is_empty() {
            continue;
        }
        let bad = |reason: String| CliError::Prompt {
            input: name.clone(),
            line: i + 1,
            reason,
        };
        let value: Value =
            serde_json::from_str(line).map_err(|e| bad(format!("not a JSON object: {e}")))?;
        let object = value
            .as_object()
            .ok_or_else(|| bad("not a JSON object".into()))?;
        let prompt = match (object.get("prompt"), object.get("messages")) {
            (Some(Value::String(p)), None) => PromptInput::Text(p.clone()),
            (None, Some(messages)) => {
                let messages: Vec<ChatMessage> =
                    serde_json::from_value(messages.clone()).map_err(|e| {
                        bad(format!(
                            "\"messages\" is not a list of {{\"role\", \"content\"}} strings: {e}"
                        ))
                    })?;
                if !chat {
                    return Err(bad(
                        "a conversation (\"messages\") is rendered by the chat template: pass --chat"
                            .into(),
                    ));
                }
                PromptInput::Messages(messages)
            }
            (Some(_), None) => return Err(bad("\"prompt\" is not a string".into())),
            _ => {
                return Err(bad(
                    "needs exactly one of \"prompt\" (a string) and \"messages\" (a list)".into(),
                ));
            }
        };
        prompts.push(prompt);
    }
    if prompts.is_empty() {
        return Err(CliError::arg(
            "--jsonl",
            format!("{name} holds no prompt (one JSON object a line)"),
        ));
    }
    Ok(prompts)
}

/// The token ids of `input`. A text is encoded with the tokenizer's special
/// tokens (its BOS where it adds one); under a chat `template` a text is one user
/// turn and a conversation is rendered as it is, `add_generation_prompt` opening
/// the assistant's turn, and the render (which writes its own special tokens) is
/// encoded without adding any, as transformers does.
pub fn prompt_ids(
    input: &PromptInput,
    tokenizer: Option<&Tokenizer>,
    template: Option<&ChatTemplate>,
    add_generation_prompt: bool,
) -> Result<Vec<u32>, CliError> {
    let tok_err = |e: privmix_models::ModelError| CliError::Tokenizer(e.to_string());
    let chat_err = |source| CliError::ChatTemplate { source };
    let render = |template: &ChatTemplate, messages: &[ChatMessage]| {
        template
            .render(messages, add_generation_prompt)
            .map_err(chat_err)
    };
    let ids = match (input, tokenizer, template) {
        (PromptInput::Ids(ids), _, None) => ids.clone(),
        (PromptInput::Ids(_), _, Some(_)) => {
            return Err(CliError::arg(
                "--chat",
                "renders text prompts (--prompt, --prompt-file), not --prompt-ids",
            ));
        }
        (_, None, _) => return Err(CliError::NoTokenizer),
        (PromptInput::Text(text), Some(t), None) => t.encode(text, true).map_err(tok_err)?,
        (PromptInput::Text(text), Some(t), Some(template)) => {
            let rendered = render(template, &[ChatMessage::new("user", text.as_str())])?;
            t.encode(&rendered, false).map_err(tok_err)?
        }
        (PromptInput::Messages(messages), Some(t), Some(template)) => t
            .encode(&render(template, messages)?, false)
            .map_err(tok_err)?,
        (PromptInput::Messages(_), Some(_), None) => {
            return Err(CliError::arg(
                "--chat",
                "a conversation (\"messages\") is rendered by the chat template: pass --chat",
            ));
        }
        (PromptInput::Start, Some(_), Some(_)) => {
            return Err(CliError::arg(
                "--chat",
                "needs a prompt to render (--prompt or --prompt-file)",
            ));
        }
        (PromptInput::Start, Some(t), None) => t.bos_id().into_iter().collect(),
    };
    if ids.is_empty() {
        return Err(CliError::arg(
            "--prompt",
            "the prompt is empty and the tokenizer has no BOS token to start from",
        ));
    }
    Ok(ids)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn write(name: &str, text: &str) -> std::path::PathBuf {
        let path =
            std::env::temp_dir().join(format!("privmix-prompts-{name}-{}", std::process::id()));
        std::fs::write(&path, text).unwrap();
        path
    }

    #[test]
    fn json_lines_give_texts_and_conversations() {
        let path = write(
            "ok",
            "{\"prompt\": \"a\"}\n\n{\"messages\": [{\"role\": \"user\", \"content\": \"b\"}]}\n",
        );
        let prompts = read_prompts(&path, true, true).unwrap();
        assert_eq!(
            prompts,
            [
                PromptInput::Text("a".into()),
                PromptInput::Messages(vec![ChatMessage::new("user", "b")]),
            ]
        );
        // Without --jsonl the whole file is one prompt.
        let whole = read_prompts(&path, false, false).unwrap();
        assert!(matches!(&whole[..], [PromptInput::Text(t)] if t.contains("messages")));
        // Messages without --chat name the flag and the line.
        let err = read_prompts(&path, true, false).unwrap_err();
        assert!(
            matches!(&err, CliError::Prompt { line: 3, reason, .. } if reason.contains("--chat")),
            "{err}"
        );
        std::fs::remove_file(path).unwrap();
    }

    #[test]
    fn malformed_lines_name_their_line() {
        for (text, line) in [
            ("{\"prompt\": \"a\"}\nnot json\n", 2),
            ("[1, 2]\n", 1),
            ("{\"prompt\": 3}\n", 1),
            ("{\"prompt\": \"a\", \"messages\": []}\n", 1),
            ("{\"messages\": [{\"role\": \"user\"}]}\n", 1),
        ] {
            let path = write("bad", text);
            let err = read_prompts(&path, true, true).unwrap_err();
            assert!(
                matches!(&err, CliError::Prompt { line: l, .. } if *l == line),
                "{text:?}: {err}"
            );
            std::fs::remove_file(path).unwrap();
        }
        let path = write("empty", "\n\n");
        assert!(read_prompts(&path, true, true).is_err());
        std::fs::remove_file(path).unwrap();
    }
}
