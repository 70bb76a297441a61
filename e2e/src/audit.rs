//! What a user asked the apiserver, from the local stack's audit log
//! (service accounts' requests, metadata only), and whether RBAC allows a
//! request, as `kubectl auth can-i` answers: the rights a component needs
//! are derived from what it really did, the way audit2rbac derives them.

use std::{collections::BTreeSet, fmt, process::Command};

use anyhow::{Context as _, ensure};
use serde::Deserialize;

/// One request as RBAC sees it: verb, resource and where.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
pub struct Request {
    /// The RBAC verb (`get`, `list`, `watch`, `create`, `patch`, …).
    pub verb: String,
    /// The API group, empty for the core group.
    pub group: String,
    /// The resource, plural.
    pub resource: String,
    /// The subresource (`status`, `exec`, …), empty when none.
    pub subresource: String,
    /// The namespace, empty for cluster-scoped requests and lists across
    /// every namespace.
    pub namespace: String,
    /// The object's name, when the request names one.
    pub name: String,
}

impl fmt::Display for Request {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} {}", self.verb, self.resource_arg())?;
        if !self.subresource.is_empty() {
            write!(f, " --subresource={}", self.subresource)?;
        }
        match self.namespace.as_str() {
            "" => Ok(()),
            ns => write!(f, " -n {ns}"),
        }
    }
}

impl Request {
    /// A request of `verb` on `resource` (`deployments.apps`, `pods`,
    /// `pods/exec` for a subresource) in `namespace` (empty: cluster-wide).
    pub fn new(verb: &str, resource: &str, namespace: &str) -> Self {
        let (resource, subresource) = resource.split_once('/').unwrap_or((resource, ""));
        let (resource, group) = resource.split_once('.').unwrap_or((resource, ""));
        Self {
            verb: verb.to_owned(),
            group: group.to_owned(),
            resource: resource.to_owned(),
            subresource: subresource.to_owned(),
            namespace: namespace.to_owned(),
            name: String::new(),
        }
    }

    /// `resource.group/name` as `kubectl auth can-i` takes it.
    fn resource_arg(&self) -> String {
        let mut arg = self.resource.clone();
        if !self.group.is_empty() {
            arg = format!("{arg}.{}", self.group);
        }
        if !self.name.is_empty() {
            arg = format!("{arg}/{}", self.name);
        }
        arg
    }

    /// Whether `user` may make this request: `kubectl auth can-i` as that
    /// user (the caller's kubeconfig must allow impersonation).
    pub fn allowed_for(&self, user: &str) -> anyhow::Result<bool> {
        let mut command = Command::new("kubectl");
        command
            .args(["auth", "can-i", &self.verb, &self.resource_arg()])
            .arg(format!("--as={user}"));
        if !self.subresource.is_empty() {
            command.arg(format!("--subresource={}", self.subresource));
        }
        if self.namespace.is_empty() {
            command.arg("--all-namespaces");
        } else {
            command.args(["-n", &self.namespace]);
        }
        let out = command
            .output()
            .context("running kubectl (`e2e/local/stack env` puts it on PATH)")?;
        let answer = String::from_utf8_lossy(&out.stdout).trim().to_owned();
        ensure!(
            answer == "yes" || answer == "no",
            "kubectl auth can-i {self}: {answer} {}",
            String::from_utf8_lossy(&out.stderr)
        );
        Ok(answer == "yes")
    }
}

/// A request in the audit log and the status code it got.
#[derive(Debug, Clone)]
pub struct Audited {
    /// The request.
    pub request: Request,
    /// The HTTP status of the answer.
    pub code: u16,
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct Event {
    stage: String,
    verb: String,
    user: User,
    #[serde(default)]
    object_ref: Option<ObjectRef>,
    #[serde(default)]
    response_status: Option<ResponseStatus>,
}

#[derive(Deserialize)]
struct User {
    username: String,
}

#[derive(Deserialize, Default)]
#[serde(rename_all = "camelCase")]
struct ObjectRef {
    #[serde(default)]
    resource: String,
    #[serde(default)]
    namespace: String,
    #[serde(default)]
    name: String,
    #[serde(default)]
    api_group: String,
    #[serde(default)]
    subresource: String,
}

#[derive(Deserialize)]
struct ResponseStatus {
    #[serde(default)]
    code: u16,
}

/// Path of the stack's audit log.
pub fn log_path() -> anyhow::Result<String> {
    std::env::var("KUBE_AUDIT_LOG").context(
        "KUBE_AUDIT_LOG is not set: run the tests through `e2e/local/stack test`, or load \
         `e2e/local/stack env`",
    )
}

/// Every resource request `user` made, as the audit log holds them (the
/// current file and its one backup): one entry per completed request (a
/// watch counts when its answer starts).
pub fn requests_of(user: &str) -> anyhow::Result<Vec<Audited>> {
    let path = log_path()?;
    let mut found = Vec::new();
    let mut files: Vec<_> = std::fs::read_dir(
        std::path::Path::new(&path)
            .parent()
            .context("the audit log has no folder")?,
    )?
    .filter_map(Result::ok)
    .map(|e| e.path())
    .filter(|p| {
        p.file_name()
            .and_then(|n| n.to_str())
            .is_some_and(|n| n.starts_with("audit") && n.ends_with(".log"))
    })
    .collect();
    files.sort();
    for file in files {
        let text = std::fs::read_to_string(&file)?;
        for line in text.lines() {
            // Cheap filter first: most lines are other accounts'.
            if !line.contains(user) {
                continue;
            }
            let Ok(event) = serde_json::from_str::<Event>(line) else {
                continue;
            };
            let started_watch = event.stage == "ResponseStarted" && event.verb == "watch";
            if event.user.username != user || !(event.stage == "ResponseComplete" || started_watch)
            {
                continue;
            }
            let Some(object) = event.object_ref.filter(|o| !o.resource.is_empty()) else {
                continue;
            };
            found.push(Audited {
                request: Request {
                    verb: event.verb,
                    group: object.api_group,
                    resource: object.resource,
                    subresource: object.subresource,
                    namespace: object.namespace,
                    name: object.name,
                },
                code: event.response_status.map_or(0, |s| s.code),
            });
        }
    }
    Ok(found)
}

/// The distinct requests among `audited`, names left out except where a
/// rule may be limited to names (a namespace's own object).
pub fn distinct(audited: &[Audited]) -> BTreeSet<Request> {
    audited
        .iter()
        .map(|a| {
            let mut request = a.request.clone();
            if request.resource != "namespaces" {
                request.name.clear();
            }
            request
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_resource_with_group_and_subresource_is_split_as_rbac_names_it() {
        let r = Request::new("create", "pods/exec", "shop");
        assert_eq!((r.group.as_str(), r.resource.as_str()), ("", "pods"));
        assert_eq!(r.subresource, "exec");
        assert_eq!(r.to_string(), "create pods --subresource=exec -n shop");
        let r = Request::new("list", "flashsales.flashsale.dev", "");
        assert_eq!(r.group, "flashsale.dev");
        assert_eq!(r.to_string(), "list flashsales.flashsale.dev");
    }
}
