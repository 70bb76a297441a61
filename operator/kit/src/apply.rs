//! Writing to the apiserver: server-side apply under the controller's field manager, and
//! the few other writes a controller needs. Every write first checks the
//! leadership, so a replica that lost the lease stops writing at once, even
//! in the middle of a reconcile.

use std::fmt::Debug;

use k8s_openapi::NamespaceResourceScope;
use kube::{
    Api, Resource, ResourceExt,
    api::{DeleteParams, GetParams, Patch, PatchParams, PostParams, Preconditions},
};
use serde::{Serialize, de::DeserializeOwned};

use flashsale_api::{
    ChaosDrill, ChaosDrillStatus, DegradationPolicy, DegradationPolicyStatus, FlashSale,
    FlashSaleStatus,
};

use crate::{ChildKey, Context, Error, Verb, ledger::desired_hash};

/// A namespaced built-in or custom kind the controllers write.
pub trait Namespaced:
    Resource<DynamicType = (), Scope = NamespaceResourceScope>
    + Clone
    + Debug
    + Serialize
    + DeserializeOwned
    + Send
    + Sync
    + 'static
{
}

impl<K> Namespaced for K where
    K: Resource<DynamicType = (), Scope = NamespaceResourceScope>
        + Clone
        + Debug
        + Serialize
        + DeserializeOwned
        + Send
        + Sync
        + 'static
{
}

fn kube_error<K: Resource<DynamicType = ()>>(
    verb: Verb,
    name: &str,
) -> impl FnOnce(kube::Error) -> Error {
    Error::kube(verb, kind_of::<K>(), name)
}

/// The kind of `K` as a static string, for logs, errors and ledger keys.
pub fn kind_of<K: Resource<DynamicType = ()>>() -> &'static str {
    // `K::kind` is a Cow borrowed from a static for every typed kind.
    match K::kind(&()) {
        std::borrow::Cow::Borrowed(kind) => kind,
        std::borrow::Cow::Owned(_) => "object",
    }
}

/// The object's `Api`, namespace and name.
fn api_for<K: Namespaced, S>(
    ctx: &Context<S>,
    object: &K,
) -> Result<(Api<K>, String, String), Error> {
    let namespace = object
        .namespace()
        .ok_or(Error::MissingMetadata("metadata.namespace"))?;
    let name = object
        .meta()
        .name
        .clone()
        .ok_or(Error::MissingMetadata("metadata.name"))?;
    Ok((
        Api::namespaced(ctx.client.clone(), &namespace),
        namespace,
        name,
    ))
}

/// Counts a write of the controller and logs it at debug level under the
/// `flashsale_operator::writes` target, so `--log-filter
/// warn,flashsale_operator::writes=debug` lists every request that changed
/// (or could change) the cluster, object by object.
pub fn wrote<S>(ctx: &Context<S>, verb: Verb, kind: &str, namespace: &str, name: &str) {
    ctx.metrics.wrote(ctx.id.name);
    tracing::debug!(
        target: "flashsale_operator::writes",
        controller = ctx.id.name,
        verb = verb.as_str(),
        kind,
        object = %format_args!("{namespace}/{name}"),
        "wrote"
    );
}

fn must_lead<S>(ctx: &Context<S>) -> Result<(), Error> {
    if ctx.leadership.is_leader() {
        Ok(())
    } else {
        Err(Error::NotLeader)
    }
}

/// Server-side applies `object` (forcing ownership of its fields, so a hand
/// edit of a field the operator sets is reverted) and returns what the
/// apiserver holds afterwards, status included.
pub async fn apply<K: Namespaced, S>(ctx: &Context<S>, object: &K) -> Result<K, Error> {
    must_lead(ctx)?;
    let (api, namespace, name) = api_for(ctx, object)?;
    let params = PatchParams::apply(ctx.id.field_manager).force();
    let applied = api
        .patch(&name, &params, &Patch::Apply(object))
        .await
        .map_err(kube_error::<K>(Verb::Apply, &name))?;
    wrote(ctx, Verb::Apply, kind_of::<K>(), &namespace, &name);
    Ok(applied)
}

/// The ledger key of `object`.
pub fn child_key<K: Namespaced>(object: &K) -> Result<ChildKey, Error> {
    Ok(ChildKey {
        kind: kind_of::<K>(),
        namespace: object
            .namespace()
            .ok_or(Error::MissingMetadata("metadata.namespace"))?,
        name: object
            .meta()
            .name
            .clone()
            .ok_or(Error::MissingMetadata("metadata.name"))?,
    })
}

/// Applies the child `object` of `owner` unless the ledger shows the child
/// already as `object` would leave it; returns what the apiserver holds
/// after an apply, `None` when nothing was written.
pub async fn apply_changed<K: Namespaced, S>(
    ctx: &Context<S>,
    owner: &str,
    object: &K,
) -> Result<Option<K>, Error> {
    let key = child_key(object)?;
    let desired = desired_hash(object);
    if ctx.ledger.is_current(&key, desired) {
        return Ok(None);
    }
    let applied = apply(ctx, object).await?;
    ctx.ledger.applied(key, owner, desired, applied.meta());
    Ok(Some(applied))
}

