//! A watch of a custom resource that survives objects the operator cannot
//! read.
//!
//! A typed watcher deserializes every object of its list into the Rust
//! type, and one object that does not fit fails the whole list: the
//! apiserver accepted it (its schema is looser than the type in places,
//! such as a `date-time` the apiserver's pattern lets through, or a status
//! an older operator wrote), and from then on no object of the kind is
//! reconciled. [`watch`] reads each object through kube's
//! [`DeserializeGuard`], so one that does not fit is kept apart instead of
//! failing the list, and through `serde_path_to_error`, so the error names
//! the field. An object that does not convert is left out, and said so: a
//! warning log naming it and the field, a Warning Event `InvalidObject` on
//! it, and `flashsale_operator_invalid_objects_total`.
//!
//! A left-out object is **absent** for the controller: a good version it
//! had before is removed from the store, so the controller does not act
//! on a spec its owner has since replaced (and no longer means). The object
//! is reconciled again as soon as an edit makes it readable. While absent,
//! nothing of it is written, its finalizer included: deleting it waits until
//! it is fixed or the finalizer is removed by hand. Each version is reported
//! once; a relist of the same version reports nothing new.

use std::{
    borrow::Cow,
    collections::{HashMap, HashSet},
    fmt::Debug,
    future,
};

use futures::{Stream, StreamExt};
use k8s_openapi::{
    NamespaceResourceScope, api::core::v1::ObjectReference,
    apimachinery::pkg::apis::meta::v1::ObjectMeta,
};
use kube::{
    Api, Client, Resource,
    core::DeserializeGuard,
    runtime::{
        WatchStreamExt,
        events::{Event, EventType, Recorder, Reporter},
        reflector::{self, ObjectRef, Store},
        watcher,
    },
};
use serde::{Deserialize, Deserializer, de::DeserializeOwned, de::Error as _};

use flashsale_api::reasons::ErrorReason;

use super::{Context, Identity, health::truncate};
use crate::{leader::Leadership, metrics::OperatorMetrics};

/// The longest Event note the apiserver takes is 1 kB.
const MAX_NOTE_LEN: usize = 1000;

/// Where a guarded watch reports the objects it leaves out: its
/// controller's name (the metric's label and the log field), an Event
/// recorder under the controller's field manager, and the leadership, so a
/// replica that does not lead publishes no Event.
#[derive(Clone)]
pub struct Rejections {
    controller: &'static str,
    recorder: Recorder,
    metrics: OperatorMetrics,
    leadership: Leadership,
}

impl Rejections {
    /// Reports for controller `id`.
    pub fn new(
        client: Client,
        id: Identity,
        metrics: OperatorMetrics,
        leadership: Leadership,
    ) -> Self {
        let reporter = Reporter {
            controller: id.field_manager.to_owned(),
            instance: None,
        };
        Self {
            controller: id.name,
            recorder: Recorder::new(client, reporter),
            metrics,
            leadership,
        }
    }

    /// Reports for the controller of `ctx`.
    pub fn of<S>(ctx: &Context<S>) -> Self {
        Self::new(
            ctx.client.clone(),
            ctx.id,
            ctx.metrics.clone(),
            ctx.leadership.clone(),
        )
    }

    /// Logs, counts and publishes one object left out.
    fn report(&self, reference: ObjectReference, error: &str) {
        let kind = reference.kind.clone().unwrap_or_default();
        let key = format!(
            "{}/{}",
            reference.namespace.as_deref().unwrap_or_default(),
            reference.name.as_deref().unwrap_or_default()
        );
        tracing::warn!(
            controller = self.controller,
            kind,
            object = key,
            error,
            "object does not match the operator's type: left out until an edit fixes it"
        );
        self.metrics.invalid_object(self.controller);
        if !self.leadership.is_leader() {
            return;
        }
        let mut note = format!(
            "{kind} {key} cannot be read by the operator, which leaves it out until it is fixed: {error}"
        );
        truncate(&mut note, MAX_NOTE_LEN);
        let event = Event {
            type_: EventType::Warning,
            reason: ErrorReason::InvalidObject.as_str().to_owned(),
            note: Some(note),
            action: "Read".to_owned(),
            secondary: None,
        };
        let recorder = self.recorder.clone();
        // Best effort and off the watch's path: a slow Event must not hold
        // up every other object's.
        tokio::spawn(async move {
            if let Err(err) = recorder.publish(&event, &reference).await {
                tracing::warn!(object = key, %err, "publishing an InvalidObject Event failed");
            }
        });
    }
}

