//! The stack's Prometheus as an API: queries, alerting rules loaded from a
//! file ([`RuleFile`]), the alerts they raise, and `promtool`'s check of a
//! rule file.

use std::{
    io::{Read as _, Write as _},
    net::TcpStream,
    path::PathBuf,
    process::Command,
    time::Duration,
};

use anyhow::{Context as _, ensure};
use serde_json::Value;

use crate::{stack, wait::poll_until};

/// `GET` of the API path `path` (e.g. `/api/v1/query`) with `params`: the
/// answer's `data`, or Prometheus's own error (a query that does not parse
/// is `bad_data: …`).
pub async fn api_get(path: &str, params: &[(&str, &str)]) -> Result<Value, String> {
    let base = stack::prometheus_url().map_err(|e| e.to_string())?;
    api_get_at(&base, path, params).await
}

/// [`api_get`] at the Prometheus of base URL `base`.
pub async fn api_get_at(base: &str, path: &str, params: &[(&str, &str)]) -> Result<Value, String> {
    let url = format!("{}{path}", base.trim_end_matches('/'));
    let body: Value = reqwest::Client::new()
        .get(&url)
        .query(params)
        .send()
        .await
        .map_err(|e| e.to_string())?
        .json()
        .await
        .map_err(|e| e.to_string())?;
    if body["status"] == "success" {
        Ok(body["data"].clone())
    } else {
        Err(format!("{}: {}", body["errorType"], body["error"]))
    }
}

/// The value of the instant `query` at the Prometheus of base URL `base`:
/// `None` when it returns no series.
pub async fn value_at(base: &str, query: &str) -> Result<Option<f64>, String> {
    let data = api_get_at(base, "/api/v1/query", &[("query", query)]).await?;
    Ok(data["result"][0]["value"][1]
        .as_str()
        .and_then(|v| v.parse().ok()))
}

/// Whether `query` parses and evaluates at Prometheus (an empty result
/// counts: the series may not exist yet); Prometheus's error otherwise.
pub async fn evaluates(query: &str) -> Result<(), String> {
    api_get("/api/v1/query", &[("query", query)])
        .await
        .map(|_| ())
}

/// The alerts Prometheus has pending or firing, each with its `labels`,
/// `state` and `value`.
pub async fn alerts() -> Result<Vec<Value>, String> {
    let data = api_get("/api/v1/alerts", &[]).await?;
    Ok(data["alerts"].as_array().cloned().unwrap_or_default())
}

/// The firing alert `name` whose labels include every pair of `labels`.
pub async fn firing(name: &str, labels: &[(&str, &str)]) -> Result<Option<Value>, String> {
    Ok(alerts().await?.into_iter().find(|alert| {
        alert["labels"]["alertname"] == name
            && alert["state"] == "firing"
            && labels.iter().all(|(k, v)| alert["labels"][k] == *v)
    }))
}

/// `promtool check rules` of `groups` (a rule file's content); its output
/// on success, its complaint otherwise.
pub fn promtool_check(groups: &Value) -> anyhow::Result<String> {
    let mut file = tempfile::Builder::new().suffix(".yml").tempfile()?;
    file.write_all(serde_yaml_ng::to_string(groups)?.as_bytes())?;
    let out = Command::new("promtool")
        .args(["check", "rules"])
        .arg(file.path())
        .output()
        .context("running promtool (`e2e/local/stack env` puts it on PATH)")?;
    let said = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    ensure!(out.status.success(), "promtool refused the rules: {said}");
    Ok(said)
}

/// A rule file in the stack's rule folder, evaluated by Prometheus while
/// it lives; removed (and Prometheus reloaded) when dropped.
pub struct RuleFile {
    path: PathBuf,
}

impl RuleFile {
    /// Writes `groups` as the rule file `name.yml`, reloads Prometheus and
    /// waits until it evaluates the file's first group.
    pub async fn load(name: &str, groups: &Value) -> anyhow::Result<Self> {
        let dir = std::env::var("PROMETHEUS_RULES_DIR")
            .context("PROMETHEUS_RULES_DIR is not set: load `e2e/local/stack env`")?;
        let path = PathBuf::from(dir).join(format!("{name}.yml"));
        std::fs::write(&path, serde_yaml_ng::to_string(groups)?)?;
        let file = Self { path };
        reload()?;
        let group = groups["groups"][0]["name"]
            .as_str()
            .context("the rules have no group")?
            .to_owned();
        let file_name = file.path.to_string_lossy().into_owned();
        poll_until(
            "Prometheus evaluating the rule file",
            Duration::from_secs(20),
            Duration::from_millis(200),
            || async {
                let data = api_get("/api/v1/rules", &[]).await?;
                let loaded = data["groups"].as_array().is_some_and(|groups| {
                    groups
                        .iter()
                        .any(|g| g["name"] == group.as_str() && g["file"] == file_name.as_str())
                });
                if loaded {
                    Ok(())
                } else {
                    Err(format!("group {group} not loaded yet"))
                }
            },
        )
        .await?;
        Ok(file)
    }
}

impl Drop for RuleFile {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.path);
        let _ = reload();
    }
}

/// `POST /-/reload`, over a plain socket so that it also works in `Drop`,
/// outside any async runtime.
fn reload() -> anyhow::Result<()> {
    let url = stack::prometheus_url()?;
    let authority = url
        .strip_prefix("http://")
        .context("Prometheus is not at an http:// URL")?
        .trim_end_matches('/');
    let mut socket = TcpStream::connect(authority)?;
    socket.set_read_timeout(Some(Duration::from_secs(10)))?;
    write!(
        socket,
        "POST /-/reload HTTP/1.0\r\nHost: {authority}\r\nContent-Length: 0\r\n\r\n"
    )?;
    let mut answer = String::new();
    socket.read_to_string(&mut answer)?;
    ensure!(
        answer.starts_with("HTTP/1.1 200") || answer.starts_with("HTTP/1.0 200"),
        "Prometheus refused to reload: {answer}"
    );
    Ok(())
}