/// Refuses to write over an object of `object`'s name that the owner of
/// uid `owner_uid` does not control: forced server-side apply would take
/// over whatever is there. Asks the apiserver (its watch cache) only about
/// children the controller's watches do not show, since those carry the
/// controller's labels and were made by it.
pub async fn refuse_foreign<K: Namespaced, S>(
    ctx: &Context<S>,
    owner_uid: &str,
    object: &K,
) -> Result<(), Error> {
    let key = child_key(object)?;
    if ctx.ledger.is_watched(&key) {
        return Ok(());
    }
    let api: Api<K> = Api::namespaced(ctx.client.clone(), &key.namespace);
    let found = api
        .get_metadata_opt_with(&key.name, &GetParams::any())
        .await
        .map_err(kube_error::<K>(Verb::Read, &key.name))?;
    match found {
        Some(meta) if !controlled_by(&meta, owner_uid) => Err(Error::NotOwned {
            kind: key.kind,
            namespace: key.namespace,
            name: key.name,
        }),
        _ => Ok(()),
    }
}

/// Whether `object` names `owner_uid` as its controller.
pub fn controlled_by<K: Resource>(object: &K, owner_uid: &str) -> bool {
    object
        .owner_references()
        .iter()
        .any(|o| o.controller == Some(true) && o.uid == owner_uid)
}

/// Creates `object` and returns it as created; `None` when an object of its
/// name exists already (created in between by someone else).
pub async fn create<K: Namespaced, S>(ctx: &Context<S>, object: &K) -> Result<Option<K>, Error> {
    must_lead(ctx)?;
    let (api, namespace, name) = api_for(ctx, object)?;
    match api.create(&PostParams::default(), object).await {
        Ok(created) => {
            wrote(ctx, Verb::Create, kind_of::<K>(), &namespace, &name);
            Ok(Some(created))
        }
        Err(kube::Error::Api(status)) if status.code == 409 => Ok(None),
        Err(err) => Err(kube_error::<K>(Verb::Create, &name)(err)),
    }
}

/// Deletes the object `name` if it exists and `owner_uid` controls it; an
/// object of that name someone else made is left alone. Returns whether it
/// deleted.
pub async fn delete_owned<K: Namespaced, S>(
    ctx: &Context<S>,
    namespace: &str,
    name: &str,
    owner_uid: &str,
) -> Result<bool, Error> {
    let api: Api<K> = Api::namespaced(ctx.client.clone(), namespace);
    let Some(meta) = api
        .get_metadata_opt(name)
        .await
        .map_err(kube_error::<K>(Verb::Read, name))?
    else {
        return Ok(false);
    };
    if !controlled_by(&meta, owner_uid) {
        return Ok(false);
    }
    must_lead(ctx)?;
    // The precondition makes sure it is the object just inspected.
    let params = DeleteParams {
        preconditions: Some(Preconditions {
            uid: meta.uid(),
            resource_version: None,
        }),
        ..DeleteParams::background()
    };
    match api.delete(name, &params).await {
        Ok(_) => {
            wrote(ctx, Verb::Delete, kind_of::<K>(), namespace, name);
            Ok(true)
        }
        Err(kube::Error::Api(status)) if status.code == 404 || status.code == 409 => Ok(false),
        Err(err) => Err(kube_error::<K>(Verb::Delete, name)(err)),
    }
}

/// A kind whose status the operator writes whole, through the `status`
/// subresource.
pub trait WithStatus: Namespaced {
    /// The kind's status.
    type Status: Serialize + PartialEq;
    /// The status as read.
    fn status(&self) -> Option<&Self::Status>;
}

macro_rules! with_status {
    ($($kind:ty => $status:ty),* $(,)?) => {$(
        impl WithStatus for $kind {
            type Status = $status;
            fn status(&self) -> Option<&$status> {
                self.status.as_ref()
            }
        }
    )*};
}

with_status!(
    FlashSale => FlashSaleStatus,
    DegradationPolicy => DegradationPolicyStatus,
    ChaosDrill => ChaosDrillStatus,
);

/// Server-side applies `new` as the status of `object` unless it is the
/// status that was read, so an unchanged look costs no write. Whether it
/// wrote.
pub async fn write_status<K: WithStatus, S>(
    ctx: &Context<S>,
    object: &K,
    new: &K::Status,
) -> Result<bool, Error> {
    if object.status() == Some(new) {
        return Ok(false);
    }
    must_lead(ctx)?;
    let (api, namespace, name) = api_for(ctx, object)?;
    let patch = serde_json::json!({
        "apiVersion": K::api_version(&()),
        "kind": K::kind(&()),
        "status": serde_json::to_value(new)?,
    });
    let params = PatchParams::apply(ctx.id.field_manager).force();
    api.patch_status(&name, &params, &Patch::Apply(&patch))
        .await
        .map_err(kube_error::<K>(Verb::Status, &name))?;
    wrote(ctx, Verb::Status, kind_of::<K>(), &namespace, &name);
    Ok(true)
}

/// Sets `object`'s finalizers to `finalizers`, on the version read only
/// (a merge patch carrying `resourceVersion`, which the apiserver checks):
/// a finalizer someone else added in between is never dropped, the write
/// fails with a conflict and is retried instead.
pub async fn set_finalizers<K: Namespaced, S>(
    ctx: &Context<S>,
    object: &K,
    finalizers: &[String],
) -> Result<(), Error> {
    must_lead(ctx)?;
    let (api, namespace, name) = api_for(ctx, object)?;
    let version = object
        .meta()
        .resource_version
        .clone()
        .ok_or(Error::MissingMetadata("metadata.resourceVersion"))?;
    let patch = serde_json::json!({
        "metadata": {"resourceVersion": version, "finalizers": finalizers},
    });
    api.patch(&name, &PatchParams::default(), &Patch::Merge(&patch))
        .await
        .map_err(kube_error::<K>(Verb::Apply, &name))?;
    wrote(ctx, Verb::Apply, kind_of::<K>(), &namespace, &name);
    Ok(())
}