/// `K`, deserialized so that a failure names the field it failed at
/// (`spec.override.expires: …`).
#[derive(Debug, Clone)]
pub struct Located<K>(pub K);

impl<'de, K: Deserialize<'de>> Deserialize<'de> for Located<K> {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        serde_path_to_error::deserialize(deserializer)
            .map(Located)
            .map_err(|err| {
                let path = err.path().to_string();
                let inner = err.into_inner();
                // The root's path is "."; a message there needs no prefix.
                if path == "." {
                    inner
                } else {
                    D::Error::custom(format!("{path}: {inner}"))
                }
            })
    }
}

impl<K: Resource> Resource for Located<K> {
    type DynamicType = K::DynamicType;
    type Scope = K::Scope;

    fn kind(dt: &Self::DynamicType) -> Cow<'_, str> {
        K::kind(dt)
    }

    fn group(dt: &Self::DynamicType) -> Cow<'_, str> {
        K::group(dt)
    }

    fn version(dt: &Self::DynamicType) -> Cow<'_, str> {
        K::version(dt)
    }

    fn plural(dt: &Self::DynamicType) -> Cow<'_, str> {
        K::plural(dt)
    }

    fn meta(&self) -> &ObjectMeta {
        self.0.meta()
    }

    fn meta_mut(&mut self) -> &mut ObjectMeta {
        self.0.meta_mut()
    }
}

/// An object as the watch reads it: `K`, or why it is not one.
pub type Guarded<K> = DeserializeGuard<Located<K>>;

/// `value` as `K`, or why not, naming the field: what [`watch`] does with
/// each object it reads.
pub fn parse<K>(value: serde_json::Value) -> Result<K, String>
where
    K: Resource + DeserializeOwned,
{
    match serde_json::from_value::<Guarded<K>>(value) {
        Ok(DeserializeGuard(Ok(Located(typed)))) => Ok(typed),
        Ok(DeserializeGuard(Err(invalid))) => Err(invalid.error),
        Err(err) => Err(err.to_string()),
    }
}

/// Watches the objects of `K` in `namespace` (all namespaces when `None`),
/// each through [`Guarded`], and leaves out (and reports through
/// `rejections`) those that are not a `K`. Returns what
/// [`kube::runtime::Controller::for_stream`] takes: the store of the
/// objects that converted and the stream that fills it and triggers
/// reconciles (the controller's trigger backoff paces its retries).
///
/// ```no_run
/// use std::sync::Arc;
///
/// use flashsale_api::DegradationPolicy;
/// use flashsale_kit::{self as kit, Context, guarded};
/// use kube::runtime::{Controller, controller::Action, watcher};
///
/// async fn run(ctx: Arc<Context<()>>, namespace: Option<&str>) {
///     let (reader, trigger) = guarded::watch::<DegradationPolicy>(
///         ctx.client.clone(),
///         namespace,
///         watcher::Config::default().any_semantic(),
///         guarded::Rejections::of(&ctx),
///     );
///     let reconcile = |_policy: Arc<DegradationPolicy>, _ctx: Arc<Context<()>>| async {
///         Ok::<_, kit::Error>(Action::await_change())
///     };
///     let results =
///         Controller::for_stream(trigger, reader).run(reconcile, kit::error_policy, ctx.clone());
///     kit::report(ctx.id, results).await;
/// }
/// ```
pub fn watch<K>(
    client: Client,
    namespace: Option<&str>,
    config: watcher::Config,
    rejections: Rejections,
) -> (
    Store<K>,
    impl Stream<Item = Result<K, watcher::Error>> + Send + 'static,
)
where
    K: Resource<DynamicType = (), Scope = NamespaceResourceScope>
        + Clone
        + Debug
        + DeserializeOwned
        + Send
        + Sync
        + 'static,
{
    let api: Api<Guarded<K>> = match namespace {
        Some(ns) => Api::namespaced(client, ns),
        None => Api::all(client),
    };
    let (reader, writer) = reflector::store::<K>();
    let mut sorter = Sorter {
        store: reader.clone(),
        rejections,
        rejected: HashMap::new(),
        listed: None,
    };
    let trigger = watcher(api, config)
        .filter_map(move |event| {
            future::ready(match event {
                Ok(event) => sorter.sort(event).map(Ok),
                Err(err) => Some(Err(err)),
            })
        })
        .reflect(writer)
        .applied_objects();
    (reader, trigger)
}

