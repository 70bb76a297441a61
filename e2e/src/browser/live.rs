//! A page kept open in headless Chromium and asked questions as it runs,
//! over the DevTools protocol: for pages whose state changes after load
//! (fetches, timers, a Web Worker), which `--dump-dom` would catch
//! half-way. Time is real: a worker's computation takes what it takes.
//!
//! The protocol is JSON over a WebSocket: the browser prints its endpoint
//! on stderr; `Target.createTarget` opens the page, `Target.attachToTarget`
//! (flattened) gives a session, and `Runtime.evaluate` reads it.

use std::time::Duration;

use futures::{SinkExt, StreamExt};
use serde_json::{Value, json};
use tempfile::TempDir;
use tokio::{
    io::{AsyncBufReadExt, BufReader},
    net::TcpStream,
    process::Child,
};
use tokio_tungstenite::{MaybeTlsStream, WebSocketStream, tungstenite::Message};

use super::{BrowserError, Chromium};

/// How long the browser may take to print its DevTools endpoint.
const STARTUP: Duration = Duration::from_secs(30);

/// A page open in a running browser, killed when dropped.
pub struct LivePage {
    program: String,
    socket: WebSocketStream<MaybeTlsStream<TcpStream>>,
    session: String,
    next_id: u64,
    timeout: Duration,
    _browser: Child,
    _profile: TempDir,
}

impl Chromium {
    /// Opens `url` in a headless browser of its own and keeps it running.
    pub async fn open(&self, url: &str) -> Result<LivePage, BrowserError> {
        let profile = tempfile::tempdir().map_err(BrowserError::Profile)?;
        let mut browser = self
            .command(
                profile.path(),
                ["--remote-debugging-port=0".into(), "about:blank".into()],
            )
            .stderr(std::process::Stdio::piped())
            .spawn()
            .map_err(|err| self.run_error(err))?;
        let stderr = browser
            .stderr
            .take()
            .ok_or_else(|| self.devtools("no stderr"))?;
        let endpoint = tokio::time::timeout(STARTUP, async {
            let mut lines = BufReader::new(stderr).lines();
            while let Some(line) = lines.next_line().await.ok().flatten() {
                if let Some((_, endpoint)) = line.split_once("DevTools listening on ") {
                    return Some(endpoint.trim().to_owned());
                }
            }
            None
        })
        .await
        .ok()
        .flatten()
        .ok_or_else(|| self.devtools("no DevTools endpoint printed"))?;
        let (socket, _) = tokio_tungstenite::connect_async(endpoint.as_str())
            .await
            .map_err(|err| self.devtools(&format!("connecting to {endpoint}: {err}")))?;
        let mut page = LivePage {
            program: self.program.clone(),
            socket,
            session: String::new(),
            next_id: 0,
            timeout: self.timeout,
            _browser: browser,
            _profile: profile,
        };
        let target = page
            .call(None, "Target.createTarget", json!({"url": url}))
            .await?;
        let target = target["targetId"].clone();
        let attached = page
            .call(
                None,
                "Target.attachToTarget",
                json!({"targetId": target, "flatten": true}),
            )
            .await?;
        page.session = attached["sessionId"]
            .as_str()
            .ok_or_else(|| page.devtools(&format!("no session in {attached}")))?
            .to_owned();
        Ok(page)
    }

    fn devtools(&self, detail: &str) -> BrowserError {
        devtools(&self.program, detail)
    }
}

impl LivePage {
    /// The value of the JavaScript `expression` in the page now, as JSON
    /// (`null` for `undefined`); a thrown exception is an error.
    pub async fn eval(&mut self, expression: &str) -> Result<Value, BrowserError> {
        let session = self.session.clone();
        let answer = self
            .call(
                Some(&session),
                "Runtime.evaluate",
                json!({"expression": expression, "returnByValue": true}),
            )
            .await?;
        if let Some(thrown) = answer.get("exceptionDetails") {
            return Err(self.devtools(&format!("{expression}: {thrown}")));
        }
        Ok(answer["result"]["value"].clone())
    }

    /// Sends `method` with `params` (to the page's `session`, or to the
    /// browser) and returns its result, skipping the events in between.
    async fn call(
        &mut self,
        session: Option<&str>,
        method: &str,
        params: Value,
    ) -> Result<Value, BrowserError> {
        self.next_id += 1;
        let id = self.next_id;
        let mut message = json!({"id": id, "method": method, "params": params});
        if let Some(session) = session {
            message["sessionId"] = session.into();
        }
        self.socket
            .send(Message::Text(message.to_string().into()))
            .await
            .map_err(|err| self.devtools(&format!("{method}: {err}")))?;
        let answer = tokio::time::timeout(self.timeout, async {
            while let Some(frame) = self.socket.next().await {
                let Ok(Message::Text(text)) = frame else {
                    continue;
                };
                let Ok(answer) = serde_json::from_str::<Value>(&text) else {
                    continue;
                };
                if answer["id"] == id {
                    return Some(answer);
                }
            }
            None
        })
        .await
        .ok()
        .flatten()
        .ok_or_else(|| self.devtools(&format!("{method}: no answer")))?;
        if let Some(error) = answer.get("error") {
            return Err(self.devtools(&format!("{method}: {error}")));
        }
        Ok(answer["result"].clone())
    }

    fn devtools(&self, detail: &str) -> BrowserError {
        devtools(&self.program, detail)
    }
}

fn devtools(program: &str, detail: &str) -> BrowserError {
    BrowserError::Devtools {
        program: program.to_owned(),
        detail: detail.to_owned(),
    }
}
