//! Kubernetes helpers for tests against the local control plane.

use k8s_openapi::api::core::v1::Namespace;
use kube::{
    Api, Client,
    api::{DeleteParams, ObjectMeta, PostParams},
};

use crate::stack;

/// Why no client could be had.
#[derive(Debug, thiserror::Error)]
pub enum ClientError {
    /// The stack's variables are not loaded.
    #[error(transparent)]
    Missing(#[from] stack::MissingComponent),
    /// The kubeconfig does not work.
    #[error("cannot build a client from the local stack's kubeconfig: {0}")]
    Config(#[from] kube::Error),
}

/// A client for the local control plane, or a clear error if the stack's
/// kubeconfig is not set.
pub async fn client() -> Result<Client, ClientError> {
    stack::kubeconfig()?;
    Ok(Client::try_default().await?)
}

/// A namespace for one test, deleted (in the background) when dropped, so
/// tests never see each other's objects.
pub struct TestNamespace {
    /// The namespace's name.
    pub name: String,
}

impl TestNamespace {
    /// Creates a namespace named after `prefix` and a unique suffix.
    pub async fn create(client: &Client, prefix: &str) -> Result<Self, kube::Error> {
        let name = stack::unique_name(prefix);
        let ns = Namespace {
            metadata: ObjectMeta {
                name: Some(name.clone()),
                ..ObjectMeta::default()
            },
            ..Namespace::default()
        };
        Api::<Namespace>::all(client.clone())
            .create(&PostParams::default(), &ns)
            .await?;
        Ok(Self { name })
    }
}

impl Drop for TestNamespace {
    fn drop(&mut self) {
        // The test's runtime (and the client's background worker on it) may
        // be shutting down, so the delete runs on a runtime of its own with a
        // fresh client. Best effort: the test's verdict is already decided.
        let name = self.name.clone();
        let deleted = std::thread::spawn(move || {
            let Ok(runtime) = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
            else {
                return;
            };
            runtime.block_on(async move {
                if let Ok(client) = Client::try_default().await {
                    let api = Api::<Namespace>::all(client);
                    let _ = api.delete(&name, &DeleteParams::background()).await;
                }
            });
        });
        let _ = deleted.join();
    }
}