/// Turns the watch's events of guarded objects into events of `K`.
struct Sorter<K: Resource<DynamicType = ()> + 'static> {
    /// What the controller sees, to find the good version an object had.
    store: Store<K>,
    rejections: Rejections,
    /// Objects left out, with the resource version last reported.
    rejected: HashMap<ObjectRef<K>, Option<String>>,
    /// Objects of the list in progress, to forget the rejections of objects
    /// deleted while the watch was down.
    listed: Option<HashSet<ObjectRef<K>>>,
}

impl<K> Sorter<K>
where
    K: Resource<DynamicType = ()> + Clone + 'static,
{
    fn sort(&mut self, event: watcher::Event<Guarded<K>>) -> Option<watcher::Event<K>> {
        use watcher::Event as E;
        match event {
            E::Init => {
                self.listed = Some(HashSet::new());
                Some(E::Init)
            }
            E::InitApply(object) => {
                let key = key_of(&object);
                if let Some(listed) = &mut self.listed {
                    listed.insert(key.clone());
                }
                // Left out of the new list: absent once it is swapped in.
                self.accept(key, object).map(E::InitApply)
            }
            E::InitDone => {
                if let Some(listed) = self.listed.take() {
                    self.rejected.retain(|key, _| listed.contains(key));
                }
                Some(E::InitDone)
            }
            E::Apply(object) => {
                let key = key_of(&object);
                match self.accept(key.clone(), object) {
                    Some(typed) => Some(E::Apply(typed)),
                    // A good version seen before goes: the controller must
                    // not keep acting on a spec that was replaced.
                    None => self.store.get(&key).map(|old| E::Delete((*old).clone())),
                }
            }
            E::Delete(object) => {
                let key = key_of(&object);
                self.rejected.remove(&key);
                match object.0 {
                    Ok(Located(typed)) => Some(E::Delete(typed)),
                    Err(_) => self.store.get(&key).map(|old| E::Delete((*old).clone())),
                }
            }
        }
    }

    /// `object` as `K`, or `None` after reporting why not (once per
    /// version).
    fn accept(&mut self, key: ObjectRef<K>, object: Guarded<K>) -> Option<K> {
        match object.0 {
            Ok(Located(typed)) => {
                self.rejected.remove(&key);
                Some(typed)
            }
            Err(invalid) => {
                let version = invalid.metadata.resource_version.clone();
                if self.rejected.get(&key) != Some(&version) {
                    self.rejected.insert(key, version);
                    self.rejections
                        .report(reference_of::<K>(&invalid.metadata), &invalid.error);
                }
                None
            }
        }
    }
}

/// The store's key of `object`.
fn key_of<K: Resource<DynamicType = ()>>(object: &Guarded<K>) -> ObjectRef<K> {
    let meta = object.meta();
    let name = meta.name.as_deref().unwrap_or_default();
    match meta.namespace.as_deref() {
        Some(ns) => ObjectRef::new(name).within(ns),
        None => ObjectRef::new(name),
    }
}

