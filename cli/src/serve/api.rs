//! The OpenAI-compatible request and response bodies, and their validation.
//!
//! Only what a private mechanism can honour is accepted: one choice (`n` = 1), no
//! log-probabilities (they are functions of the private distributions, which no charge
//! covers), no penalties or biases (they would change the members' distributions in
//! ways the server does not control). Everything refused is a 400 naming the field.

use serde::{Deserialize, Serialize};
use serde_json::{Value, json};

/// A chat message (`{"role": …, "content": …}`).
#[derive(Debug, Clone, Deserialize, Serialize, PartialEq)]
pub struct Message {
    /// `system`, `user` or `assistant`.
    pub role: String,
    /// The text (a string, or OpenAI's list of `{"type": "text", "text": …}` parts).
    pub content: Content,
}

/// A message's content.
#[derive(Debug, Clone, Deserialize, Serialize, PartialEq)]
#[serde(untagged)]
pub enum Content {
    /// Plain text.
    Text(String),
    /// Content parts; only text parts are supported.
    Parts(Vec<ContentPart>),
}

/// One part of a message's content.
#[derive(Debug, Clone, Deserialize, Serialize, PartialEq)]
pub struct ContentPart {
    /// The part's type; only `text` is supported.
    #[serde(rename = "type")]
    pub kind: String,
    /// Its text.
    #[serde(default)]
    pub text: Option<String>,
}

/// `stop`: a string or a list of strings.
#[derive(Debug, Clone, Deserialize, PartialEq)]
#[serde(untagged)]
pub enum Stop {
    /// One stop string.
    One(String),
    /// Several.
    Many(Vec<String>),
}

/// `stream_options`.
#[derive(Debug, Clone, Default, Deserialize, PartialEq)]
pub struct StreamOptions {
    /// Send a final chunk with `usage`.
    #[serde(default)]
    pub include_usage: bool,
}

/// The fields both endpoints share.
#[derive(Debug, Clone, Deserialize)]
pub struct Common {
    /// The model's id (as `/v1/models` lists it).
    pub model: String,
    /// Largest number of tokens to generate.
    #[serde(default, alias = "max_completion_tokens")]
    pub max_tokens: Option<u64>,
    /// Temperature applied to every model's distribution before the mechanism.
    #[serde(default)]
    pub temperature: Option<f64>,
    /// Stream server-sent events.
    #[serde(default)]
    pub stream: bool,
    /// Streaming options.
    #[serde(default)]
    pub stream_options: Option<StreamOptions>,
    /// Stop strings (applied to the released text).
    #[serde(default)]
    pub stop: Option<Stop>,
    /// Number of choices: only 1.
    #[serde(default)]
    pub n: Option<u64>,
    /// Refused: log-probabilities of a private mechanism's distributions.
    #[serde(default)]
    pub logprobs: Option<Value>,
    /// Refused with `logprobs`.
    #[serde(default)]
    pub top_logprobs: Option<Value>,
    /// Refused unless null or 1 (nucleus sampling would cut the released distribution).
    #[serde(default)]
    pub top_p: Option<f64>,
    /// Refused unless 0.
    #[serde(default)]
    pub presence_penalty: Option<f64>,
    /// Refused unless 0.
    #[serde(default)]
    pub frequency_penalty: Option<f64>,
    /// Refused.
    #[serde(default)]
    pub logit_bias: Option<Value>,
    /// Refused: a known seed makes the draws predictable.
    #[serde(default)]
    pub seed: Option<Value>,
}

/// `POST /v1/completions`.
#[derive(Debug, Clone, Deserialize)]
pub struct CompletionRequest {
    /// The prompt: one string (a list of exactly one string is accepted too).
    pub prompt: PromptField,
    /// Refused: echoing the prompt is fine, but only as text the client sent; not supported.
    #[serde(default)]
    pub echo: Option<bool>,
    /// Refused unless null or 1.
    #[serde(default)]
    pub best_of: Option<u64>,
    /// Refused: suffixes need infilling.
    #[serde(default)]
    pub suffix: Option<String>,
    /// The shared fields.
    #[serde(flatten)]
    pub common: Common,
}

