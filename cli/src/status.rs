//! `status`: every sale (or one) with its policies and drills, once or
//! redrawn on every change the apiserver reports.

use std::io::Write;

use futures::{StreamExt, future::join_all, stream::select_all};
use jiff::Timestamp;
use kube::{
    ResourceExt,
    runtime::{WatchStreamExt, watcher},
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
    let reports = gather(session, args, &http).await?;
    show(out, &reports, false)?;
    if !args.watch {
        return Ok(());
    }
    let mut last = reports;
    let mut changes = select_all([
        changes::<FlashSale>(session),
        changes::<DegradationPolicy>(session),
        changes::<ChaosDrill>(session),
    ]);
    while changes.next().await.is_some() {
        let reports = gather(session, args, &http).await?;
        // A status write that changes nothing shown is not a change.
        if reports != last {
            show(out, &reports, true)?;
            last = reports;
        }
    }
    Ok(())
}

/// Every change to objects of kind `K` in the session's namespaces, as a
/// unit each.
fn changes<K>(session: &Session) -> futures::stream::BoxStream<'static, ()>
where
    K: kube::Resource<Scope = k8s_openapi::NamespaceResourceScope>
        + Clone
        + serde::de::DeserializeOwned
        + std::fmt::Debug
        + Send
        + 'static,
    K::DynamicType: Default,
{
    watcher(session.listing::<K>(), watcher::Config::default())
        .default_backoff()
        .touched_objects()
        .filter_map(|event| async move { event.ok().map(|_| ()) })
        .boxed()
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
    let url = args.prometheus_url.as_deref();
    let funnels = join_all(sales.iter().map(|sale| {
        let namespace = sale.namespace().unwrap_or_default();
        let name = sale.name_any();
        async move { funnel::read(http, url, &namespace, &name).await }
    }))
    .await;
    Ok(sales
        .iter()
        .zip(funnels)
        .map(|(sale, funnel)| report::sale(sale, &policies, &drills, funnel))
        .collect())
}