/// What an Event about the object of `metadata` refers to, as `K`'s kind.
fn reference_of<K: Resource<DynamicType = ()>>(metadata: &ObjectMeta) -> ObjectReference {
    ObjectReference {
        api_version: Some(K::api_version(&()).into_owned()),
        kind: Some(K::kind(&()).into_owned()),
        name: metadata.name.clone(),
        namespace: metadata.namespace.clone(),
        uid: metadata.uid.clone(),
        resource_version: metadata.resource_version.clone(),
        field_path: None,
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;
    use flashsale_api::{DegradationPolicy, FlashSale};

    fn policy_value(expires: &str) -> serde_json::Value {
        json!({
            "apiVersion": "flashsale.dev/v1alpha1",
            "kind": "DegradationPolicy",
            "metadata": {"name": "p", "namespace": "ns", "resourceVersion": "7"},
            "spec": {
                "saleRef": {"name": "d11"},
                "signal": {"query": "vector(1)"},
                "tiers": [{"tier": 1, "enterAbove": 0.5, "exitBelow": 0.4,
                           "switches": {"recommendations": "static"}}],
                "override": {"tier": 1, "reason": "drill", "expires": expires}
            }
        })
    }

    fn policy(expires: &str) -> Guarded<DegradationPolicy> {
        serde_json::from_value(policy_value(expires)).unwrap_or_else(|err| panic!("{err}"))
    }

    #[test]
    fn a_good_object_converts() {
        let typed = parse::<DegradationPolicy>(policy_value("2026-12-02T10:00:00Z"));
        assert!(typed.is_ok(), "{typed:?}");
    }

    #[test]
    fn a_date_time_the_apiserver_takes_but_rfc_3339_does_not_names_its_field() {
        // The apiserver's date-time pattern has an unescaped `.` before the
        // fraction, so it takes `_5` there.
        let err = parse::<DegradationPolicy>(policy_value("2026-12-02T10:00:00_5Z"))
            .err()
            .unwrap_or_default();
        assert!(err.starts_with("spec.override.expires: "), "{err}");
        assert!(!err.contains(" at line "), "{err}");
    }

    #[test]
    fn a_missing_field_names_the_object_that_lacks_it() {
        let mut value = policy_value("2026-12-02T10:00:00Z");
        if let Some(spec) = value.get_mut("spec").and_then(|s| s.as_object_mut()) {
            spec.remove("saleRef");
        }
        let err = parse::<DegradationPolicy>(value).err().unwrap_or_default();
        // The words are serde-value's (kube's guard reads through it); the
        // path and the field are what a reader needs.
        assert!(err.starts_with("spec: "), "{err}");
        assert!(
            err.to_lowercase().contains("missing field") && err.contains("saleRef"),
            "{err}"
        );
    }

    #[test]
    fn a_status_an_other_version_wrote_is_named_in_an_array() {
        let sale = json!({
            "apiVersion": "flashsale.dev/v1alpha1",
            "kind": "FlashSale",
            "metadata": {"name": "s", "namespace": "ns"},
            "spec": flashsale_e2e::sales::warming_up("s")["spec"].clone(),
            "status": {"items": [
                {"sku": "PHONE", "available": 1, "reserved": 0, "sold": 0},
                {"sku": "CASE", "available": "many", "reserved": 0, "sold": 0}
            ]}
        });
        let err = parse::<FlashSale>(sale).err().unwrap_or_default();
        assert!(err.starts_with("status.items[1].available: "), "{err}");
    }

    #[test]
    fn an_object_whose_metadata_is_readable_is_kept_apart_not_failed() {
        let guarded = policy("2026-12-02T10:00:00_5Z");
        assert_eq!(guarded.meta().name.as_deref(), Some("p"));
        assert!(guarded.0.is_err());
    }

    fn sorter() -> (
        Sorter<DegradationPolicy>,
        reflector::store::Writer<DegradationPolicy>,
    ) {
        let (reader, writer) = reflector::store::<DegradationPolicy>();
        // Never reached: the Events of these tests fail at once, off the
        // test's path.
        let client = Client::try_from(kube::Config::new(
            "http://127.0.0.1:9".parse().unwrap_or_default(),
        ))
        .unwrap_or_else(|err| panic!("{err}"));
        let sorter = Sorter {
            store: reader,
            rejections: Rejections {
                controller: "degradationpolicy",
                recorder: Recorder::new(client, Reporter::from("test")),
                metrics: OperatorMetrics::default(),
                leadership: Leadership::always(),
            },
            rejected: HashMap::new(),
            listed: None,
        };
        (sorter, writer)
    }

    #[tokio::test]
    async fn a_bad_object_is_absent_and_reported_once_per_version() {
        use watcher::Event as E;
        let (mut sorter, mut writer) = sorter();
        let mut sort = |event| {
            let sorted = sorter.sort(event);
            if let Some(sorted) = &sorted {
                writer.apply_watcher_event(sorted);
            }
            (sorted, sorter.rejected.len(), sorter.store.state().len())
        };
        let bad = policy("2026-12-02T10:00:00_5Z");
        let good = policy("2026-12-02T10:00:00Z");
        assert!(matches!(sort(E::Init), (Some(E::Init), 0, 0)));
        assert!(matches!(sort(E::InitApply(bad.clone())), (None, 1, 0)));
        assert!(matches!(sort(E::InitDone), (Some(E::InitDone), 1, 0)));
        // The same version again is not reported again.
        assert!(matches!(sort(E::Apply(bad.clone())), (None, 1, 0)));
        // Fixed: it is in, and its rejection forgotten.
        assert!(matches!(sort(E::Apply(good)), (Some(E::Apply(_)), 0, 1)));
        // Broken again: the good version it had goes from the store.
        let mut worse = bad.clone();
        worse.meta_mut().resource_version = Some("8".into());
        assert!(matches!(
            sort(E::Apply(worse.clone())),
            (Some(E::Delete(_)), 1, 0)
        ));
        // Deleted while broken: nothing left of it.
        assert!(matches!(sort(E::Delete(worse)), (None, 0, 0)));
        // A relist forgets rejections of objects that went meanwhile.
        assert!(matches!(sort(E::Apply(bad.clone())), (None, 1, 0)));
        assert!(matches!(sort(E::Init), (Some(E::Init), 1, 0)));
        assert!(matches!(sort(E::InitDone), (Some(E::InitDone), 0, 0)));
    }
}