/// A completion prompt.
#[derive(Debug, Clone, Deserialize)]
#[serde(untagged)]
pub enum PromptField {
    /// One string.
    Text(String),
    /// A list of strings (exactly one accepted).
    Texts(Vec<String>),
    /// Token ids.
    Ids(Vec<u32>),
}

/// `POST /v1/chat/completions`.
#[derive(Debug, Clone, Deserialize)]
pub struct ChatRequest {
    /// The conversation.
    pub messages: Vec<Message>,
    /// The shared fields.
    #[serde(flatten)]
    pub common: Common,
}

/// A request refused before it started, with its HTTP status.
#[derive(Debug, Clone, PartialEq)]
pub struct ApiError {
    /// HTTP status code.
    pub status: u16,
    /// OpenAI's error `type`.
    pub kind: &'static str,
    /// The field at fault, if one is.
    pub param: Option<String>,
    /// A machine-readable code.
    pub code: &'static str,
    /// What is wrong, for a person.
    pub message: String,
}

impl ApiError {
    /// 400: the field `param` is invalid.
    pub fn invalid(param: &str, message: impl Into<String>) -> Self {
        Self {
            status: 400,
            kind: "invalid_request_error",
            param: Some(param.to_string()),
            code: "invalid_value",
            message: message.into(),
        }
    }

    /// 400: the body is not a valid request.
    pub fn malformed(message: impl Into<String>) -> Self {
        Self {
            status: 400,
            kind: "invalid_request_error",
            param: None,
            code: "invalid_json",
            message: message.into(),
        }
    }

    /// 401: no valid API key.
    pub fn unauthorized(message: impl Into<String>) -> Self {
        Self {
            status: 401,
            kind: "authentication_error",
            param: None,
            code: "invalid_api_key",
            message: message.into(),
        }
    }

    /// 400: the model does not exist (OpenAI's `model_not_found`).
    pub fn unknown_model(model: &str, served: &str) -> Self {
        Self {
            status: 400,
            kind: "invalid_request_error",
            param: Some("model".into()),
            code: "model_not_found",
            message: format!("the model `{model}` does not exist; this server serves `{served}`"),
        }
    }

    /// 429: a privacy budget cannot pay for the first token.
    pub fn budget_exhausted(message: impl Into<String>) -> Self {
        Self {
            status: 429,
            kind: "budget_exhausted",
            param: None,
            code: "privacy_budget_exhausted",
            message: message.into(),
        }
    }

    /// 503: the server is at its concurrency limit or shutting down.
    pub fn busy(message: impl Into<String>) -> Self {
        Self {
            status: 503,
            kind: "server_busy",
            param: None,
            code: "server_busy",
            message: message.into(),
        }
    }

    /// 500: the server failed.
    pub fn internal(message: impl Into<String>) -> Self {
        Self {
            status: 500,
            kind: "server_error",
            param: None,
            code: "internal_error",
            message: message.into(),
        }
    }

    /// OpenAI's error body.
    pub fn body(&self) -> Value {
        json!({
            "error": {
                "message": self.message,
                "type": self.kind,
                "param": self.param,
                "code": self.code,
            }
        })
    }
}

/// Limits a request must respect (from the server's flags).
#[derive(Debug, Clone)]
pub struct Limits {
    /// The model's id.
    pub model: String,
    /// Largest `max_tokens` (and the default).
    pub max_tokens: u64,
    /// Largest prompt, in tokens.
    pub max_prompt_tokens: usize,
}

/// What a valid request asks for, once its shared fields are checked.
#[derive(Debug, Clone, PartialEq)]
pub struct Checked {
    /// Tokens to generate at most.
    pub max_tokens: u64,
    /// Temperature (> 0).
    pub temperature: f64,
    /// Stream events.
    pub stream: bool,
    /// Send the usage chunk when streaming.
    pub include_usage: bool,
    /// Stop strings.
    pub stop: Vec<String>,
}

