//! A watch of a custom resource that survives objects the operator cannot
//! read.
//!
//! A typed watcher deserializes every object of its list into the Rust
//! type, and one object that does not fit fails the whole list: the
//! apiserver accepted it (its schema is looser than the type in places,
//! such as a `date-time` the apiserver's pattern lets through, or a status
//! an older operator wrote), and from then on no object of the kind is
//! reconciled. [`watch`] reads the objects as [`DynamicObject`]s instead and
//! converts each one on its own. An object that does not convert is left
//! out, and said so: a warning log naming it and the field, a Warning Event
//! `InvalidObject` on it, and `flashsale_operator_invalid_objects_total`.
//!
//! A left-out object is **absent** for the controller: a good version it
//! had before is removed from the store, so the controller does not act
//! on a spec its owner has since replaced (and no longer means). The object
//! is reconciled again as soon as an edit makes it readable. While absent,
//! nothing of it is written, its finalizer included: deleting it waits until
//! it is fixed or the finalizer is removed by hand. Each version is reported
//! once; a relist of the same version reports nothing new.

use std::{
    collections::{HashMap, HashSet},
    fmt::Debug,
    future,
};

use futures::{Stream, StreamExt};
use k8s_openapi::api::core::v1::ObjectReference;
use kube::{
    Api, Client, Resource,
    api::{ApiResource, DynamicObject},
    runtime::{
        WatchStreamExt,
        events::{Event, EventType, Recorder, Reporter},
        reflector::{self, ObjectRef, Store},
        watcher,
    },
};
use serde::de::DeserializeOwned;

use super::{Context, Identity, health::truncate};
use crate::{leader::Leadership, metrics::OperatorMetrics};

/// The reason of the Warning Event on an object left out.
pub const INVALID_OBJECT: &str = "InvalidObject";

/// The longest Event note the apiserver takes is 1 kB.
const MAX_NOTE_LEN: usize = 1000;

/// Where a lenient watch reports the objects it leaves out: its
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
            reason: INVALID_OBJECT.to_owned(),
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

