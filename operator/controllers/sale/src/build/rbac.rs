//! The gateway's identity: a ServiceAccount allowed to read exactly one
//! ConfigMap, its sale's degradation switches.

use k8s_openapi::api::{
    core::v1::ServiceAccount,
    rbac::v1::{PolicyRule, Role, RoleBinding, RoleRef, Subject},
};

use super::{
    Owner,
    names::{self, Component},
};

/// The ServiceAccount `<sale>-gateway`.
pub(super) fn gateway_service_account(owner: &Owner<'_>) -> ServiceAccount {
    ServiceAccount {
        metadata: owner.object_meta(
            names::gateway_service_account(owner.sale),
            Component::Gateway,
        ),
        ..ServiceAccount::default()
    }
}

/// The Role `<sale>-gateway`: get, list and watch on `<sale>-degradation`
/// only (the gateway watches it with a `metadata.name` field selector, which
/// is what lets list/watch be limited to one resource name).
pub(super) fn gateway_role(owner: &Owner<'_>) -> Role {
    Role {
        metadata: owner.object_meta(names::gateway_role(owner.sale), Component::Gateway),
        rules: Some(vec![PolicyRule {
            api_groups: Some(vec![String::new()]),
            resources: Some(vec!["configmaps".to_owned()]),
            resource_names: Some(vec![names::degradation(owner.sale)]),
            verbs: ["get", "list", "watch"].map(str::to_owned).to_vec(),
            ..PolicyRule::default()
        }]),
    }
}

/// The RoleBinding `<sale>-gateway` of that Role to that ServiceAccount.
pub(super) fn gateway_role_binding(owner: &Owner<'_>) -> RoleBinding {
    RoleBinding {
        metadata: owner.object_meta(names::gateway_role_binding(owner.sale), Component::Gateway),
        role_ref: RoleRef {
            api_group: Some("rbac.authorization.k8s.io".to_owned()),
            kind: "Role".to_owned(),
            name: names::gateway_role(owner.sale),
        },
        subjects: Some(vec![Subject {
            kind: "ServiceAccount".to_owned(),
            name: names::gateway_service_account(owner.sale),
            namespace: Some(owner.namespace.to_owned()),
            ..Subject::default()
        }]),
    }
}