/// Checks the shared fields against `limits`.
pub fn check_common(c: &Common, limits: &Limits) -> Result<Checked, ApiError> {
    if c.model != limits.model {
        return Err(ApiError::unknown_model(&c.model, &limits.model));
    }
    if let Some(n) = c.n
        && n != 1
    {
        return Err(ApiError::invalid(
            "n",
            format!(
                "n = {n}: a private endpoint answers one choice per request (each choice is charged); send separate requests"
            ),
        ));
    }
    if c.logprobs
        .as_ref()
        .is_some_and(|v| !v.is_null() && v != &Value::Bool(false))
        || c.top_logprobs.as_ref().is_some_and(|v| !v.is_null())
    {
        return Err(ApiError::invalid(
            "logprobs",
            "log-probabilities are functions of the private members' distributions, which no privacy charge covers: not available from a private mechanism",
        ));
    }
    if c.logit_bias.as_ref().is_some_and(|v| !v.is_null()) {
        return Err(ApiError::invalid(
            "logit_bias",
            "not supported by a private mechanism",
        ));
    }
    if c.seed.as_ref().is_some_and(|v| !v.is_null()) {
        return Err(ApiError::invalid(
            "seed",
            "a known seed makes every draw predictable, so seeded sampling cannot be private",
        ));
    }
    if let Some(p) = c.top_p
        && p != 1.0
    {
        return Err(ApiError::invalid(
            "top_p",
            "only top_p = 1 is supported by a private mechanism",
        ));
    }
    for (name, v) in [
        ("presence_penalty", c.presence_penalty),
        ("frequency_penalty", c.frequency_penalty),
    ] {
        if let Some(v) = v
            && v != 0.0
        {
            return Err(ApiError::invalid(
                name,
                "penalties are not supported by a private mechanism",
            ));
        }
    }
    let max_tokens = c.max_tokens.unwrap_or(limits.max_tokens);
    if max_tokens == 0 || max_tokens > limits.max_tokens {
        return Err(ApiError::invalid(
            "max_tokens",
            format!(
                "max_tokens = {max_tokens}: must be between 1 and {}",
                limits.max_tokens
            ),
        ));
    }
    let temperature = c.temperature.unwrap_or(1.0);
    if !(temperature.is_finite() && temperature > 0.0 && temperature <= 100.0) {
        return Err(ApiError::invalid(
            "temperature",
            format!(
                "temperature = {temperature}: must be in (0, 100] (greedy decoding is not private)"
            ),
        ));
    }
    let stop = match &c.stop {
        None => Vec::new(),
        Some(Stop::One(s)) => vec![s.clone()],
        Some(Stop::Many(v)) => v.clone(),
    };
    if stop.len() > 4 || stop.iter().any(String::is_empty) {
        return Err(ApiError::invalid("stop", "up to 4 non-empty stop strings"));
    }
    Ok(Checked {
        max_tokens,
        temperature,
        stream: c.stream,
        include_usage: c.stream_options.as_ref().is_some_and(|o| o.include_usage),
        stop,
    })
}

/// The completion prompt as text or token ids.
pub fn completion_prompt(r: &CompletionRequest) -> Result<PromptField, ApiError> {
    if r.echo == Some(true) {
        return Err(ApiError::invalid("echo", "echo is not supported"));
    }
    if let Some(b) = r.best_of
        && b != 1
    {
        return Err(ApiError::invalid(
            "best_of",
            "only best_of = 1 (each candidate would be charged)",
        ));
    }
    if r.suffix.is_some() {
        return Err(ApiError::invalid(
            "suffix",
            "suffix (infilling) is not supported",
        ));
    }
    match &r.prompt {
        PromptField::Texts(v) if v.len() != 1 => Err(ApiError::invalid(
            "prompt",
            format!("{} prompts given: one prompt per request", v.len()),
        )),
        PromptField::Texts(v) => Ok(PromptField::Text(v[0].clone())),
        PromptField::Ids(ids) if ids.is_empty() => Err(ApiError::invalid("prompt", "empty prompt")),
        other => Ok(other.clone()),
    }
}