/// Watches the objects of `K` in `namespace` (all namespaces when `None`)
/// as [`DynamicObject`]s, converts each to `K`, and leaves out (and
/// reports through `rejections`) those that do not convert. Returns what
/// [`kube::runtime::Controller::for_stream`] takes: the store of the
/// objects that converted and the stream that fills it and triggers
/// reconciles (the controller's trigger backoff paces its retries).
///
/// ```no_run
/// use std::sync::Arc;
///
/// use flashsale_operator::{
///     api::DegradationPolicy,
///     degradation::{Ctx, reconcile},
///     kit::{self, lenient},
/// };
/// use kube::runtime::{Controller, watcher};
///
/// async fn run(ctx: Arc<Ctx>, namespace: Option<&str>) {
///     let (reader, trigger) = lenient::watch::<DegradationPolicy>(
///         ctx.client.clone(),
///         namespace,
///         watcher::Config::default().any_semantic(),
///         lenient::Rejections::of(&ctx),
///     );
///     let results = Controller::for_stream(trigger, reader)
///         .run(reconcile::reconcile, kit::error_policy, ctx);
///     kit::report(reconcile::IDENTITY, results).await;
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
    K: Resource<DynamicType = ()> + Clone + Debug + DeserializeOwned + Send + Sync + 'static,
{
    let resource = ApiResource::erase::<K>(&());
    let api: Api<DynamicObject> = match namespace {
        Some(ns) => Api::namespaced_with(client, ns, &resource),
        None => Api::all_with(client, &resource),
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

/// Turns the watch's events of dynamic objects into events of `K`.
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
    K: Resource<DynamicType = ()> + Clone + DeserializeOwned + 'static,
{
    fn sort(&mut self, event: watcher::Event<DynamicObject>) -> Option<watcher::Event<K>> {
        use watcher::Event as E;
        match event {
            E::Init => {
                self.listed = Some(HashSet::new());
                Some(E::Init)
            }
            E::InitApply(object) => {
                let key = key_of::<K>(&object);
                if let Some(listed) = &mut self.listed {
                    listed.insert(key.clone());
                }
                // Left out of the new list: absent once it is swapped in.
                self.accept(key, &object).map(E::InitApply)
            }
            E::InitDone => {
                if let Some(listed) = self.listed.take() {
                    self.rejected.retain(|key, _| listed.contains(key));
                }
                Some(E::InitDone)
            }
            E::Apply(object) => {
                let key = key_of::<K>(&object);
                match self.accept(key.clone(), &object) {
                    Some(typed) => Some(E::Apply(typed)),
                    // A good version seen before goes: the controller must
                    // not keep acting on a spec that was replaced.
                    None => self.store.get(&key).map(|old| E::Delete((*old).clone())),
                }
            }
            E::Delete(object) => {
                let key = key_of::<K>(&object);
                self.rejected.remove(&key);
                match convert::<K>(&object) {
                    Ok(typed) => Some(E::Delete(typed)),
                    Err(_) => self.store.get(&key).map(|old| E::Delete((*old).clone())),
                }
            }
        }
    }

    /// `object` as `K`, or `None` after reporting why not (once per
    /// version).
    fn accept(&mut self, key: ObjectRef<K>, object: &DynamicObject) -> Option<K> {
        match convert::<K>(object) {
            Ok(typed) => {
                self.rejected.remove(&key);
                Some(typed)
            }
            Err(error) => {
                let version = object.metadata.resource_version.clone();
                if self.rejected.get(&key) != Some(&version) {
                    self.rejected.insert(key, version);
                    self.rejections.report(reference_of::<K>(object), &error);
                }
                None
            }
        }
    }
}

/// The store's key of `object`.
fn key_of<K: Resource<DynamicType = ()>>(object: &DynamicObject) -> ObjectRef<K> {
    let name = object.metadata.name.as_deref().unwrap_or_default();
    match object.metadata.namespace.as_deref() {
        Some(ns) => ObjectRef::new(name).within(ns),
        None => ObjectRef::new(name),
    }
}

/// What an Event about `object` refers to, as `K`'s kind.
fn reference_of<K: Resource<DynamicType = ()>>(object: &DynamicObject) -> ObjectReference {
    ObjectReference {
        api_version: Some(K::api_version(&()).into_owned()),
        kind: Some(K::kind(&()).into_owned()),
        name: object.metadata.name.clone(),
        namespace: object.metadata.namespace.clone(),
        uid: object.metadata.uid.clone(),
        resource_version: object.metadata.resource_version.clone(),
        field_path: None,
    }
}

/// `object` as `K`, or why not, naming the field (`spec.override.expires:
/// …`).
pub fn convert<K>(object: &DynamicObject) -> Result<K, String>
where
    K: Resource<DynamicType = ()> + DeserializeOwned,
{
    let mut value = serde_json::to_value(object).map_err(|err| err.to_string())?;
    if let Some(fields) = value.as_object_mut() {
        fields
            .entry("apiVersion")
            .or_insert_with(|| K::api_version(&()).into_owned().into());
        fields
            .entry("kind")
            .or_insert_with(|| K::kind(&()).into_owned().into());
    }
    match K::deserialize(&value) {
        Ok(typed) => Ok(typed),
        // Again from pretty-printed text, only to learn where it failed:
        // the error's line, in that layout, tells the field.
        Err(err) => {
            let pretty = serde_json::to_string_pretty(&value).map_err(|e| e.to_string())?;
            Err(match serde_json::from_str::<K>(&pretty) {
                Err(located) if located.line() > 0 => {
                    let text = located.to_string();
                    let message = text
                        .rsplit_once(" at line ")
                        .map_or(text.as_str(), |(message, _)| message);
                    match path_of_line(&pretty, located.line()) {
                        path if path.is_empty() => message.to_owned(),
                        path => format!("{path}: {message}"),
                    }
                }
                _ => err.to_string(),
            })
        }
    }
}

/// The path (`spec.items[1].sku`) of the member or element on line `line`
/// (from 1) of JSON pretty-printed by `serde_json`, which puts each member
/// and element on a line of its own; on a line that closes an object or an
/// array, the path of that object or array.
fn path_of_line(pretty: &str, line: usize) -> String {
    /// An open object or array: its segment in the path, and for an array
    /// the index of its next element.
    struct Open {
        segment: String,
        next: Option<usize>,
    }
    let mut open: Vec<Open> = Vec::new();
    let join = |open: &[Open], last: Option<&str>| {
        let mut path = String::new();
        for segment in open.iter().skip(1).map(|o| o.segment.as_str()).chain(last) {
            if !path.is_empty() && !segment.starts_with('[') {
                path.push('.');
            }
            path.push_str(segment);
        }
        path
    };
    for (number, text) in pretty.lines().enumerate().take(line) {
        let text = text.trim();
        let target = number + 1 == line;
        if text.starts_with('}') || text.starts_with(']') {
            if target {
                return join(&open, None);
            }
            open.pop();
            continue;
        }
        let (segment, rest) = match (member_key(text), open.last_mut()) {
            (Some((key, rest)), _) => (key, rest),
            (None, Some(Open { next: Some(i), .. })) => {
                let segment = format!("[{i}]");
                *i += 1;
                (segment, text)
            }
            (None, _) => (String::new(), text),
        };
        if target {
            return join(&open, Some(&segment));
        }
        let rest = rest.trim_end_matches(',');
        if rest.ends_with('{') || rest.ends_with('[') {
            open.push(Open {
                segment,
                next: rest.ends_with('[').then_some(0),
            });
        }
    }
    join(&open, None)
}

/// The key of a member line (`"key": value`) and the value's text.
fn member_key(line: &str) -> Option<(String, &str)> {
    let body = line.strip_prefix('"')?;
    let mut escaped = false;
    for (at, c) in body.char_indices() {
        match c {
            _ if escaped => escaped = false,
            '\\' => escaped = true,
            '"' => {
                let rest = body[at + 1..].strip_prefix(": ")?;
                let key = serde_json::from_str::<String>(&line[..at + 2]).ok()?;
                return Some((key, rest));
            }
            _ => {}
        }
    }
    None
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;
    use flashsale_api::{DegradationPolicy, FlashSale};

    fn dynamic(value: serde_json::Value) -> DynamicObject {
        serde_json::from_value(value).unwrap_or_else(|err| panic!("{err}"))
    }

    fn policy(expires: &str) -> DynamicObject {
        dynamic(json!({
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
        }))
    }

    #[test]
    fn a_good_object_converts() {
        let typed = convert::<DegradationPolicy>(&policy("2026-12-02T10:00:00Z"));
        assert!(typed.is_ok(), "{typed:?}");
    }

    #[test]
    fn a_date_time_the_apiserver_takes_but_rfc_3339_does_not_names_its_field() {
        // The apiserver's date-time pattern has an unescaped `.` before the
        // fraction, so it takes `_5` there.
        let err = convert::<DegradationPolicy>(&policy("2026-12-02T10:00:00_5Z"))
            .err()
            .unwrap_or_default();
        assert!(err.starts_with("spec.override.expires: "), "{err}");
        assert!(!err.contains(" at line "), "{err}");
    }

    #[test]
    fn a_missing_field_names_the_object_that_lacks_it() {
        let mut object = policy("2026-12-02T10:00:00Z");
        if let Some(spec) = object.data.get_mut("spec").and_then(|s| s.as_object_mut()) {
            spec.remove("saleRef");
        }
        let err = convert::<DegradationPolicy>(&object)
            .err()
            .unwrap_or_default();
        assert!(err.starts_with("spec: missing field `saleRef`"), "{err}");
    }

    #[test]
    fn a_status_an_other_version_wrote_is_named_in_an_array() {
        let sale = dynamic(json!({
            "apiVersion": "flashsale.dev/v1alpha1",
            "kind": "FlashSale",
            "metadata": {"name": "s", "namespace": "ns"},
            "spec": flashsale_spec(),
            "status": {"items": [
                {"sku": "PHONE", "available": 1, "reserved": 0, "sold": 0},
                {"sku": "CASE", "available": "many", "reserved": 0, "sold": 0}
            ]}
        }));
        let err = convert::<FlashSale>(&sale).err().unwrap_or_default();
        assert!(err.starts_with("status.items[1].available: "), "{err}");
    }

    fn flashsale_spec() -> serde_json::Value {
        flashsale_e2e::sales::warming_up("s")["spec"].clone()
    }

    #[test]
    fn paths_follow_members_elements_and_closing_lines() {
        let value = json!({"a": {"b": [1, {"c": "x\": y"}, [2, 3]], "d": {}}, "e": "f"});
        let pretty = serde_json::to_string_pretty(&value).unwrap_or_default();
        let lines: Vec<&str> = pretty.lines().collect();
        let paths: Vec<String> = (1..=lines.len())
            .map(|n| path_of_line(&pretty, n))
            .collect();
        let expected = [
            "",          // {
            "a",         // "a": {
            "a.b",       // "b": [
            "a.b[0]",    // 1,
            "a.b[1]",    // {
            "a.b[1].c",  // "c": "x\": y"
            "a.b[1]",    // },
            "a.b[2]",    // [
            "a.b[2][0]", // 2,
            "a.b[2][1]", // 3
            "a.b[2]",    // ]
            "a.b",       // ],
            "a.d",       // "d": {}
            "a",         // },
            "e",         // "e": "f"
            "",          // }
        ];
        assert_eq!(paths, expected, "{pretty}");
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
        worse.metadata.resource_version = Some("8".into());
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
