//! Chat templates: a conversation rendered to the prompt text a chat model was
//! trained on, the way Hugging Face transformers' `apply_chat_template` renders it.
//!
//! A template is Jinja source stored with the tokenizer: `tokenizer_config.json`'s
//! `chat_template` (a string, or a list of `{name, template}` of which `default` is
//! used), or `chat_template.jinja` beside it, in a Hugging Face folder
//! ([`ChatTemplate::from_hf_folder`]); `tokenizer.chat_template` in a GGUF file
//! ([`ChatTemplate::from_gguf`]).
//!
//! Rendering follows transformers (`utils/chat_template_utils.py`,
//! `_compile_jinja_template` and `render_jinja_template`):
//! - the environment has `trim_blocks` and `lstrip_blocks` on and drops one
//!   trailing newline of the template, as transformers' Jinja environment does;
//! - the template sees `messages` (a list of `{role, content}` maps in that key
//!   order), `add_generation_prompt`, `tools` and `documents` (none), and the
//!   tokenizer's special-token strings (`bos_token`, `eos_token`, `unk_token`,
//!   `pad_token`, … where the source names them);
//! - `raise_exception(message)` ends the render with a [`ModelError::ChatTemplate`]
//!   carrying the message;
//! - Python's string, dict and list methods (`.strip()`, `.startswith()`,
//!   `.items()`, …) come from minijinja-contrib's `pycompat`;
//! - `tojson` writes what Python's `json.dumps(x, ensure_ascii=False)` writes
//!   (transformers' own filter; `indent`, `separators`, `sort_keys` and
//!   `ensure_ascii` as keyword arguments);
//! - `none`, `true` and `false` print as Python prints them (`None`, `True`, `False`).
//!
//! Not provided: transformers' `strftime_now` (templates that test
//! `strftime_now is defined` take their fallback date) and the `{% generation %}`
//! tag of assistant masks.

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::path::Path;

use minijinja::syntax::SyntaxConfig;
use minijinja::value::{Kwargs, ValueKind};
use minijinja::{Environment, Error, ErrorKind, Value, context};
use serde::{Deserialize, Serialize};
use serde_json::Value as Json;

use crate::error::ModelError;
use crate::gguf::{GgufFile, MetadataValue};

/// The name the template is compiled under (no extension: no auto-escaping).
const TEMPLATE_NAME: &str = "chat_template";

/// The special tokens of `tokenizer_config.json` that transformers hands to the
/// template (its `special_tokens_map`), each under its own name.
const SPECIAL_TOKEN_KEYS: [&str; 7] = [
    "bos_token",
    "eos_token",
    "unk_token",
    "sep_token",
    "pad_token",
    "cls_token",
    "mask_token",
];

/// One turn of a conversation.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ChatMessage {
    /// Who speaks: `system`, `user`, `assistant` (or any role the template knows).
    pub role: String,
    /// What they say.
    pub content: String,
}

impl ChatMessage {
    /// A message from its role and content.
    pub fn new(role: impl Into<String>, content: impl Into<String>) -> Self {
        Self {
            role: role.into(),
            content: content.into(),
        }
    }
}

/// A compiled chat template with the special-token strings it may refer to.
#[derive(Debug, Clone)]
pub struct ChatTemplate {
    env: Environment<'static>,
    source: String,
    special_tokens: BTreeMap<String, String>,
}

fn chat_err(message: impl Into<String>) -> ModelError {
    ModelError::ChatTemplate(message.into())
}

impl ChatTemplate {
    /// Compiles `source` with the given special-token strings (`bos_token`,
    /// `eos_token`, … as the template names them). A syntax error is a
    /// [`ModelError::ChatTemplate`] naming its line.
    pub fn new(
        source: impl Into<String>,
        special_tokens: BTreeMap<String, String>,
    ) -> Result<Self, ModelError> {
        let source = source.into();
        let mut env = Environment::new();
        let syntax = SyntaxConfig::builder()
            .trim_blocks(true)
            .lstrip_blocks(true)
            .keep_trailing_newline(false)
            .build()
            .map_err(|e| chat_err(describe(&e)))?;
        env.set_syntax(syntax);
        env.set_unknown_method_callback(minijinja_contrib::pycompat::unknown_method_callback);
        env.set_formatter(python_formatter);
        env.add_function("raise_exception", raise_exception);
        env.add_filter("tojson", tojson);
        env.add_template_owned(TEMPLATE_NAME, source.clone())
            .map_err(|e| chat_err(format!("the template does not compile: {}", describe(&e))))?;
        Ok(Self {
            env,
            source,
            special_tokens,
        })
    }

