//! Reads what [`super::readiness`] judges: the standby sale (in this
//! cluster, or another one through a kubeconfig Secret), both regions' load
//! and each replication's lag from Prometheus, a Redis primary's replicas,
//! and the global endpoint. Every read is bounded and never fails the
//! reconcile: a failed read is a sentence in its check.

use std::time::Duration;

use futures::future::join_all;
use jiff::Timestamp;
use k8s_openapi::{ByteString, api::core::v1::Secret};
use kube::{
    Api, Client, Config,
    config::{KubeConfigOptions, Kubeconfig},
};

use super::{
    Ctx,
    readiness::{LagReading, Loads, Readings, Serving, StandbySaleReading},
    reconcile::SaleView,
};
use flashsale_api::{
    FlashSale,
    chaosdrill::{FailoverCheck, ReplicationLag},
    children::Owner,
    common::SecretKeyRef,
    conditions::READY,
};
use flashsale_observe::{signal::Reading, standby};

/// Bound of each read.
const READ_TIMEOUT: Duration = Duration::from_secs(5);
/// How old a Prometheus sample may be: its default lookback.
const SAMPLE_AGE: Duration = Duration::from_secs(300);

/// Where the drill's readings come from.
pub struct Source<'a> {
    /// The operator's context.
    pub ctx: &'a Ctx,
    /// The drill's namespace (Secrets, the primary sale).
    pub namespace: &'a str,
    /// The primary sale's name.
    pub sale: &'a str,
    /// The primary sale as the look read it.
    pub primary: &'a SaleView,
    /// The Prometheus the guard asks.
    pub prometheus_url: &'a str,
}

/// Reads everything `spec` checks, at `now`; the reads run at once.
pub async fn read(source: &Source<'_>, spec: &FailoverCheck, now: Timestamp) -> Readings {
    let loads = async {
        match &spec.capacity {
            Some(capacity) => Some(loads(source, &capacity.load, spec, now).await),
            None => None,
        }
    };
    let lags = join_all(
        spec.replication
            .iter()
            .map(|lag| self::lag(source, lag, now)),
    );
    let endpoint = async {
        match &spec.endpoint {
            Some(endpoint) => Some(match (&endpoint.haproxy_stats_url, &endpoint.server) {
                (Some(url), Some(server)) => standby::haproxy_server(url, server, READ_TIMEOUT)
                    .await
                    .map(|state| (state.up(), state.status))
                    .map_err(|err| err.to_string()),
                _ => {
                    let query = endpoint.query.as_deref().unwrap_or_default();
                    promql(source, query, now)
                        .await
                        .map(|v| (v >= 1.0, format!("spec.failover.endpoint.query = {v}")))
                }
            }),
            None => None,
        }
    };
    let serving = async {
        match spec.endpoint.as_ref().and_then(|e| e.url.as_deref()) {
            Some(url) => Some(serving(source, url).await),
            None => None,
        }
    };
    let (standby, loads, lags, endpoint, serving) =
        tokio::join!(standby_sale(source, spec), loads, lags, endpoint, serving);
    Readings {
        standby,
        loads,
        lags,
        endpoint,
        serving,
    }
}

/// Which region answers `GET /` through the global endpoint at `url`, with
/// the primary sale's region and readiness (as the look read it) to judge
/// it by.
async fn serving(source: &Source<'_>, url: &str) -> Result<Serving, String> {
    if source.primary.uid.is_none() {
        return Err(format!("the primary sale {} does not exist", source.sale));
    }
    let (status, answered_by) = standby::answering_region(url, "/", READ_TIMEOUT)
        .await
        .map_err(|err| err.to_string())?;
    Ok(Serving {
        status,
        answered_by,
        primary_region: source.primary.region.clone(),
        primary_ready: source.primary.ready,
    })
}