/// The messages' text, with content parts joined; only text parts are accepted.
pub fn message_texts(messages: &[Message]) -> Result<Vec<(String, String)>, ApiError> {
    if messages.is_empty() {
        return Err(ApiError::invalid("messages", "at least one message"));
    }
    let mut out = Vec::with_capacity(messages.len());
    for (i, m) in messages.iter().enumerate() {
        if !matches!(
            m.role.as_str(),
            "system" | "user" | "assistant" | "developer"
        ) {
            return Err(ApiError::invalid(
                &format!("messages[{i}].role"),
                format!("unknown role `{}` (system, user, assistant)", m.role),
            ));
        }
        let text = match &m.content {
            Content::Text(t) => t.clone(),
            Content::Parts(parts) => {
                let mut s = String::new();
                for (j, p) in parts.iter().enumerate() {
                    match (p.kind.as_str(), &p.text) {
                        ("text", Some(t)) => s.push_str(t),
                        _ => {
                            return Err(ApiError::invalid(
                                &format!("messages[{i}].content[{j}]"),
                                "only text content parts are supported",
                            ));
                        }
                    }
                }
                s
            }
        };
        let role = if m.role == "developer" {
            "system".to_string()
        } else {
            m.role.clone()
        };
        out.push((role, text));
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn limits() -> Limits {
        Limits {
            model: "m".into(),
            max_tokens: 16,
            max_prompt_tokens: 100,
        }
    }

    fn common(v: Value) -> Common {
        serde_json::from_value(v).unwrap()
    }

    #[test]
    fn refusals_name_the_field() {
        let cases = [
            (json!({"model": "x"}), "model"),
            (json!({"model": "m", "n": 2}), "n"),
            (json!({"model": "m", "logprobs": true}), "logprobs"),
            (json!({"model": "m", "top_logprobs": 3}), "logprobs"),
            (json!({"model": "m", "max_tokens": 17}), "max_tokens"),
            (json!({"model": "m", "max_tokens": 0}), "max_tokens"),
            (json!({"model": "m", "temperature": 0.0}), "temperature"),
            (json!({"model": "m", "seed": 3}), "seed"),
            (json!({"model": "m", "top_p": 0.9}), "top_p"),
            (
                json!({"model": "m", "presence_penalty": 1.0}),
                "presence_penalty",
            ),
            (
                json!({"model": "m", "stop": ["a", "b", "c", "d", "e"]}),
                "stop",
            ),
        ];
        for (body, field) in cases {
            let e = check_common(&common(body.clone()), &limits()).unwrap_err();
            assert_eq!(e.param.as_deref(), Some(field), "{body}");
            assert_eq!(e.status, 400, "{body}");
        }
    }

    #[test]
    fn defaults_and_accepted_values() {
        let c = check_common(
            &common(
                json!({"model": "m", "n": 1, "logprobs": null, "stop": "\n", "stream": true,
                "stream_options": {"include_usage": true}, "temperature": 0.7}),
            ),
            &limits(),
        )
        .unwrap();
        assert_eq!(
            c,
            Checked {
                max_tokens: 16,
                temperature: 0.7,
                stream: true,
                include_usage: true,
                stop: vec!["\n".into()],
            }
        );
    }

    #[test]
    fn prompts_and_messages() {
        let r: CompletionRequest =
            serde_json::from_value(json!({"model": "m", "prompt": ["a", "b"]})).unwrap();
        assert_eq!(
            completion_prompt(&r).unwrap_err().param.as_deref(),
            Some("prompt")
        );
        let r: CompletionRequest =
            serde_json::from_value(json!({"model": "m", "prompt": [1, 2]})).unwrap();
        assert!(matches!(
            completion_prompt(&r).unwrap(),
            PromptField::Ids(_)
        ));
        let m: Vec<Message> = serde_json::from_value(json!([
            {"role": "system", "content": "s"},
            {"role": "user", "content": [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}]}
        ]))
        .unwrap();
        assert_eq!(
            message_texts(&m).unwrap(),
            vec![("system".into(), "s".into()), ("user".into(), "ab".into())]
        );
        let bad: Vec<Message> =
            serde_json::from_value(json!([{"role": "tool", "content": "x"}])).unwrap();
        assert_eq!(
            message_texts(&bad).unwrap_err().param.as_deref(),
            Some("messages[0].role")
        );
    }
}