    /// The template of a Hugging Face folder: `chat_template.jinja` if present
    /// (transformers reads it in preference to the config's field), else
    /// `tokenizer_config.json`'s `chat_template` (a string, or a list of
    /// `{name, template}` of which the one named `default` is used, as
    /// transformers does without tools), with the config's special-token strings
    /// (each a string or an `AddedToken` object with a `content`). No template is
    /// an error naming the folder.
    pub fn from_hf_folder(dir: impl AsRef<Path>) -> Result<Self, ModelError> {
        let dir = dir.as_ref();
        let config_path = dir.join("tokenizer_config.json");
        let config = if config_path.is_file() {
            Some(read_json(&config_path)?)
        } else {
            None
        };
        let mut special_tokens = BTreeMap::new();
        if let Some(config) = &config {
            for key in SPECIAL_TOKEN_KEYS {
                if let Some(token) = special_token_string(config, key, &config_path)? {
                    special_tokens.insert(key.to_string(), token);
                }
            }
        }
        let jinja = dir.join("chat_template.jinja");
        if jinja.is_file() {
            let source = std::fs::read_to_string(&jinja).map_err(|e| ModelError::Io {
                path: jinja.display().to_string(),
                message: e.to_string(),
            })?;
            return Self::new(source, special_tokens);
        }
        let field = config
            .as_ref()
            .and_then(|c| c.get("chat_template"))
            .filter(|v| !v.is_null());
        let Some(field) = field else {
            return Err(chat_err(format!(
                "{} has no chat template (neither chat_template.jinja nor a chat_template in tokenizer_config.json)",
                dir.display()
            )));
        };
        let source = template_field(field, &config_path)?;
        Self::new(source, special_tokens)
    }

    /// The template of a GGUF file (`tokenizer.chat_template`), with the BOS and
    /// EOS strings of `tokenizer.ggml.tokens` at `tokenizer.ggml.bos_token_id` /
    /// `eos_token_id` (as transformers' GGUF loader sets them).
    pub fn from_gguf(file: &GgufFile) -> Result<Self, ModelError> {
        let source = match file.metadata_value("tokenizer.chat_template") {
            Some(v) => v
                .as_str()
                .ok_or_else(|| chat_err("tokenizer.chat_template is not a string"))?,
            None => return Err(chat_err("the GGUF file has no tokenizer.chat_template")),
        };
        let tokens = match file.metadata_value("tokenizer.ggml.tokens") {
            Some(MetadataValue::Array(a)) => a.as_slice(),
            _ => &[],
        };
        let mut special_tokens = BTreeMap::new();
        for (key, name) in [
            ("tokenizer.ggml.bos_token_id", "bos_token"),
            ("tokenizer.ggml.eos_token_id", "eos_token"),
            ("tokenizer.ggml.unknown_token_id", "unk_token"),
            ("tokenizer.ggml.padding_token_id", "pad_token"),
        ] {
            let Some(value) = file.metadata_value(key) else {
                continue;
            };
            let token = value
                .as_u64()
                .and_then(|id| usize::try_from(id).ok())
                .and_then(|id| tokens.get(id))
                .and_then(MetadataValue::as_str)
                .ok_or_else(|| {
                    chat_err(format!(
                        "{key} is not the id of a token of tokenizer.ggml.tokens"
                    ))
                })?;
            special_tokens.insert(name.to_string(), token.to_string());
        }
        Self::new(source, special_tokens)
    }

    /// The prompt text of `messages`; with `add_generation_prompt` the template
    /// appends what opens the assistant's next turn. The text holds the special
    /// tokens the template writes (BOS included where it writes one): encode it
    /// without adding special tokens again, as transformers does. An empty
    /// conversation is refused, as transformers refuses it.
    pub fn render(
        &self,
        messages: &[ChatMessage],
        add_generation_prompt: bool,
    ) -> Result<String, ModelError> {
        if messages.is_empty() {
            // transformers refuses it before the template runs.
            return Err(chat_err(
                "cannot apply a chat template to an empty conversation: give at least one message",
            ));
        }
        let messages: Vec<Value> = messages
            .iter()
            .map(|m| context! { role => m.role.as_str(), content => m.content.as_str() })
            .collect();
        let ctx = context! {
            messages => messages,
            add_generation_prompt => add_generation_prompt,
            tools => (),
            documents => (),
            ..Value::from(self.special_tokens.clone())
        };
        let template = self
            .env
            .get_template(TEMPLATE_NAME)
            .map_err(|e| chat_err(describe(&e)))?;
        template.render(ctx).map_err(|e| chat_err(describe(&e)))
    }

