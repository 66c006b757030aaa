//! The HTTP routes (axum): OpenAI's `/v1/completions`, `/v1/chat/completions` and
//! `/v1/models`, plus `/health`.
//!
//! A request is checked (key, body, fields, prompt size) before anything private is
//! read; the engine then decodes it and sends back released text. The response starts
//! only once the first token is released (charged), so a budget that cannot pay for the
//! first token is an HTTP 429 rather than an empty stream.

use std::convert::Infallible;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::mpsc::Sender;
use std::time::{SystemTime, UNIX_EPOCH};

use axum::Router;
use axum::body::Bytes;
use axum::extract::{DefaultBodyLimit, State};
use axum::http::{HeaderMap, StatusCode, header};
use axum::response::sse::{Event as SseEvent, KeepAlive, Sse};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use futures_util::stream::Stream;
use privmix_models::{ChatMessage, ChatTemplate, Tokenizer};
use serde::de::DeserializeOwned;
use serde_json::{Value, json};
use tokio::sync::Semaphore;
use tokio::sync::mpsc::{UnboundedReceiver, unbounded_channel};

use super::api::{
    ApiError, ChatRequest, Checked, CompletionRequest, Limits, PromptField, check_common,
    completion_prompt, message_texts,
};
use super::engine::{Event, Finish, Job, Usage};
use super::keys::ApiKeys;
use crate::ledger_store::Tenant;

/// What every handler shares.
pub struct AppState {
    /// The engine's queue.
    pub jobs: Sender<Job>,
    /// Encodes prompts.
    pub tokenizer: Arc<Tokenizer>,
    /// Renders chat prompts, or why the model has no chat template.
    pub chat: Result<ChatTemplate, String>,
    /// Accepted keys; `None` with `--no-auth`.
    pub keys: Option<ApiKeys>,
    /// Request limits and the model's id.
    pub limits: Limits,
    /// In-flight requests (queued or decoding).
    pub slots: Arc<Semaphore>,
    /// The mechanism's name, for usage.
    pub mechanism: &'static str,
    /// When the server started (seconds since the Unix epoch).
    pub created: u64,
    /// Request counter for ids.
    pub counter: AtomicU64,
    /// `--step-time-ms`: every request's release schedule (see `pace.rs`).
    pub step_time_ms: Option<u64>,
    /// δ of the usage figures.
    pub delta: f64,
}

/// The router, with the body limit.
pub fn router(state: Arc<AppState>, max_body_bytes: usize) -> Router {
    Router::new()
        .route("/health", get(health))
        .route("/v1/models", get(models))
        .route("/v1/completions", post(completions))
        .route("/v1/chat/completions", post(chat_completions))
        .fallback(not_found)
        .layer(DefaultBodyLimit::max(max_body_bytes))
        .with_state(state)
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let status = StatusCode::from_u16(self.status).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
        (status, axum::Json(self.body())).into_response()
    }
}

async fn health() -> impl IntoResponse {
    axum::Json(json!({"status": "ok"}))
}

async fn not_found() -> ApiError {
    ApiError {
        status: 404,
        kind: "invalid_request_error",
        param: None,
        code: "not_found",
        message: "no such route; this server answers /v1/completions, /v1/chat/completions, /v1/models and /health".into(),
    }
}

async fn models(State(s): State<Arc<AppState>>, headers: HeaderMap) -> Result<Response, ApiError> {
    authenticate(&s, &headers)?;
    Ok(axum::Json(json!({
        "object": "list",
        "data": [{"id": s.limits.model, "object": "model", "created": s.created, "owned_by": "privmix"}],
    }))
    .into_response())
}

/// The tenant of the request's bearer key (`None` with `--no-auth`).
fn authenticate(s: &AppState, headers: &HeaderMap) -> Result<Option<Tenant>, ApiError> {
    let Some(keys) = &s.keys else {
        return Ok(None);
    };
    let value = headers.get(header::AUTHORIZATION).ok_or_else(|| {
        ApiError::unauthorized("missing API key: send `Authorization: Bearer <key>`")
    })?;
    let key = value
        .to_str()
        .ok()
        .and_then(|v| v.strip_prefix("Bearer "))
        .ok_or_else(|| {
            ApiError::unauthorized("malformed Authorization header: expected `Bearer <key>`")
        })?;
    keys.tenant(key.trim())
        .cloned()
        .map(Some)
        .ok_or_else(|| ApiError::unauthorized("invalid API key"))
}

/// Parses a JSON body, naming the field at fault.
fn parse<T: DeserializeOwned>(body: &Bytes) -> Result<T, ApiError> {
    let mut de = serde_json::Deserializer::from_slice(body);
    serde_path_to_error::deserialize(&mut de).map_err(|e| {
        let path = e.path().to_string();
        let inner = e.into_inner();
        if inner.is_syntax() || inner.is_eof() {
            ApiError::malformed(format!("the body is not valid JSON: {inner}"))
        } else if path == "." {
            ApiError::malformed(format!("invalid request: {inner}"))
        } else {
            ApiError::invalid(&path, format!("{path}: {inner}"))
        }
    })
}

