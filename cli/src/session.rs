//! The cluster a command talks to: the client from the kubeconfig (context,
//! impersonation), the namespace, the user as the apiserver knows them, and
//! the Events that attribute each write to that user.

use std::{fmt::Debug, io::Write};

use k8s_openapi::api::{
    authentication::v1::{SelfSubjectReview, SelfSubjectReviewStatus},
    core::v1::ObjectReference,
};
use kube::{
    Api, Client, Config, Resource, ResourceExt,
    api::{ListParams, PatchParams, PostParams},
    config::{KubeConfigOptions, Kubeconfig},
    runtime::events::{Event, EventType, Recorder, Reporter},
};
use serde::de::DeserializeOwned;

use crate::{
    args::ClusterArgs,
    failure::{Call, Described, Failure},
};

/// The three kinds as RBAC names them, for the messages of refused calls.
pub const SALES: &str = "flashsales.flashsale.dev";
/// DegradationPolicies, as RBAC names them.
pub const POLICIES: &str = "degradationpolicies.flashsale.dev";
/// ChaosDrills, as RBAC names them.
pub const DRILLS: &str = "chaosdrills.flashsale.dev";

/// The field manager and Event reporter of every write this plugin makes.
pub const FIELD_MANAGER: &str = "kubectl-flashsale";

/// A new request's name, for the annotations the operator answers one
/// request at a time (run-now, check-readiness): unique per millisecond.
pub fn request_id() -> String {
    format!(
        "{FIELD_MANAGER}-{}",
        jiff::Timestamp::now().as_millisecond()
    )
}

/// The parameters of this plugin's merge patches (annotations, a cleared
/// override): its field manager, and a server-side dry run when asked.
pub fn merge_params(dry_run: bool) -> PatchParams {
    PatchParams {
        field_manager: Some(FIELD_MANAGER.to_owned()),
        dry_run,
        ..PatchParams::default()
    }
}

/// A connected command.
pub struct Session {
    /// The apiserver client.
    pub client: Client,
    /// The namespace the command works in.
    pub namespace: String,
    /// Every namespace (`-A`).
    pub all_namespaces: bool,
    user: Option<String>,
}

impl Session {
    /// Connects as `args` say.
    pub async fn connect(args: &ClusterArgs) -> Result<Self, Failure> {
        let options = KubeConfigOptions {
            context: args.context.clone(),
            ..KubeConfigOptions::default()
        };
        let config = match &args.kubeconfig {
            Some(path) => {
                let kubeconfig = Kubeconfig::read_from(path).map_err(|err| {
                    Failure::Usage(format!("reading the kubeconfig {}: {err}", path.display()))
                })?;
                Config::from_custom_kubeconfig(kubeconfig, &options).await
            }
            None => Config::from_kubeconfig(&options).await,
        };
        let mut config = match config {
            Ok(config) => config,
            // In a pod with no kubeconfig: its service account.
            Err(_) if args.context.is_none() => Config::incluster().map_err(|err| {
                Failure::Usage(format!(
                    "no kubeconfig: set KUBECONFIG or --kubeconfig ({err})"
                ))
            })?,
            Err(err) => return Err(Failure::Usage(format!("the kubeconfig: {err}"))),
        };
        if let Some(user) = &args.impersonate {
            config.auth_info.impersonate = Some(user.clone());
        }
        if !args.impersonate_groups.is_empty() {
            config.auth_info.impersonate_groups = Some(args.impersonate_groups.clone());
        }
        let namespace = args
            .namespace
            .clone()
            .unwrap_or_else(|| config.default_namespace.clone());
        let client = Client::try_from(config)
            .map_err(|err| Failure::Usage(format!("building the client: {err}")))?;
        Ok(Self {
            client,
            namespace,
            all_namespaces: args.all_namespaces,
            user: None,
        })
    }

    /// An API of `K` in the command's namespace.
    pub fn namespaced<K>(&self) -> Api<K>
    where
        K: Resource<Scope = k8s_openapi::NamespaceResourceScope>,
        K::DynamicType: Default,
    {
        Api::namespaced(self.client.clone(), &self.namespace)
    }

    /// An API of `K` in the namespace, or in all of them with `-A`.
    pub fn listing<K>(&self) -> Api<K>
    where
        K: Resource<Scope = k8s_openapi::NamespaceResourceScope>,
        K::DynamicType: Default,
    {
        if self.all_namespaces {
            Api::all(self.client.clone())
        } else {
            self.namespaced()
        }
    }

    /// The user as the apiserver authenticated them (a SelfSubjectReview),
    /// `--as` included; "unknown user" where the apiserver cannot say.
    pub async fn user(&mut self) -> String {
        if let Some(user) = &self.user {
            return user.clone();
        }
        let reviews: Api<SelfSubjectReview> = Api::all(self.client.clone());
        let review = SelfSubjectReview::default();
        let user = match reviews.create(&PostParams::default(), &review).await {
            Ok(SelfSubjectReview {
                status:
                    Some(SelfSubjectReviewStatus {
                        user_info: Some(info),
                    }),
                ..
            }) => info.username.unwrap_or_else(|| "unknown user".to_owned()),
            _ => "unknown user".to_owned(),
        };
        self.user = Some(user.clone());
        user
    }

    /// `name` of kind `K` in the namespace; `resource` (as RBAC names it)
    /// says what was missing or forbidden.
    pub async fn get<K>(&self, resource: &str, name: &str) -> Result<K, Failure>
    where
        K: Resource<Scope = k8s_openapi::NamespaceResourceScope> + Clone + DeserializeOwned + Debug,
        K::DynamicType: Default,
    {
        self.namespaced::<K>().get(name).await.described(Call {
            verb: "get",
            resource,
            name: Some(name),
            namespace: Some(&self.namespace),
        })
    }

    /// Every `K` of the namespace, or of every namespace when `all`, by
    /// namespace and name; `resource` (as RBAC names it) says what was
    /// forbidden.
    pub async fn list<K>(&self, resource: &str, all: bool) -> Result<Vec<K>, Failure>
    where
        K: Resource<Scope = k8s_openapi::NamespaceResourceScope> + Clone + DeserializeOwned + Debug,
        K::DynamicType: Default,
    {
        let (api, namespace) = if all {
            (Api::all(self.client.clone()), None)
        } else {
            (self.namespaced(), Some(self.namespace.as_str()))
        };
        let call = Call {
            verb: "list",
            resource,
            name: None,
            namespace,
        };
        let mut items = api
            .list(&ListParams::default())
            .await
            .described(call)?
            .items;
        items.sort_by_key(|item: &K| (item.namespace(), item.name_any()));
        Ok(items)
    }

    /// Records what the user did on `object`, as an Event reported by this
    /// plugin with the user as its instance. A write that happened is not
    /// undone when the Event cannot be written: that is a warning on `err`.
    pub async fn record(
        &mut self,
        object: ObjectReference,
        reason: &str,
        action: &str,
        note: String,
        err: &mut impl Write,
    ) {
        let user = self.user().await;
        let reporter = Reporter {
            controller: FIELD_MANAGER.to_owned(),
            instance: Some(user),
        };
        let recorder = Recorder::new(self.client.clone(), reporter);
        let event = Event {
            type_: EventType::Normal,
            reason: reason.to_owned(),
            note: Some(note),
            action: action.to_owned(),
            secondary: None,
        };
        if let Err(failed) = recorder.publish(&event, &object).await {
            let _ = writeln!(err, "warning: the {reason} Event was not written: {failed}");
        }
    }
}