    /// The template's Jinja source.
    pub fn source(&self) -> &str {
        &self.source
    }

    /// The special-token strings handed to the template, by name.
    pub fn special_tokens(&self) -> &BTreeMap<String, String> {
        &self.special_tokens
    }
}

/// An error's message with its detail and the template line it arose on.
fn describe(e: &Error) -> String {
    let mut text = match e.detail() {
        Some(detail) if e.kind() == ErrorKind::InvalidOperation => detail.to_string(),
        Some(detail) => format!("{}: {detail}", e.kind()),
        None => e.kind().to_string(),
    };
    if let Some(line) = e.line() {
        let _ = write!(text, " (template line {line})");
    }
    text
}

/// transformers' `raise_exception`: the template refuses the conversation.
fn raise_exception(message: String) -> Result<Value, Error> {
    Err(Error::new(
        ErrorKind::InvalidOperation,
        format!("the chat template raised an exception: {message}"),
    ))
}

/// Prints values as Python's `str` does where minijinja's differs: `None`,
/// `True`, `False`.
fn python_formatter(
    out: &mut minijinja::Output,
    state: &mut minijinja::State,
    value: &Value,
) -> Result<(), Error> {
    match value.kind() {
        ValueKind::None => out.write_str("None").map_err(Error::from),
        ValueKind::Bool => out
            .write_str(if value.is_true() { "True" } else { "False" })
            .map_err(Error::from),
        _ => minijinja::escape_formatter(out, state, value),
    }
}

/// transformers' `tojson`: Python's `json.dumps(x, ensure_ascii=False,
/// indent=None, separators=None, sort_keys=False)`, the options as keywords.
fn tojson(value: &Value, kwargs: Kwargs) -> Result<String, Error> {
    let ensure_ascii: Option<bool> = kwargs.get("ensure_ascii")?;
    let indent: Option<Value> = kwargs.get("indent")?;
    let separators: Option<Value> = kwargs.get("separators")?;
    let sort_keys: Option<bool> = kwargs.get("sort_keys")?;
    kwargs.assert_all_used()?;
    let indent = match indent {
        None => None,
        Some(v) if v.is_none() => None,
        Some(v) => match v.kind() {
            ValueKind::String => Some(v.as_str().unwrap_or_default().to_string()),
            ValueKind::Number => {
                let n = i64::try_from(v.clone()).map_err(|_| {
                    Error::new(
                        ErrorKind::InvalidOperation,
                        "tojson: indent is not an integer",
                    )
                })?;
                Some(" ".repeat(usize::try_from(n).unwrap_or(0)))
            }
            _ => {
                return Err(Error::new(
                    ErrorKind::InvalidOperation,
                    "tojson: indent must be an integer or a string",
                ));
            }
        },
    };
    // Python's defaults: ", " and ": ", or "," and ": " with an indent.
    let (item_sep, key_sep) = match separators {
        Some(v) if !v.is_none() => {
            let parts: Vec<Value> = v.try_iter()?.collect();
            match parts.as_slice() {
                [a, b] => match (a.as_str(), b.as_str()) {
                    (Some(a), Some(b)) => (a.to_string(), b.to_string()),
                    _ => {
                        return Err(Error::new(
                            ErrorKind::InvalidOperation,
                            "tojson: separators must be two strings",
                        ));
                    }
                },
                _ => {
                    return Err(Error::new(
                        ErrorKind::InvalidOperation,
                        "tojson: separators must be two strings",
                    ));
                }
            }
        }
        _ if indent.is_some() => (",".to_string(), ": ".to_string()),
        _ => (", ".to_string(), ": ".to_string()),
    };
    let options = JsonOptions {
        ensure_ascii: ensure_ascii.unwrap_or(false),
        indent,
        item_sep,
        key_sep,
        sort_keys: sort_keys.unwrap_or(false),
    };
    let mut out = String::new();
    write_json(&mut out, value, &options, 0)?;
    Ok(out)
}

struct JsonOptions {
    ensure_ascii: bool,
    indent: Option<String>,
    item_sep: String,
    key_sep: String,
    sort_keys: bool,
}

