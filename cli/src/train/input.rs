//! Reading a provider's data as users: JSON lines `{"user": …, "text": …}`
//! (a file, or `-` for stdin), or a folder with one text file per user.
//!
//! A user may have many records: their texts are joined, in the order read,
//! with a blank line between them, into that user's one text. The unit of
//! privacy downstream is the user, so a user's records are never split.

use std::collections::HashMap;
use std::io::Read;
use std::path::Path;

use privmix_ensemble::data::Corpus;
use serde_json::Value;

use super::error::TrainCmdError;
use crate::error::CliError;

/// Put between two records of one user.
const RECORD_SEPARATOR: &str = "\n\n";

/// The users of `--data`: `-` reads JSON lines from stdin, a folder is one
/// file per user (the file name is the user id), any other path a JSON-lines file.
pub fn read_corpus(data: &Path) -> Result<Corpus, CliError> {
    if data.as_os_str() == "-" {
        let mut text = String::new();
        std::io::stdin()
            .read_to_string(&mut text)
            .map_err(|source| CliError::Io {
                what: "reading the data from stdin".into(),
                source,
            })?;
        return Ok(parse_jsonl(&text, "stdin")?);
    }
    if data.is_dir() {
        return Ok(read_folder(data)?);
    }
    let bytes = std::fs::read(data).map_err(|source| CliError::Io {
        what: format!("reading --data {}", data.display()),
        source,
    })?;
    let text = String::from_utf8(bytes).map_err(|e| TrainCmdError::BadDataFile {
        path: data.to_path_buf(),
        reason: format!(
            "not UTF-8 text (invalid byte at offset {})",
            e.utf8_error().valid_up_to()
        ),
    })?;
    Ok(parse_jsonl(&text, &data.display().to_string())?)
}

/// A JSON value's kind, for messages.
fn kind(v: &Value) -> &'static str {
    match v {
        Value::Null => "null",
        Value::Bool(_) => "a boolean",
        Value::Number(_) => "a number",
        Value::String(_) => "a string",
        Value::Array(_) => "an array",
        Value::Object(_) => "an object",
    }
}

/// The users of JSON-lines `text` (`source_name` names it in errors). Blank
/// lines are skipped; every other line must be an object with a non-empty
/// string `user` and a non-empty string `text` (other fields are ignored).
pub fn parse_jsonl(text: &str, source_name: &str) -> Result<Corpus, TrainCmdError> {
    let mut users: Vec<(String, String)> = Vec::new();
    let mut index: HashMap<String, usize> = HashMap::new();
    for (i, raw) in text.lines().enumerate() {
        let line = raw.trim();
        if line.is_empty() {
            continue;
        }
        let bad = |field, reason: String| TrainCmdError::BadLine {
            source_name: source_name.to_string(),
            line: i + 1,
            field,
            reason,
        };
        let value: Value =
            serde_json::from_str(line).map_err(|e| bad(None, format!("not JSON: {e}")))?;
        let Value::Object(record) = &value else {
            return Err(bad(
                None,
                format!(
                    "expected an object {{\"user\": …, \"text\": …}}, found {}",
                    kind(&value)
                ),
            ));
        };
        let string = |field: &'static str| -> Result<&str, TrainCmdError> {
            match record.get(field) {
                None => Err(bad(Some(field), "missing".into())),
                Some(Value::String(s)) if s.is_empty() => Err(bad(Some(field), "empty".into())),
                Some(Value::String(s)) => Ok(s),
                Some(other) => Err(bad(
                    Some(field),
                    format!("expected a string, found {}", kind(other)),
                )),
            }
        };
        let user = string("user")?;
        let body = string("text")?;
        match index.get(user) {
            Some(&k) => {
                users[k].1.push_str(RECORD_SEPARATOR);
                users[k].1.push_str(body);
            }
            None => {
                index.insert(user.to_string(), users.len());
                users.push((user.to_string(), body.to_string()));
            }
        }
    }
    Corpus::from_pairs(users).map_err(|source| TrainCmdError::Data {
        what: source_name.to_string(),
        source,
    })
}