/// The standby sale, where the spec says it is.
async fn standby_sale(source: &Source<'_>, spec: &FailoverCheck) -> StandbySaleReading {
    let client = match &spec.standby.kubeconfig_secret_ref {
        None => source.ctx.client.clone(),
        Some(secret) => match remote_client(source, secret).await {
            Ok(client) => client,
            Err(why) => return StandbySaleReading::Missing(why),
        },
    };
    let sales: Api<FlashSale> = Api::namespaced(client, &spec.standby.namespace);
    let name = &spec.standby.name;
    let sale = match tokio::time::timeout(READ_TIMEOUT, sales.get_opt(name)).await {
        Err(_) => {
            let timeout = flashsale_api::Duration(READ_TIMEOUT);
            return StandbySaleReading::Missing(format!(
                "its apiserver did not answer within {timeout}"
            ));
        }
        Ok(Err(kube::Error::Api(refused))) if refused.code == 403 => {
            return StandbySaleReading::Missing(format!(
                "the operator may not read FlashSales in namespace {} ({}): give it get on \
                 flashsales there, or reach the standby through kubeconfigSecretRef",
                spec.standby.namespace, refused.message
            ));
        }
        Ok(Err(err)) => return StandbySaleReading::Missing(format!("reading it failed: {err}")),
        Ok(Ok(None)) => return StandbySaleReading::Missing("it does not exist".to_owned()),
        Ok(Ok(Some(sale))) => sale,
    };
    let standby_id = Owner::new(&sale).ok().map(|owner| owner.sale_id());
    if let (Some(primary), Some(standby)) = (&source.primary.sale_id, standby_id)
        && *primary != standby
    {
        return StandbySaleReading::OtherSale {
            primary: primary.clone(),
            standby,
        };
    }
    let status = sale.status.unwrap_or_default();
    let ready = status.observed.conditions.iter().find(|c| c.type_ == READY);
    match ready {
        Some(ready) if ready.status == "True" => StandbySaleReading::Ready {
            gateways: status.workloads.get("gateway").map_or(0, |w| w.ready),
        },
        Some(ready) => StandbySaleReading::NotReady(format!("{}: {}", ready.reason, ready.message)),
        None => StandbySaleReading::NotReady("it has no Ready condition yet".to_owned()),
    }
}

/// A client of the standby's cluster, from the kubeconfig in `secret`.
async fn remote_client(source: &Source<'_>, secret: &SecretKeyRef) -> Result<Client, String> {
    let yaml = secret_value(source, secret).await?;
    let what = format!("the kubeconfig in Secret {}", secret.name);
    let kubeconfig = Kubeconfig::from_yaml(&yaml).map_err(|err| format!("{what}: {err}"))?;
    inline_only(&kubeconfig).map_err(|err| format!("{what}: {err}"))?;
    let options = KubeConfigOptions::default();
    let config = Config::from_custom_kubeconfig(kubeconfig, &options);
    let config = tokio::time::timeout(READ_TIMEOUT, config)
        .await
        .map_err(|_| {
            format!(
                "{what}: loading it took longer than {}",
                flashsale_api::Duration(READ_TIMEOUT)
            )
        })?
        .map_err(|err| format!("{what}: {err}"))?;
    Client::try_from(config).map_err(|err| format!("{what}: {err}"))
}

/// Refuses a kubeconfig that would make the operator run a program or read
/// its own files: whoever may write a Secret in the drill's namespace must
/// not get to run commands as the operator or send its token elsewhere.
/// Credentials and certificates are taken inline only.
fn inline_only(kubeconfig: &Kubeconfig) -> Result<(), String> {
    for named in &kubeconfig.auth_infos {
        let Some(user) = &named.auth_info else {
            continue;
        };
        let refused = [
            (user.exec.is_some(), "exec"),
            (user.auth_provider.is_some(), "auth-provider"),
            (user.token_file.is_some(), "tokenFile"),
            (
                user.client_certificate.is_some(),
                "client-certificate (a file)",
            ),
            (user.client_key.is_some(), "client-key (a file)"),
        ];
        if let Some((_, field)) = refused.iter().find(|(set, _)| *set) {
            return Err(format!(
                "user {} uses {field}; only inline credentials are accepted (token, \
                 client-certificate-data, client-key-data)",
                named.name
            ));
        }
    }
    for named in &kubeconfig.clusters {
        if named
            .cluster
            .as_ref()
            .is_some_and(|c| c.certificate_authority.is_some())
        {
            return Err(format!(
                "cluster {} uses certificate-authority (a file); give certificate-authority-data",
                named.name
            ));
        }
    }
    Ok(())
}

/// The value of `secret`'s key in the drill's namespace, as text.
async fn secret_value(source: &Source<'_>, secret: &SecretKeyRef) -> Result<String, String> {
    secret_text(&source.ctx.client, source.namespace, secret).await
}

/// The value of `secret`'s key in `namespace` as text, without the
/// whitespace around it (a URL written with a trailing newline is the same
/// URL); why not, in a sentence.
pub async fn secret_text(
    client: &Client,
    namespace: &str,
    secret: &SecretKeyRef,
) -> Result<String, String> {
    let bytes = secret_bytes(client, namespace, secret).await?;
    String::from_utf8(bytes)
        .map(|text| text.trim().to_owned())
        .map_err(|_| {
            format!(
                "Secret {namespace}/{} key {} is not text",
                secret.name, secret.key
            )
        })
}

