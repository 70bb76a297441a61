//! A scripted apiserver for the narrow unit tests of a reconcile's request
//! sequence: each expected request (method, path, what its body holds) and
//! the answer it gets, in order, on a `tower-test` mock service. A request
//! out of script fails the test; so does a step the reconcile never made.
//! It never replaces the real-apiserver tests of the same behaviour: it
//! pins the order and the shape of the calls, nothing about the apiserver.

use std::{sync::Arc, time::Duration};

use http::{Method, Request, Response, StatusCode};
use kube::{Client, client::Body};
use serde_json::Value;
use tokio::task::JoinHandle;
use tower_test::mock::{self, Handle};

use crate::{
    Context, Identity, Shared, clock::SystemClock, leader::Leadership, metrics::OperatorMetrics,
};

/// One expected request and its answer.
#[derive(Debug, Clone)]
pub struct Step {
    method: Method,
    path: String,
    holds: Vec<(String, Value)>,
    status: StatusCode,
    answer: Value,
}

impl Step {
    /// A request of `method` to `path` (the URI's path, without the query).
    pub fn expect(method: Method, path: impl Into<String>) -> Self {
        Self {
            method,
            path: path.into(),
            holds: Vec::new(),
            status: StatusCode::OK,
            answer: Value::Object(serde_json::Map::new()),
        }
    }

    /// The request's JSON body has `value` at the JSON pointer `pointer`
    /// (`/status/phase`).
    #[must_use]
    pub fn holding(mut self, pointer: &str, value: Value) -> Self {
        self.holds.push((pointer.to_owned(), value));
        self
    }

    /// Answers with `status` and `body`.
    #[must_use]
    pub fn answer(mut self, status: StatusCode, body: Value) -> Self {
        self.status = status;
        self.answer = body;
        self
    }

    /// Answers 404, as the apiserver does for an object that does not exist.
    #[must_use]
    pub fn not_found(self) -> Self {
        self.answer(
            StatusCode::NOT_FOUND,
            serde_json::json!({
                "kind": "Status", "apiVersion": "v1", "metadata": {},
                "status": "Failure", "reason": "NotFound", "code": 404,
                "message": "not found",
            }),
        )
    }
}

/// A leading controller context over a scripted apiserver, and the task
/// that plays the script.
pub struct Scripted<S> {
    /// The context the reconcile under test runs with.
    pub ctx: Arc<Context<S>>,
    player: JoinHandle<Result<(), String>>,
}

impl<S> Scripted<S> {
    /// Plays `script` to the requests of a context for `id` with
    /// `settings`.
    pub fn new(id: Identity, settings: S, script: Vec<Step>) -> Self {
        let (service, handle) = mock::pair::<Request<Body>, Response<Body>>();
        let shared = Shared {
            client: Client::new(service, "default"),
            metrics: OperatorMetrics::default(),
            clock: Arc::new(SystemClock),
            leadership: Leadership::fixed(true),
            instance: "test".to_owned(),
            concurrency: 1,
        };
        Self {
            ctx: Arc::new(Context::new(&shared, id, settings)),
            player: tokio::spawn(play(handle, script)),
        }
    }

    /// The outcome of the reconcile that ran against the script, once the
    /// script ended: a script error comes first, since a request out of
    /// script also fails the reconcile, with less to say.
    pub async fn check<T, E: std::fmt::Display>(self, outcome: Result<T, E>) -> Result<T, String> {
        self.finish().await?;
        outcome.map_err(|err| format!("the reconcile failed: {err}"))
    }

    /// Waits for the script's end: an error names the first step that was
    /// not met, or a request made after the last one.
    pub async fn finish(self) -> Result<(), String> {
        // The context holds the client: dropped, a script that waits for a
        // request that never comes sees the end of the stream.
        drop(self.ctx);
        match tokio::time::timeout(Duration::from_secs(5), self.player).await {
            Ok(Ok(result)) => result,
            Ok(Err(err)) => Err(format!("the script panicked: {err}")),
            Err(_) => Err("the script did not end within 5 s".to_owned()),
        }
    }
}

async fn play(
    mut handle: Handle<Request<Body>, Response<Body>>,
    script: Vec<Step>,
) -> Result<(), String> {
    for (i, step) in script.into_iter().enumerate() {
        let Some((request, respond)) = handle.next_request().await else {
            return Err(format!(
                "step {i}: no request came; expected {} {}",
                step.method, step.path
            ));
        };
        let (method, path) = (request.method().clone(), request.uri().path().to_owned());
        if method != step.method || path != step.path {
            return Err(format!(
                "step {i}: expected {} {}, got {method} {}",
                step.method,
                step.path,
                request.uri()
            ));
        }
        let body = request
            .into_body()
            .collect_bytes()
            .await
            .map_err(|err| format!("step {i}: reading the body: {err}"))?;
        if !step.holds.is_empty() {
            let json: Value = serde_json::from_slice(&body)
                .map_err(|err| format!("step {i}: the body is not JSON: {err}"))?;
            for (pointer, want) in &step.holds {
                let got = json.pointer(pointer);
                if got != Some(want) {
                    return Err(format!(
                        "step {i} ({method} {path}): {pointer} is {got:?}, expected {want}; body: {json}"
                    ));
                }
            }
        }
        let answer = serde_json::to_vec(&step.answer).map_err(|err| err.to_string())?;
        let mut response = Response::new(Body::from(answer));
        *response.status_mut() = step.status;
        respond.send_response(response);
    }
    match handle.next_request().await {
        None => Ok(()),
        Some((request, _)) => Err(format!(
            "a request after the script's end: {} {}",
            request.method(),
            request.uri()
        )),
    }
}