/// Which endpoint a response is for.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Kind {
    Completion,
    Chat,
}

async fn completions(
    State(s): State<Arc<AppState>>,
    headers: HeaderMap,
    body: Bytes,
) -> Result<Response, ApiError> {
    let tenant = authenticate(&s, &headers)?;
    let req: CompletionRequest = parse(&body)?;
    let checked = check_common(&req.common, &s.limits)?;
    let prompt = match completion_prompt(&req)? {
        PromptField::Ids(ids) => {
            let vocab = s.tokenizer.vocab_size();
            if let Some(bad) = ids.iter().find(|&&t| t as usize >= vocab) {
                return Err(ApiError::invalid(
                    "prompt",
                    format!("token id {bad} is outside the vocabulary of {vocab}"),
                ));
            }
            ids
        }
        PromptField::Text(text) => encode(&s, &text, true)?,
        PromptField::Texts(_) => return Err(ApiError::invalid("prompt", "one prompt per request")),
    };
    start(s, tenant, prompt, checked, Kind::Completion).await
}

async fn chat_completions(
    State(s): State<Arc<AppState>>,
    headers: HeaderMap,
    body: Bytes,
) -> Result<Response, ApiError> {
    let tenant = authenticate(&s, &headers)?;
    let req: ChatRequest = parse(&body)?;
    let checked = check_common(&req.common, &s.limits)?;
    let messages: Vec<ChatMessage> = message_texts(&req.messages)?
        .into_iter()
        .map(|(role, content)| ChatMessage::new(role, content))
        .collect();
    let template = s.chat.as_ref().map_err(|why| {
        ApiError::invalid(
            "messages",
            format!("this model has no usable chat template ({why}): use /v1/completions"),
        )
    })?;
    let text = template.render(&messages, true).map_err(|e| {
        ApiError::invalid(
            "messages",
            format!("the chat template refused the messages: {e}"),
        )
    })?;
    // The template writes the special tokens itself.
    let prompt = encode(&s, &text, false)?;
    start(s, tenant, prompt, checked, Kind::Chat).await
}

fn encode(s: &AppState, text: &str, add_special: bool) -> Result<Vec<u32>, ApiError> {
    let mut ids = s
        .tokenizer
        .encode(text, add_special)
        .map_err(|e| ApiError::invalid("prompt", format!("cannot tokenize the prompt: {e}")))?;
    if ids.is_empty() {
        ids.extend(s.tokenizer.bos_id());
    }
    if ids.is_empty() {
        return Err(ApiError::invalid(
            "prompt",
            "empty prompt and no BOS token to start from",
        ));
    }
    if ids.len() > s.limits.max_prompt_tokens {
        return Err(ApiError::invalid(
            "prompt",
            format!(
                "the prompt has {} tokens; this server accepts at most {}",
                ids.len(),
                s.limits.max_prompt_tokens
            ),
        ));
    }
    Ok(ids)
}

/// Queues the request and answers once its first event arrives.
async fn start(
    s: Arc<AppState>,
    tenant: Option<Tenant>,
    prompt: Vec<u32>,
    checked: Checked,
    kind: Kind,
) -> Result<Response, ApiError> {
    let permit = Arc::clone(&s.slots)
        .try_acquire_owned()
        .map_err(|_| ApiError::busy("too many requests in flight; retry later"))?;
    let (tx, notes) = unbounded_channel();
    let prompt_tokens = prompt.len();
    s.jobs
        .send(Job {
            prompt,
            max_tokens: checked.max_tokens,
            temperature: checked.temperature,
            stop: checked.stop.clone(),
            tenant,
            events: tx,
        })
        .map_err(|_| ApiError::busy("the server is shutting down"))?;
    let mut rx = super::pace::relay(notes, s.step_time_ms, prompt_tokens, s.delta);
    let first = rx
        .recv()
        .await
        .ok_or_else(|| ApiError::internal("the engine stopped"))?;
    let id = format!(
        "{}-{:x}{:06x}",
        if kind == Kind::Chat {
            "chatcmpl"
        } else {
            "cmpl"
        },
        s.created,
        s.counter.fetch_add(1, Ordering::Relaxed)
    );
    let created = now();
    let meta = Meta {
        id,
        created,
        model: s.limits.model.clone(),
        mechanism: s.mechanism,
        kind,
    };
    match first {
        Event::Refused { message } => return Err(ApiError::budget_exhausted(message)),
        Event::Failed(message) => return Err(ApiError::internal(message)),
        Event::Text(_) | Event::Done { .. } => {}
    }
    if checked.stream {
        let sse = sse_stream(meta, first, rx, checked.include_usage, permit);
        Ok(Sse::new(sse)
            .keep_alive(KeepAlive::default())
            .into_response())
    } else {
        let mut text = String::new();
        let mut event = first;
        loop {
            match event {
                Event::Text(t) => text.push_str(&t),
                Event::Done { finish, usage } => {
                    drop(permit);
                    return Ok(axum::Json(whole(&meta, &text, finish, &usage)).into_response());
                }
                // After a token, a refusal arrives as Done(BudgetExhausted); these cannot
                // follow a released token.
                Event::Refused { message } => return Err(ApiError::budget_exhausted(message)),
                Event::Failed(message) => return Err(ApiError::internal(message)),
            }
            event = rx
                .recv()
                .await
                .ok_or_else(|| ApiError::internal("the engine stopped mid-request"))?;
        }
    }
}

