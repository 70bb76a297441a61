//! `status`: every sale (or one) with its policies and drills, once or
//! redrawn on every change the apiserver reports (from watched copies of
//! the objects, so a change costs no list).

use std::io::Write;

use futures::{FutureExt, StreamExt, future::join_all, stream::select_all};
use jiff::Timestamp;
use kube::{
    ResourceExt,
    runtime::{
        WatchStreamExt,
        reflector::{self, Store, store::Writer},
        watcher,
    },
};

use flashsale_api::{ChaosDrill, DegradationPolicy, FlashSale};

use crate::{
    args::StatusArgs,
    failure::Failure,
    funnel,
    output::Out,
    render,
    report::{self, SaleReport},
    session::{DRILLS, POLICIES, SALES, Session},
};

/// Prints the status once, or on every change with `--watch`.
pub async fn run<O: Write>(
    session: &mut Session,
    args: &StatusArgs,
    out: &mut Out<O>,
) -> Result<(), Failure> {
    let http = reqwest::Client::new();
    let first = gather(session, args, &http).await?;
    show(out, &first, false)?;
    if !args.watch {
        return Ok(());
    }
    // The watches keep a copy of every object, so a change costs no list.
    let (sales, sales_copy) = reflector::store::<FlashSale>();
    let (policies, policies_copy) = reflector::store::<DegradationPolicy>();
    let (drills, drills_copy) = reflector::store::<ChaosDrill>();
    let mut changes = select_all([
        mirrored(session, sales_copy),
        mirrored(session, policies_copy),
        mirrored(session, drills_copy),
    ]);
    let mut last = first;
    while changes.next().await.is_some() {
        // Until every copy holds its first list, a report would miss objects.
        let listed = [
            sales.wait_until_ready().now_or_never(),
            policies.wait_until_ready().now_or_never(),
            drills.wait_until_ready().now_or_never(),
        ];
        if listed.iter().any(Option::is_none) {
            continue;
        }
        let shown = copies(&sales).into_iter().filter(|sale| {
            args.sale.as_ref().is_none_or(|name| {
                &sale.name_any() == name && sale.namespace().as_ref() == Some(&session.namespace)
            })
        });
        let shown: Vec<FlashSale> = shown.collect();
        let reports = build(&shown, &copies(&policies), &copies(&drills), args, &http).await;
        // A status write that changes nothing shown is not a change.
        if reports != last {
            show(out, &reports, true)?;
            last = reports;
        }
    }
    Ok(())
}

/// Every change to objects of kind `K` in the session's namespaces, as a
/// unit each, once `copy` holds it.
fn mirrored<K>(session: &Session, copy: Writer<K>) -> futures::stream::BoxStream<'static, ()>
where
    K: kube::Resource<Scope = k8s_openapi::NamespaceResourceScope>
        + Clone
        + serde::de::DeserializeOwned
        + std::fmt::Debug
        + Send
        + Sync
        + 'static,
    K::DynamicType: Default + Eq + std::hash::Hash + Clone,
{
    watcher(session.listing::<K>(), watcher::Config::default())
        .default_backoff()
        .reflect(copy)
        .touched_objects()
        .filter_map(|event| async move { event.ok().map(|_| ()) })
        .boxed()
}

/// The objects of `store`, by namespace and name, as a list would give them.
fn copies<K>(store: &Store<K>) -> Vec<K>
where
    K: kube::Resource + Clone + 'static,
    K::DynamicType: Eq + std::hash::Hash + Clone,
{
    let mut objects: Vec<K> = store.state().iter().map(|o| K::clone(o)).collect();
    objects.sort_by_key(|o| (o.namespace(), o.name_any()));
    objects
}

fn show<O: Write>(out: &mut Out<O>, reports: &[SaleReport], again: bool) -> Result<(), Failure> {
    let now = Timestamp::now();
    if !out.is_text() {
        return out.emit(&reports, "");
    }
    let style = out.style();
    let text = render::sales(reports, now, style);
    let frame = match (again, style.colours()) {
        // A terminal: the new frame replaces the old one.
        (true, true) => format!("\x1b[H\x1b[2J{text}"),
        (true, false) => format!("\n--- {}\n{text}", render::clock(now)),
        (false, _) => text,
    };
    out.raw(frame.as_bytes())
}

async fn gather(
    session: &Session,
    args: &StatusArgs,
    http: &reqwest::Client,
) -> Result<Vec<SaleReport>, Failure> {
    let all = session.all_namespaces;
    let sales: Vec<FlashSale> = match &args.sale {
        Some(name) => vec![session.get(SALES, name).await?],
        None => session.list(SALES, all).await?,
    };
    let policies: Vec<DegradationPolicy> = session.list(POLICIES, all).await?;
    let drills: Vec<ChaosDrill> = session.list(DRILLS, all).await?;
    Ok(build(&sales, &policies, &drills, args, http).await)
}

/// The reports of `sales`, each with its funnel from Prometheus.
async fn build(
    sales: &[FlashSale],
    policies: &[DegradationPolicy],
    drills: &[ChaosDrill],
    args: &StatusArgs,
    http: &reqwest::Client,
) -> Vec<SaleReport> {
    let url = args.prometheus_url.as_deref();
    let funnels = join_all(sales.iter().map(|sale| {
        let namespace = sale.namespace().unwrap_or_default();
        let name = sale.name_any();
        async move { funnel::read(http, url, &namespace, &name).await }
    }))
    .await;
    sales
        .iter()
        .zip(funnels)
        .map(|(sale, funnel)| report::sale(sale, policies, drills, funnel))
        .collect()
}
