//! The operator's Helm chart: a release installed for real with `helm`
//! ([`Release`]), and its RBAC alone: the chart rendered in namespaced
//! mode, its ServiceAccount, Roles and RoleBindings created in a test's
//! namespace, and a kubeconfig holding that account's token, so a test's
//! operator process runs with exactly the rights users give it.

use std::{
    path::{Path, PathBuf},
    process::Command,
};

use anyhow::{Context as _, bail, ensure};
use k8s_openapi::api::{
    authentication::v1::{TokenRequest, TokenRequestSpec},
    core::v1::ServiceAccount,
    rbac::v1::{Role, RoleBinding},
};
use kube::{
    Api, Client,
    api::PostParams,
    config::{KubeConfigOptions, Kubeconfig},
};
use serde::Deserialize;
use serde_json::{Value, json};

/// The chart's folder in this checkout.
pub fn dir() -> anyhow::Result<PathBuf> {
    crate::checkout::path("charts/flashsale-operator")
}

/// Runs `helm` with `args`; its standard output, or an error with its
/// standard error.
pub fn helm(args: &[&str]) -> anyhow::Result<String> {
    let out = Command::new("helm")
        .args(args)
        .output()
        .context("running helm (`e2e/local/stack env` puts it on PATH)")?;
    ensure!(
        out.status.success(),
        "helm {} failed: {}",
        args.first().copied().unwrap_or_default(),
        String::from_utf8_lossy(&out.stderr)
    );
    Ok(String::from_utf8(out.stdout)?)
}

/// The chart rendered for `namespace` in namespaced mode (release and
/// watched namespace alike), one JSON value per object.
pub fn render(namespace: &str) -> anyhow::Result<Vec<Value>> {
    render_with(
        "flashsale",
        namespace,
        &json!({ "watchNamespace": namespace }),
    )
}

/// The chart rendered as release `release` in `namespace` with `values`,
/// one JSON value per object.
pub fn render_with(release: &str, namespace: &str, values: &Value) -> anyhow::Result<Vec<Value>> {
    let file = values_file(values)?;
    let text = helm(&[
        "template",
        release,
        &dir()?.to_string_lossy(),
        "--namespace",
        namespace,
        "--values",
        &file.path().to_string_lossy(),
    ])?;
    let mut objects = Vec::new();
    for document in serde_yaml_ng::Deserializer::from_str(&text) {
        let object = Value::deserialize(document)?;
        if !object.is_null() {
            objects.push(object);
        }
    }
    Ok(objects)
}

/// `values` in a file for `helm --values`, removed when dropped.
fn values_file(values: &Value) -> anyhow::Result<tempfile::NamedTempFile> {
    let mut file = tempfile::NamedTempFile::new()?;
    serde_json::to_writer(&mut file, values)?;
    Ok(file)
}

/// The one object of `kind` among `objects`.
pub fn only<'a>(objects: &'a [Value], kind: &str) -> anyhow::Result<&'a Value> {
    let mut of_kind = objects.iter().filter(|o| o["kind"] == kind);
    let object = of_kind
        .next()
        .with_context(|| format!("the chart renders no {kind}"))?;
    ensure!(of_kind.next().is_none(), "the chart renders two {kind}s");
    Ok(object)
}

/// The alerting rule groups of the chart's PrometheusRule, rendered as
/// release `release` in `namespace` with `values` (`prometheusRule`
/// enabled): what a Prometheus rule file holds.
pub fn alert_groups(release: &str, namespace: &str, values: &Value) -> anyhow::Result<Value> {
    let mut values = values.clone();
    values["prometheusRule"]["enabled"] = json!(true);
    let objects = render_with(release, namespace, &values)?;
    Ok(only(&objects, "PrometheusRule")?["spec"].clone())
}

/// Every query of the chart's Grafana dashboard, as its ConfigMap carries
/// them, with the dashboard's variables set to match everything.
pub fn dashboard_queries() -> anyhow::Result<Vec<String>> {
    let objects = render_with(
        "flashsale",
        "default",
        &json!({"dashboard": {"enabled": true}}),
    )?;
    let config_map = only(&objects, "ConfigMap")?;
    let text = config_map["data"]["flashsale.json"]
        .as_str()
        .context("the dashboard ConfigMap has no flashsale.json")?;
    let dashboard: Value = serde_json::from_str(text).context("the dashboard is not JSON")?;
    let mut queries = Vec::new();
    for panel in dashboard["panels"].as_array().into_iter().flatten() {
        for target in panel["targets"].as_array().into_iter().flatten() {
            let expr = target["expr"]
                .as_str()
                .with_context(|| format!("a target of {} has no expr", panel["title"]))?;
            queries.push(expr.replace("$namespace", ".*"));
        }
    }
    Ok(queries)
}

/// A kubeconfig file with a token in it, removed when dropped.
pub struct KubeconfigFile(pub PathBuf);

impl KubeconfigFile {
    /// The path, as the `KUBECONFIG` variable of an operator process.
    pub fn env(&self) -> String {
        self.0.to_string_lossy().into_owned()
    }
}

impl Drop for KubeconfigFile {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.0);
    }
}