/// The value of `secret`'s key in `namespace`, read within the bound; why
/// not, in a sentence.
pub async fn secret_bytes(
    client: &Client,
    namespace: &str,
    secret: &SecretKeyRef,
) -> Result<Vec<u8>, String> {
    let secrets: Api<Secret> = Api::namespaced(client.clone(), namespace);
    let what = format!("Secret {namespace}/{}", secret.name);
    let found = tokio::time::timeout(READ_TIMEOUT, secrets.get_opt(&secret.name))
        .await
        .map_err(|_| {
            format!(
                "reading {what} took longer than {}",
                flashsale_api::Duration(READ_TIMEOUT)
            )
        })?
        .map_err(|err| format!("reading {what} failed: {err}"))?
        .ok_or_else(|| format!("{what} does not exist"))?;
    let ByteString(bytes) = found
        .data
        .and_then(|mut data| data.remove(&secret.key))
        .ok_or_else(|| format!("{what} has no key {}", secret.key))?;
    Ok(bytes)
}

/// Both regions' loads: `query` for the primary sale, then for the standby.
async fn loads(
    source: &Source<'_>,
    query: &str,
    spec: &FailoverCheck,
    now: Timestamp,
) -> Result<Loads, String> {
    let of = |namespace: &str, sale: &str| {
        query
            .replace("$namespace", namespace)
            .replace("$sale", sale)
    };
    let primary = of(source.namespace, source.sale);
    let standby = of(&spec.standby.namespace, &spec.standby.name);
    let (primary, standby) =
        tokio::join!(promql(source, &primary, now), promql(source, &standby, now));
    Ok(Loads {
        primary: primary.map_err(|why| format!("primary load: {why}"))?,
        standby: standby.map_err(|why| format!("standby load: {why}"))?,
    })
}

/// One replication's lag.
async fn lag(
    source: &Source<'_>,
    lag: &ReplicationLag,
    now: Timestamp,
) -> Result<LagReading, String> {
    if let Some(secret) = &lag.redis_url_secret_ref {
        let url = secret_value(source, secret).await?;
        let replicas = standby::redis_replicas(url.trim(), READ_TIMEOUT)
            .await
            .map_err(|err| err.to_string())?;
        return Ok(match replicas.worst_lag_secs {
            Some(secs) if replicas.online > 0 => LagReading::Lag(
                Duration::from_secs(secs),
                replicas
                    .worst_behind_bytes
                    .map(|bytes| format!("{bytes} bytes")),
            ),
            _ => LagReading::Broken("the primary has no replica online".to_owned()),
        });
    }
    let query = lag.query.as_deref().unwrap_or_default();
    let secs = promql(source, query, now).await?;
    if secs < 0.0 {
        return Err(format!("its query gave {secs}, not a lag in seconds"));
    }
    Ok(LagReading::Lag(
        Duration::from_secs_f64(secs.min(1e9)),
        None,
    ))
}

/// One instant value of `query` at the guard's Prometheus.
async fn promql(source: &Source<'_>, query: &str, now: Timestamp) -> Result<f64, String> {
    let reading = source
        .ctx
        .settings
        .signal
        .read(source.prometheus_url, query, READ_TIMEOUT, SAMPLE_AGE, now)
        .await;
    match reading {
        Reading::Value(sample) => Ok(sample.value),
        Reading::Lost(loss) => Err(format!("{}: {}", loss.cause, loss.detail)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn kubeconfig(user: &str, cluster: &str) -> anyhow::Result<Kubeconfig> {
        Ok(Kubeconfig::from_yaml(&format!(
            "apiVersion: v1\nkind: Config\nclusters:\n- name: b\n  cluster:\n    server: https://b:6443\n{cluster}\
             users:\n- name: u\n  user:\n{user}contexts:\n- name: b\n  context: {{cluster: b, user: u}}\n\
             current-context: b\n"
        ))?)
    }

    #[test]
    fn a_kubeconfig_that_runs_a_program_or_reads_a_file_is_refused() -> anyhow::Result<()> {
        let inline = kubeconfig("    token: abc\n", "    certificate-authority-data: Y2E=\n")?;
        assert_eq!(inline_only(&inline), Ok(()));
        for (user, field) in [
            (
                "    exec: {apiVersion: client.authentication.k8s.io/v1, command: sh}\n",
                "exec",
            ),
            (
                "    tokenFile: /var/run/secrets/kubernetes.io/serviceaccount/token\n",
                "tokenFile",
            ),
            ("    client-certificate: /etc/hosts\n", "client-certificate"),
            ("    client-key: /etc/hosts\n", "client-key"),
            ("    auth-provider: {name: oidc}\n", "auth-provider"),
        ] {
            let refused = inline_only(&kubeconfig(user, "")?);
            assert!(
                refused.as_ref().is_err_and(|e| e.contains(field)),
                "{field}: {refused:?}"
            );
        }
        let file_ca = kubeconfig(
            "    token: abc\n",
            "    certificate-authority: /etc/ssl/ca.pem\n",
        )?;
        assert!(inline_only(&file_ca).is_err_and(|e| e.contains("certificate-authority")));
        Ok(())
    }
}
