//! Why a command did not do what it was asked, each with its exit code and
//! a sentence that says what to do next.

use std::fmt::Display;

/// What to ask for when a right is missing.
pub const ONCALL: &str = "ask a cluster admin for a RoleBinding in this namespace to the on-call \
     ClusterRole the operator's chart installs (flashsale-operator-oncall under the default release \
     name), which holds every right this plugin uses";

/// A command's failure.
#[derive(Debug, thiserror::Error)]
pub enum Failure {
    /// The apiserver, the plugin or the operator said no (exit 1).
    #[error("{0}")]
    Refused(String),
    /// A flag is missing or wrong (exit 2).
    #[error("{0}")]
    Usage(String),
    /// The operator or the gateways did not act in time (exit 3).
    #[error("{0}")]
    TimedOut(String),
}

impl Failure {
    /// The process's exit code.
    pub const fn code(&self) -> u8 {
        match self {
            Self::Refused(_) => 1,
            Self::Usage(_) => 2,
            Self::TimedOut(_) => 3,
        }
    }
}

/// A call to the apiserver, described for the message when it fails.
pub struct Call<'a> {
    /// The verb, as RBAC names it (`get`, `patch`, …).
    pub verb: &'a str,
    /// The resource, as RBAC names it (`degradationpolicies.flashsale.dev`).
    pub resource: &'a str,
    /// The object's name, if the call names one.
    pub name: Option<&'a str>,
    /// The namespace, if the resource is namespaced.
    pub namespace: Option<&'a str>,
}

impl Call<'_> {
    /// What went wrong in a sentence that says what to do about it.
    pub fn failed(&self, err: &kube::Error) -> Failure {
        let place = self
            .namespace
            .map(|ns| format!(" in namespace {ns}"))
            .unwrap_or_default();
        match err {
            kube::Error::Api(status) if status.code == 403 => Failure::Refused(format!(
                "permission denied: {}.\nYou need `{}` on {}{place}: {ONCALL}, or check --as/--context.",
                status.message, self.verb, self.resource
            )),
            kube::Error::Api(status) if status.code == 404 => Failure::Refused(match self.name {
                Some(name) => format!(
                    "{} {name} not found{place}: `kubectl get {}{}` lists them",
                    self.resource,
                    self.resource,
                    self.namespace
                        .map(|ns| format!(" -n {ns}"))
                        .unwrap_or_default()
                ),
                None => format!(
                    "the {} resource is not served: is the operator's chart (its CRDs) installed?",
                    self.resource
                ),
            }),
            kube::Error::Api(status) => Failure::Refused(format!(
                "the apiserver refused to {} {}{place}: {} ({})",
                self.verb, self.resource, status.message, status.reason
            )),
            other => Failure::Refused(format!(
                "cannot {} {}{place}: {other}. Is the cluster reachable with this kubeconfig and context?",
                self.verb, self.resource
            )),
        }
    }
}

/// Attaches a [`Call`] to a result from the apiserver.
pub trait Described<T> {
    /// The value, or the failure the call explains.
    fn described(self, call: Call<'_>) -> Result<T, Failure>;
}

impl<T> Described<T> for Result<T, kube::Error> {
    fn described(self, call: Call<'_>) -> Result<T, Failure> {
        self.map_err(|err| call.failed(&err))
    }
}

/// A refusal from anything displayable, with the context first.
pub fn refused(context: impl Display, err: impl Display) -> Failure {
    Failure::Refused(format!("{context}: {err}"))
}