impl JsonOptions {
    /// The newline and indentation before an item at `depth` (nothing without an indent).
    fn newline(&self, out: &mut String, depth: usize) {
        if let Some(indent) = &self.indent {
            out.push('\n');
            for _ in 0..depth {
                out.push_str(indent);
            }
        }
    }
}

fn not_serializable(value: &Value) -> Error {
    Error::new(
        ErrorKind::InvalidOperation,
        format!(
            "tojson: a value of type {} is not JSON serializable",
            value.kind()
        ),
    )
}

fn write_json(
    out: &mut String,
    value: &Value,
    options: &JsonOptions,
    depth: usize,
) -> Result<(), Error> {
    match value.kind() {
        ValueKind::None => out.push_str("null"),
        ValueKind::Bool => out.push_str(if value.is_true() { "true" } else { "false" }),
        ValueKind::Number => write_number(out, value)?,
        ValueKind::String => write_string(out, value.as_str().unwrap_or_default(), options),
        ValueKind::Seq | ValueKind::Iterable => {
            let items: Vec<Value> = value.try_iter()?.collect();
            if items.is_empty() {
                out.push_str("[]");
                return Ok(());
            }
            out.push('[');
            for (i, item) in items.iter().enumerate() {
                if i > 0 {
                    out.push_str(&options.item_sep);
                }
                options.newline(out, depth + 1);
                write_json(out, item, options, depth + 1)?;
            }
            options.newline(out, depth);
            out.push(']');
        }
        ValueKind::Map => {
            let mut entries = Vec::new();
            for key in value.try_iter()? {
                let item = value.get_item(&key)?;
                let name = match key.kind() {
                    ValueKind::String => key.as_str().unwrap_or_default().to_string(),
                    ValueKind::Number => {
                        let mut s = String::new();
                        write_number(&mut s, &key)?;
                        s
                    }
                    ValueKind::Bool => (if key.is_true() { "true" } else { "false" }).into(),
                    ValueKind::None => "null".into(),
                    _ => return Err(not_serializable(&key)),
                };
                entries.push((name, item));
            }
            if options.sort_keys {
                entries.sort_by(|a, b| a.0.cmp(&b.0));
            }
            if entries.is_empty() {
                out.push_str("{}");
                return Ok(());
            }
            out.push('{');
            for (i, (name, item)) in entries.iter().enumerate() {
                if i > 0 {
                    out.push_str(&options.item_sep);
                }
                options.newline(out, depth + 1);
                write_string(out, name, options);
                out.push_str(&options.key_sep);
                write_json(out, item, options, depth + 1)?;
            }
            options.newline(out, depth);
            out.push('}');
        }
        _ => return Err(not_serializable(value)),
    }
    Ok(())
}

/// A number as Python's `json.dumps` writes it: integers in full, floats as
/// `repr` (shortest round-trip digits, exponent form below 1e-4 and from 1e16),
/// `NaN` and `Infinity` as Python writes them.
fn write_number(out: &mut String, value: &Value) -> Result<(), Error> {
    if value.is_integer()
        && let Ok(i) = i128::try_from(value.clone())
    {
        let _ = write!(out, "{i}");
        return Ok(());
    }
    let x = f64::try_from(value.clone()).map_err(|_| not_serializable(value))?;
    out.push_str(&python_float_repr(x));
    Ok(())
}

/// Python's `repr(float)`.
fn python_float_repr(x: f64) -> String {
    if x.is_nan() {
        return "NaN".into();
    }
    if x.is_infinite() {
        return if x > 0.0 { "Infinity" } else { "-Infinity" }.into();
    }
    // `{:e}` gives the shortest round-trip digits d.ddd and the decimal exponent.
    let sci = format!("{:e}", x.abs());
    let (mantissa, exp) = sci.split_once('e').unwrap_or((sci.as_str(), "0"));
    let exp: i32 = exp.parse().unwrap_or(0);
    let digits: String = mantissa.chars().filter(|c| *c != '.').collect();
    let sign = if x.is_sign_negative() { "-" } else { "" };
    if (-4..16).contains(&exp) {
        let body = if exp >= 0 {
            let point = exp as usize + 1;
            if digits.len() <= point {
                format!("{digits}{}.0", "0".repeat(point - digits.len()))
            } else {
                format!("{}.{}", &digits[..point], &digits[point..])
            }
        } else {
            format!("0.{}{digits}", "0".repeat((-exp - 1) as usize))
        };
        format!("{sign}{body}")
    } else {
        let (first, rest) = digits.split_at(1);
        let frac = if rest.is_empty() {
            String::new()
        } else {
            format!(".{rest}")
        };
        let esign = if exp < 0 { '-' } else { '+' };
        format!("{sign}{first}{frac}e{esign}{:02}", exp.abs())
    }
}

