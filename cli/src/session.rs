//! The cluster a command talks to: the client from the kubeconfig (context,
//! impersonation), the namespace, the user as the apiserver knows them, and
//! the Events that attribute each write to that user.

use k8s_openapi::api::{
    authentication::v1::{SelfSubjectReview, SelfSubjectReviewStatus},
    core::v1::ObjectReference,
};
use kube::{
    Api, Client, Config, Resource,
    api::{PatchParams, PostParams},
    config::{KubeConfigOptions, Kubeconfig},
    runtime::events::{Event, EventType, Recorder, Reporter},
};

use crate::{args::ClusterArgs, failure::Failure};

/// The field manager and Event reporter of every write this plugin makes.
pub const FIELD_MANAGER: &str = "kubectl-flashsale";

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

    /// Records what the user did on `object`, as an Event reported by this
    /// plugin with the user as its instance. A write that happened is not
    /// undone when the Event cannot be written: the failure is returned
    /// for the caller to print as a warning.
    pub async fn record(
        &mut self,
        object: ObjectReference,
        reason: &str,
        action: &str,
        note: String,
    ) -> Result<(), String> {
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
        recorder
            .publish(&event, &object)
            .await
            .map_err(|err| format!("the {reason} Event was not written: {err}"))
    }
}
