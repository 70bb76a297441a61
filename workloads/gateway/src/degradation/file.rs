//! The file source, for gateways outside a cluster.

use std::{
    collections::BTreeMap,
    future::Future,
    path::{Path, PathBuf},
    pin::pin,
    time::{Duration, SystemTime},
};

use serde_yaml_ng::{Mapping, Value};
use tokio::time::MissedTickBehavior;

use super::{Degradation, ParseError, Switchboard, offer};

/// How often the file is looked at; half the 100 ms budget.
const POLL: Duration = Duration::from_millis(50);

/// A file modified this recently may be rewritten again without its mtime
/// or length moving (coarse timestamps), so its content is read anyway.
const RACY: Duration = Duration::from_secs(2);

/// Why the file's content is not a degradation state.
#[derive(Debug, thiserror::Error)]
pub(super) enum FileError {
    /// Neither YAML nor JSON.
    #[error("not a YAML or JSON map: {0}")]
    Syntax(#[from] serde_yaml_ng::Error),
    /// A manifest of another kind.
    #[error("a manifest of kind {0:?}, expected ConfigMap (or the bare data map)")]
    Kind(String),
    /// `data` or one of its values has the wrong shape.
    #[error("{0}")]
    Shape(String),
    /// The data map is not a valid state.
    #[error(transparent)]
    Data(#[from] ParseError),
}

/// Parses the file's content: the ConfigMap's `data` as a YAML or JSON map,
/// or a whole ConfigMap manifest. Scalars are taken as their text, so a
/// hand-written `tier: 2` works like the ConfigMap's `tier: "2"`.
pub(super) fn parse_file(content: &[u8]) -> Result<Degradation, FileError> {
    let top: Mapping = serde_yaml_ng::from_slice(content)?;
    let data = match top.get("kind") {
        None => top,
        Some(Value::String(kind)) if kind == "ConfigMap" => match top.get("data") {
            None | Some(Value::Null) => Mapping::new(),
            Some(Value::Mapping(data)) => data.clone(),
            Some(_) => return Err(FileError::Shape("`data` must be a map".to_owned())),
        },
        Some(kind) => return Err(FileError::Kind(scalar(kind).unwrap_or_default())),
    };
    let mut strings = BTreeMap::new();
    for (key, value) in &data {
        let Some(key) = key.as_str() else {
            return Err(FileError::Shape(format!("key {key:?} is not a string")));
        };
        let Some(value) = scalar(value) else {
            return Err(FileError::Shape(format!(
                "key `{key}` must be a string (`switches` holds its JSON as text)"
            )));
        };
        strings.insert(key.to_owned(), value);
    }
    Ok(Degradation::from_data(&strings)?)
}

fn scalar(value: &Value) -> Option<String> {
    match value {
        Value::String(s) => Some(s.clone()),
        Value::Number(n) => Some(n.to_string()),
        Value::Bool(b) => Some(b.to_string()),
        _ => None,
    }
}

/// What changes are detected by, before the content is compared.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Stamp {
    modified: Option<SystemTime>,
    len: u64,
}

/// One look at the file.
enum Look {
    Missing,
    Unreadable(String),
    Unchanged,
    Read(Stamp, Vec<u8>),
}

/// Stats the file and reads it only if it may have changed since `last`.
fn look(path: &Path, last: Option<Stamp>) -> Look {
    let meta = match std::fs::metadata(path) {
        Ok(meta) => meta,
        Err(err) if err.kind() == std::io::ErrorKind::NotFound => return Look::Missing,
        Err(err) => return Look::Unreadable(err.to_string()),
    };
    let stamp = Stamp {
        modified: meta.modified().ok(),
        len: meta.len(),
    };
    let settled = stamp
        .modified
        .and_then(|m| m.elapsed().ok())
        .is_some_and(|age| age > RACY);
    if last == Some(stamp) && settled {
        return Look::Unchanged;
    }
    match std::fs::read(path) {
        Ok(content) => Look::Read(stamp, content),
        Err(err) if err.kind() == std::io::ErrorKind::NotFound => Look::Missing,
        Err(err) => Look::Unreadable(err.to_string()),
    }
}

/// Keeps `board` in line with the file at `path` until `stop` completes.
///
/// The file is polled every 50 ms: a stat (mtime and length), and a read
/// only when those moved (or the file is a few seconds fresh), and a parse
/// only when the content moved; so a change is in force within about 50 ms.
/// Its format is the ConfigMap's `data` as a YAML or JSON map, or a whole
/// ConfigMap manifest. Invalid content is logged with the reason and the
/// last good state stays in force; a missing or unreadable file keeps the
/// state too and is logged once until it comes back. Write the file
/// atomically (write a sibling, rename) or a half-written file is logged
/// as invalid for one poll.
pub async fn watch_file(path: PathBuf, board: Switchboard, stop: impl Future<Output = ()>) {
    let mut stop = pin!(stop);
    let mut ticks = tokio::time::interval(POLL);
    ticks.set_missed_tick_behavior(MissedTickBehavior::Delay);
    let mut seen = Seen::default();
    loop {
        tokio::select! {
            biased;
            () = &mut stop => return,
            _ = ticks.tick() => {}
        }
        let (at, last) = (path.clone(), seen.stamp);
        // Blocking file calls stay off the runtime's workers.
        let look = tokio::task::spawn_blocking(move || look(&at, last))
            .await
            .unwrap_or_else(|err| Look::Unreadable(err.to_string()));
        match look {
            Look::Unchanged => {}
            Look::Missing => seen.unavailable(&path, "missing".to_owned()),
            Look::Unreadable(err) => seen.unavailable(&path, err),
            Look::Read(stamp, content) => seen.read(&path, stamp, content, &board),
        }
    }
}

/// What the watch last saw of the file.
#[derive(Default)]
struct Seen {
    stamp: Option<Stamp>,
    content: Option<Vec<u8>>,
    /// The problem last logged, so a lasting one is logged once.
    problem: Option<String>,
}

impl Seen {
    fn unavailable(&mut self, path: &Path, problem: String) {
        if self.problem.as_ref() != Some(&problem) {
            tracing::warn!(path = %path.display(), %problem,
                "degradation file unavailable; keeping the state in force");
            self.problem = Some(problem);
        }
        (self.stamp, self.content) = (None, None);
    }

    fn read(&mut self, path: &Path, stamp: Stamp, content: Vec<u8>, board: &Switchboard) {
        self.stamp = Some(stamp);
        if self.problem.take().is_some() {
            tracing::info!(path = %path.display(), "degradation file readable again");
        }
        if self.content.as_ref() == Some(&content) {
            return;
        }
        match parse_file(&content) {
            Ok(next) => offer(board, next, "file"),
            Err(err) => tracing::warn!(path = %path.display(), error = %err,
                "invalid degradation file; keeping the state in force"),
        }
        self.content = Some(content);
    }
}