/// A JSON string as Python's `json.dumps` escapes it.
fn write_string(out: &mut String, s: &str, options: &JsonOptions) {
    out.push('"');
    for c in s.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            '\n' => out.push_str("\\n"),
            '\r' => out.push_str("\\r"),
            '\t' => out.push_str("\\t"),
            '\u{08}' => out.push_str("\\b"),
            '\u{0c}' => out.push_str("\\f"),
            c if (c as u32) < 0x20 => {
                let _ = write!(out, "\\u{:04x}", c as u32);
            }
            c if options.ensure_ascii && !c.is_ascii() => {
                let mut units = [0u16; 2];
                for unit in c.encode_utf16(&mut units) {
                    let _ = write!(out, "\\u{unit:04x}");
                }
            }
            c => out.push(c),
        }
    }
    out.push('"');
}

fn read_json(path: &Path) -> Result<Json, ModelError> {
    let text = std::fs::read_to_string(path).map_err(|e| ModelError::Io {
        path: path.display().to_string(),
        message: e.to_string(),
    })?;
    serde_json::from_str(&text).map_err(|e| ModelError::ConfigJson {
        path: path.display().to_string(),
        message: e.to_string(),
    })
}

/// A special token of `tokenizer_config.json`: a string, an `AddedToken` object
/// (`{"content": …}`), or absent / null.
pub(crate) fn special_token_string(
    config: &Json,
    key: &str,
    path: &Path,
) -> Result<Option<String>, ModelError> {
    match config.get(key) {
        None | Some(Json::Null) => Ok(None),
        Some(Json::String(s)) => Ok(Some(s.clone())),
        Some(Json::Object(o)) => match o.get("content") {
            Some(Json::String(s)) => Ok(Some(s.clone())),
            _ => Err(ModelError::ConfigJson {
                path: path.display().to_string(),
                message: format!("{key} is an object without a string \"content\""),
            }),
        },
        Some(_) => Err(ModelError::ConfigJson {
            path: path.display().to_string(),
            message: format!("{key} is neither a string nor an object with a \"content\""),
        }),
    }
}

/// `chat_template` as a string, or the `default` entry of a list of
/// `{name, template}`.
fn template_field(field: &Json, path: &Path) -> Result<String, ModelError> {
    let bad = |message: String| ModelError::ConfigJson {
        path: path.display().to_string(),
        message,
    };
    match field {
        Json::String(s) => Ok(s.clone()),
        Json::Array(entries) => {
            let mut names = Vec::with_capacity(entries.len());
            for entry in entries {
                let name = entry.get("name").and_then(Json::as_str);
                let template = entry.get("template").and_then(Json::as_str);
                match (name, template) {
                    (Some("default"), Some(t)) => return Ok(t.to_string()),
                    (Some(n), Some(_)) => names.push(n.to_string()),
                    _ => {
                        return Err(bad(
                            "chat_template: every entry of the list needs a string \"name\" and \"template\"".into(),
                        ));
                    }
                }
            }
            Err(chat_err(format!(
                "{}: the chat templates {names:?} include none named \"default\"",
                path.display()
            )))
        }
        _ => Err(bad(
            "chat_template is neither a string nor a list of {name, template}".into(),
        )),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn float_repr_follows_python() {
        for (x, repr) in [
            (1.0, "1.0"),
            (0.5, "0.5"),
            (-2.25, "-2.25"),
            (1e16, "1e+16"),
            (1.5e-5, "1.5e-05"),
            (0.0001, "0.0001"),
            (123456789012345.6, "123456789012345.6"),
            (1e22, "1e+22"),
            (0.1, "0.1"),
            (f64::INFINITY, "Infinity"),
        ] {
            assert_eq!(python_float_repr(x), repr, "{x}");
        }
    }

    #[test]
    fn a_syntax_error_names_the_line() {
        let err = ChatTemplate::new("line one\n{% if %}", BTreeMap::new()).unwrap_err();
        assert!(
            matches!(&err, ModelError::ChatTemplate(m) if m.contains("line 2")),
            "{err}"
        );
    }
}
