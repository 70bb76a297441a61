//! The operator installed for one namespace, as the Helm chart installs it
//! with `watchNamespace`: its ServiceAccount holds the chart's Roles in that
//! namespace and nothing cluster-wide, and the operator runs with that
//! account's token. It starts, leads on its Lease there and brings a sale
//! to Ready; with the right to list and watch one kind taken away, it keeps
//! running and says so: a warning, `flashsale_operator_watch_errors_total`
//! and a `/readyz` that fails naming the controller and the refusal. A
//! drill's standby in another namespace is refused, and the drill says so.

mod common;

use std::time::Duration;

use common::{
    Operator,
    chart::{client_of, install},
    secret, setup,
};
use flashsale_api::{ChaosDrill, FlashSale, conditions::STANDBY_READY};
use flashsale_e2e::{kube::TestNamespace, wait::poll_until};
use k8s_openapi::api::{
    coordination::v1::Lease,
    rbac::v1::{PolicyRule, Role},
};
use kube::{
    Api, Client,
    api::{ListParams, Patch, PatchParams, PostParams},
};
use serde_json::{Value, json};

const WAIT: Duration = Duration::from_secs(60);
const TICK: Duration = Duration::from_millis(200);

/// Takes `list` and `watch` on `resource` out of `role`, keeping its other
/// verbs.
fn without_list_and_watch(role: &mut Role, resource: &str) {
    let mut kept = Vec::new();
    for rule in role.rules.iter_mut().flatten() {
        let resources = rule.resources.get_or_insert_with(Vec::new);
        if resources.iter().any(|r| r == resource) && rule.verbs.iter().any(|v| v == "list") {
            resources.retain(|r| r != resource);
            kept.push(PolicyRule {
                api_groups: rule.api_groups.clone(),
                resources: Some(vec![resource.to_owned()]),
                verbs: rule
                    .verbs
                    .iter()
                    .filter(|v| *v != "list" && *v != "watch")
                    .cloned()
                    .collect(),
                ..PolicyRule::default()
            });
        }
    }
    role.rules.get_or_insert_with(Vec::new).extend(kept);
}

/// `/readyz`'s status code and its checks.
async fn readyz(operator: &Operator) -> anyhow::Result<(u16, Value)> {
    let answer = reqwest::get(format!("http://{}/readyz", operator.ops)).await?;
    let code = answer.status().as_u16();
    Ok((code, answer.json::<Value>().await?["checks"].clone()))
}

/// The value of the sample `series` (name and labels, exactly as exposed).
fn sample(metrics: &str, series: &str) -> f64 {
    metrics
        .lines()
        .find_map(|line| line.strip_prefix(series)?.trim().parse().ok())
        .unwrap_or(0.0)
}

async fn until_sale_ready(client: &Client, ns: &str, name: &str) -> anyhow::Result<()> {
    let sales = Api::<FlashSale>::namespaced(client.clone(), ns);
    poll_until(&format!("sale {name} Ready"), WAIT, TICK, || async {
        let sale = sales.get(name).await.map_err(|e| e.to_string())?;
        match &sale.status {
            Some(status) if status.observed.is_true("Ready") => Ok(()),
            other => Err(format!("{other:?}")),
        }
    })
    .await?;
    Ok(())
}

async fn create_sale(client: &Client, ns: &str, name: &str) -> anyhow::Result<()> {
    secret(client, ns, "jwt", "hs256").await?;
    secret(client, ns, "db", "url").await?;
    let sale: FlashSale = serde_json::from_value(flashsale_e2e::sales::warming_up(name))?;
    Api::<FlashSale>::namespaced(client.clone(), ns)
        .create(&PostParams::default(), &sale)
        .await?;
    Ok(())
}

#[tokio::test]
async fn with_the_charts_namespaced_role_the_operator_starts_leads_and_runs_a_sale()
-> anyhow::Result<()> {
    let client = setup().await?;
    let ns = TestNamespace::create(&client, "fs-scoped").await?;
    let kubeconfig = install(&client, &ns.name, |_| {}).await?;

    // The account really is limited to the namespace.
    let scoped = client_of(&kubeconfig.0).await?;
    let everywhere = Api::<FlashSale>::all(scoped.clone())
        .list(&ListParams::default().limit(1))
        .await;
    assert!(
        matches!(&everywhere, Err(kube::Error::Api(s)) if s.code == 403),
        "listing FlashSales cluster-wide: {everywhere:?}"
    );

    let operator = Operator::start_with_env(
        &ns.name,
        "scoped",
        &[],
        &[("KUBECONFIG", &kubeconfig.env())],
    )?;
    operator.until_leads().await?;
    let lease = Api::<Lease>::namespaced(client.clone(), &ns.name)
        .get("flashsale-operator")
        .await?;
    let holder = lease
        .spec
        .and_then(|s| s.holder_identity)
        .unwrap_or_default();
    assert!(holder.starts_with("scoped-"), "lease holder {holder:?}");

    create_sale(&client, &ns.name, "scoped").await?;
    until_sale_ready(&client, &ns.name, "scoped").await?;

    // Every controller's watches run: no error, and ready.
    let metrics = operator.metrics().await?;
    assert_eq!(
        common::sum_samples(&metrics, "flashsale_operator_watch_errors_total"),
        0.0,
        "watch errors: {}",
        std::fs::read_to_string(&operator.log).unwrap_or_default()
    );
    let (code, checks) = readyz(&operator).await?;
    assert_eq!(code, 200, "{checks}");
    for controller in ["flashsale", "degradationpolicy", "chaosdrill"] {
        assert_eq!(checks[format!("watch/{controller}")], "ok", "{checks}");
    }
    standby_reads_stay_in_the_namespace(&client, &ns.name).await
}