/// Installs the chart's ServiceAccount, Roles and RoleBindings (not its
/// Deployment, PodDisruptionBudget or Service: the test runs the binary)
/// into `namespace`, each Role passed through `edit` first, and returns a
/// kubeconfig file for the account.
pub async fn install(
    client: &Client,
    namespace: &str,
    edit: impl Fn(&mut Role),
) -> anyhow::Result<KubeconfigFile> {
    let mut account = None;
    for object in render(namespace)? {
        match object["kind"].as_str() {
            Some("ServiceAccount") => {
                let sa: ServiceAccount = serde_json::from_value(object)?;
                account = sa.metadata.name.clone();
                Api::<ServiceAccount>::namespaced(client.clone(), namespace)
                    .create(&PostParams::default(), &sa)
                    .await?;
            }
            Some("Role") => {
                let mut role: Role = serde_json::from_value(object)?;
                edit(&mut role);
                Api::<Role>::namespaced(client.clone(), namespace)
                    .create(&PostParams::default(), &role)
                    .await?;
            }
            Some("RoleBinding") => {
                let binding: RoleBinding = serde_json::from_value(object)?;
                Api::<RoleBinding>::namespaced(client.clone(), namespace)
                    .create(&PostParams::default(), &binding)
                    .await?;
            }
            // The operator's own objects: the test runs the binary instead.
            Some("Deployment" | "PodDisruptionBudget" | "Service") => {}
            other => {
                bail!("the namespaced chart renders a {other:?}: nothing cluster-wide expected")
            }
        }
    }
    let account = account.context("the chart renders no ServiceAccount")?;
    let request = TokenRequest {
        spec: Some(TokenRequestSpec {
            expiration_seconds: Some(3600),
            ..TokenRequestSpec::default()
        }),
        ..TokenRequest::default()
    };
    let token = Api::<ServiceAccount>::namespaced(client.clone(), namespace)
        .create_token_request(&account, &PostParams::default(), &request)
        .await?
        .status
        .context("no token in the TokenRequest's answer")?
        .token;

    // The stack's apiserver and CA, the account's token.
    let admin = Kubeconfig::read()?;
    let context = admin
        .contexts
        .iter()
        .find(|c| Some(&c.name) == admin.current_context.as_ref())
        .and_then(|c| c.context.as_ref())
        .context("the stack's kubeconfig has no current context")?;
    let cluster = admin
        .clusters
        .iter()
        .find(|c| c.name == context.cluster)
        .and_then(|c| c.cluster.as_ref())
        .context("the stack's kubeconfig has no cluster for its context")?;
    let kubeconfig = json!({
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [{"name": "stack", "cluster": {
            "server": cluster.server,
            "certificate-authority-data": cluster.certificate_authority_data,
            "certificate-authority": cluster.certificate_authority,
        }}],
        "users": [{"name": account, "user": {"token": token}}],
        "contexts": [{"name": "scoped", "context": {
            "cluster": "stack", "user": account, "namespace": namespace}}],
        "current-context": "scoped",
    });
    let path = std::env::temp_dir().join(format!("{namespace}.kubeconfig"));
    std::fs::write(&path, serde_json::to_vec_pretty(&kubeconfig)?)?;
    Ok(KubeconfigFile(path))
}

/// A client with the kubeconfig at `path`.
pub async fn client_of(path: &Path) -> anyhow::Result<Client> {
    let config = kube::Config::from_custom_kubeconfig(
        Kubeconfig::read_from(path)?,
        &KubeConfigOptions::default(),
    )
    .await?;
    Ok(Client::try_from(config)?)
}

/// The chart's CRDs applied the way its upgrade path says (Helm never
/// upgrades CRDs): `kubectl apply --server-side --force-conflicts -f
/// <chart>/crds/`; kubectl's output.
pub fn apply_crds() -> anyhow::Result<String> {
    let out = Command::new("kubectl")
        .args(["apply", "--server-side", "--force-conflicts", "-f"])
        .arg(dir()?.join("crds"))
        .output()
        .context("running kubectl (`e2e/local/stack env` puts it on PATH)")?;
    ensure!(
        out.status.success(),
        "applying the chart's CRDs failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    Ok(String::from_utf8(out.stdout)?)
}

/// A release of the chart, installed with `helm upgrade --install --wait`
/// and uninstalled when dropped.
pub struct Release {
    /// The release's name.
    pub name: String,
    /// The namespace it is installed in.
    pub namespace: String,
}

impl Release {
    /// Installs (or upgrades to) the chart `chart` as `name` in
    /// `namespace` with `values`, and waits until its pods are ready.
    pub fn install(
        chart: &Path,
        name: &str,
        namespace: &str,
        values: &Value,
    ) -> anyhow::Result<Self> {
        let release = Self {
            name: name.to_owned(),
            namespace: namespace.to_owned(),
        };
        release.upgrade(chart, values)?;
        Ok(release)
    }

    /// `helm upgrade --install` of `chart` with `values` (every value
    /// given, none reused), waiting until the rollout is ready.
    pub fn upgrade(&self, chart: &Path, values: &Value) -> anyhow::Result<()> {
        let file = values_file(values)?;
        helm(&[
            "upgrade",
            "--install",
            &self.name,
            &chart.to_string_lossy(),
            "--namespace",
            &self.namespace,
            "--values",
            &file.path().to_string_lossy(),
            "--wait",
            "--timeout",
            "180s",
        ])?;
        Ok(())
    }

    /// The names the chart gives its objects: the release's full name.
    pub fn full_name(&self) -> String {
        if self.name.contains("flashsale-operator") {
            self.name.clone()
        } else {
            format!("{}-flashsale-operator", self.name)
        }
    }

    /// The user the operator's pods act as.
    pub fn service_account_user(&self) -> String {
        format!(
            "system:serviceaccount:{}:{}",
            self.namespace,
            self.full_name()
        )
    }
}

impl Drop for Release {
    fn drop(&mut self) {
        let _ = helm(&[
            "uninstall",
            &self.name,
            "--namespace",
            &self.namespace,
            "--wait",
            "--timeout",
            "120s",
        ]);
    }
}