struct Meta {
    id: String,
    created: u64,
    model: String,
    mechanism: &'static str,
    kind: Kind,
}

fn now() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_secs())
}

fn usage_json(meta: &Meta, usage: &Usage) -> Value {
    let p = &usage.privacy;
    json!({
        "prompt_tokens": usage.prompt_tokens,
        "completion_tokens": usage.completion_tokens,
        "total_tokens": usage.prompt_tokens + usage.completion_tokens,
        "privacy": {
            "mechanism": meta.mechanism,
            "epsilon_spent": finite(p.epsilon_spent),
            "delta": p.delta,
            "total_epsilon_left": p.total_epsilon_left,
            "tenant_epsilon_left": p.tenant_epsilon_left,
        },
    })
}

/// ε as JSON: a number, or null for +∞.
fn finite(x: f64) -> Option<f64> {
    x.is_finite().then_some(x)
}

fn whole(meta: &Meta, text: &str, finish: Finish, usage: &Usage) -> Value {
    let choice = match meta.kind {
        Kind::Completion => json!({
            "index": 0, "text": text, "logprobs": null, "finish_reason": finish.reason(),
        }),
        Kind::Chat => json!({
            "index": 0,
            "message": {"role": "assistant", "content": text},
            "logprobs": null,
            "finish_reason": finish.reason(),
        }),
    };
    json!({
        "id": meta.id,
        "object": if meta.kind == Kind::Chat { "chat.completion" } else { "text_completion" },
        "created": meta.created,
        "model": meta.model,
        "choices": [choice],
        "usage": usage_json(meta, usage),
    })
}

fn chunk(meta: &Meta, piece: Option<&str>, first: bool, finish: Option<Finish>) -> Value {
    let reason = finish.map(Finish::reason);
    let choice = match meta.kind {
        Kind::Completion => json!({
            "index": 0, "text": piece.unwrap_or(""), "logprobs": null, "finish_reason": reason,
        }),
        Kind::Chat => {
            let mut delta = serde_json::Map::new();
            if first {
                delta.insert("role".into(), json!("assistant"));
            }
            if let Some(p) = piece {
                delta.insert("content".into(), json!(p));
            }
            json!({"index": 0, "delta": delta, "logprobs": null, "finish_reason": reason})
        }
    };
    json!({
        "id": meta.id,
        "object": if meta.kind == Kind::Chat { "chat.completion.chunk" } else { "text_completion" },
        "created": meta.created,
        "model": meta.model,
        "choices": [choice],
    })
}

/// The server-sent events of a streamed request: a chunk per released piece, a final
/// chunk with the finish reason, the usage chunk if asked, then `[DONE]`. A task relays
/// the engine's events; when the client goes away the relay stops and drops the
/// engine's channel, which ends the request's decoding at the next step.
fn sse_stream(
    meta: Meta,
    first: Event,
    mut rx: UnboundedReceiver<Event>,
    include_usage: bool,
    permit: tokio::sync::OwnedSemaphorePermit,
) -> impl Stream<Item = Result<SseEvent, Infallible>> + Send + 'static {
    let (tx, out) = tokio::sync::mpsc::channel::<Result<SseEvent, Infallible>>(64);
    tokio::spawn(async move {
        let _permit = permit;
        let mut pending = Some(first);
        let mut first_chunk = true;
        loop {
            let event = match pending.take() {
                Some(e) => e,
                None => match rx.recv().await {
                    Some(e) => e,
                    None => break,
                },
            };
            let mut values: Vec<String> = Vec::new();
            let mut end = false;
            match event {
                Event::Text(piece) => {
                    values.push(chunk(&meta, Some(&piece), first_chunk, None).to_string());
                    first_chunk = false;
                }
                Event::Done { finish, usage } => {
                    values.push(chunk(&meta, None, first_chunk, Some(finish)).to_string());
                    if include_usage {
                        let mut u = chunk(&meta, None, false, None);
                        u["choices"] = json!([]);
                        u["usage"] = usage_json(&meta, &usage);
                        values.push(u.to_string());
                    }
                    end = true;
                }
                Event::Refused { message } | Event::Failed(message) => {
                    values.push(
                        json!({"error": {"message": message, "type": "server_error"}}).to_string(),
                    );
                    end = true;
                }
            }
            if end {
                values.push("[DONE]".into());
            }
            for v in values {
                if tx.send(Ok(SseEvent::default().data(v))).await.is_err() {
                    return;
                }
            }
            if end {
                return;
            }
        }
    });
    tokio_stream::wrappers::ReceiverStream::new(out)
}