/// A drill's standby in another namespace cannot be read under the Role,
/// and the drill says what to grant; its own namespace's sale can.
async fn standby_reads_stay_in_the_namespace(client: &Client, ns: &str) -> anyhow::Result<()> {
    let drills: Api<ChaosDrill> = Api::namespaced(client.clone(), ns);
    let drill: ChaosDrill = serde_json::from_value(json!({
        "apiVersion": "flashsale.dev/v1alpha1",
        "kind": "ChaosDrill",
        "metadata": {"name": "standby"},
        "spec": {
            "saleRef": {"name": "scoped"},
            "schedule": {"cron": "0 0 1 1 *"},
            "experiments": [{"name": "kill", "target": "gateway", "duration": "5s", "podChaos": {"action": "pod-kill"}}],
            "blastRadius": {"maxPercent": 50, "maxPods": 1},
            "sloGuard": {"objectives": [{"name": "never", "query": "vector(0)", "threshold": 1}]},
            "failover": {
                "mode": "ReadinessOnly", "maxRTO": "30s", "checkEvery": "1s",
                "standby": {"namespace": "flashsale-region-b", "name": "scoped"}
            }
        }
    }))?;
    drills.create(&PostParams::default(), &drill).await?;
    let standby = |want: &'static str| {
        let drills = drills.clone();
        async move {
            poll_until(&format!("StandbyReady {want}"), WAIT, TICK, || async {
                let drill = drills.get("standby").await.map_err(|e| e.to_string())?;
                let status = drill.status.unwrap_or_default();
                match status.observed.get(STANDBY_READY) {
                    Some(c) if c.reason == want => Ok(c.message.clone()),
                    other => Err(format!("{other:?}")),
                }
            })
            .await
        }
    };
    let refused = standby("StandbyMissing").await?;
    assert!(
        refused.contains("may not read FlashSales in namespace flashsale-region-b")
            && refused.contains("kubeconfigSecretRef"),
        "{refused}"
    );
    let own = json!({"spec": {"failover": {"standby": {"namespace": ns}}}});
    drills
        .patch("standby", &PatchParams::default(), &Patch::Merge(&own))
        .await?;
    standby("StandbyReady").await?;
    Ok(())
}

#[tokio::test]
async fn a_watch_the_role_refuses_is_logged_counted_and_fails_readyz() -> anyhow::Result<()> {
    let client = setup().await?;
    let ns = TestNamespace::create(&client, "fs-refused").await?;
    let kubeconfig = install(&client, &ns.name, |role| {
        without_list_and_watch(role, "chaosdrills")
    })
    .await?;
    let operator = Operator::start_with_env(
        &ns.name,
        "refused",
        &[],
        &[("KUBECONFIG", &kubeconfig.env())],
    )?;
    operator.until_leads().await?;

    let series = r#"flashsale_operator_watch_errors_total{controller="chaosdrill"}"#;
    poll_until("the refused watch counted", WAIT, TICK, || async {
        let metrics = operator.metrics().await.map_err(|e| e.to_string())?;
        match sample(&metrics, series) {
            n if n > 0.0 => Ok(()),
            _ => Err(metrics),
        }
    })
    .await?;
    let (code, checks) = readyz(&operator).await?;
    assert_eq!(code, 503, "{checks}");
    let why = checks["watch/chaosdrill"].as_str().unwrap_or_default();
    assert!(why.contains("chaosdrill controller"), "{why}");
    assert!(
        why.contains("chaosdrills") && why.contains("forbidden"),
        "{why}"
    );
    assert_eq!(checks["watch/flashsale"], "ok", "{checks}");
    assert_eq!(checks["watch/degradationpolicy"], "ok", "{checks}");
    let log = std::fs::read_to_string(&operator.log)?;
    assert!(
        log.lines()
            .any(|l| l.contains("WARN") && l.contains("watch failed") && l.contains("chaosdrill")),
        "no warning in the log:\n{log}"
    );

    // The other controllers are not held up.
    create_sale(&client, &ns.name, "refused").await?;
    until_sale_ready(&client, &ns.name, "refused").await?;
    let metrics = operator.metrics().await?;
    assert_eq!(
        sample(
            &metrics,
            r#"flashsale_operator_watch_errors_total{controller="flashsale"}"#
        ),
        0.0
    );
    Ok(())
}