/// One user per regular file of `dir` (names starting with `.` are skipped);
/// the file name is the user id and the file's UTF-8 content the text.
fn read_folder(dir: &Path) -> Result<Corpus, TrainCmdError> {
    let failed = |path: &Path, e: std::io::Error| TrainCmdError::BadDataFile {
        path: path.to_path_buf(),
        reason: e.to_string(),
    };
    let mut entries: Vec<_> = std::fs::read_dir(dir)
        .map_err(|e| failed(dir, e))?
        .collect::<Result<_, _>>()
        .map_err(|e| failed(dir, e))?;
    entries.sort_by_key(|e| e.file_name());
    let mut users = Vec::with_capacity(entries.len());
    for entry in entries {
        let path = entry.path();
        let Some(name) = entry.file_name().to_str().map(str::to_string) else {
            return Err(TrainCmdError::BadDataFile {
                path,
                reason: "the file name (the user id) is not UTF-8".into(),
            });
        };
        if name.starts_with('.') {
            continue;
        }
        if !path.is_file() {
            return Err(TrainCmdError::BadDataFile {
                path,
                reason: "not a regular file: --data as a folder holds one text file per user"
                    .into(),
            });
        }
        let bytes = std::fs::read(&path).map_err(|e| failed(&path, e))?;
        let text = String::from_utf8(bytes).map_err(|e| TrainCmdError::BadDataFile {
            path: path.clone(),
            reason: format!(
                "not UTF-8 text (invalid byte at offset {})",
                e.utf8_error().valid_up_to()
            ),
        })?;
        users.push((name, text));
    }
    Corpus::from_pairs(users).map_err(|source| TrainCmdError::Data {
        what: dir.display().to_string(),
        source,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn records_of_one_user_are_joined() {
        let c = parse_jsonl(
            "{\"user\": \"a\", \"text\": \"one\"}\n\n{\"user\": \"b\", \"text\": \"two\", \"x\": 1}\n{\"user\": \"a\", \"text\": \"three\"}\n",
            "t",
        )
        .unwrap();
        assert_eq!(c.len(), 2);
        assert_eq!(c.get("a").unwrap().text, "one\n\nthree");
        assert_eq!(c.get("b").unwrap().text, "two");
    }

    #[test]
    fn bad_lines_name_the_line_and_field() {
        let cases = [
            (
                "{\"user\": \"a\", \"text\": \"x\"}\n{\"text\": \"y\"}",
                2,
                Some("user"),
            ),
            ("{\"user\": 3, \"text\": \"y\"}", 1, Some("user")),
            ("\n\n{\"user\": \"a\"}", 3, Some("text")),
            ("{\"user\": \"a\", \"text\": \"\"}", 1, Some("text")),
            ("{\"user\": \"a\", \"text\": [1]}", 1, Some("text")),
            ("{\"user\": \"a\", \"text\": \"x\"}\nnot json", 2, None),
            ("[1, 2]", 1, None),
        ];
        for (text, want_line, want_field) in cases {
            match parse_jsonl(text, "data.jsonl") {
                Err(TrainCmdError::BadLine { line, field, .. }) => {
                    assert_eq!((line, field), (want_line, want_field), "{text:?}")
                }
                other => panic!("{text:?}: {other:?}"),
            }
        }
        let message = parse_jsonl("{\"user\": 3, \"text\": \"y\"}", "data.jsonl")
            .unwrap_err()
            .to_string();
        assert_eq!(
            message,
            "data.jsonl line 1: field \"user\": expected a string, found a number"
        );
        assert!(matches!(
            parse_jsonl("\n \n", "empty"),
            Err(TrainCmdError::Data { .. })
        ));
    }
}
