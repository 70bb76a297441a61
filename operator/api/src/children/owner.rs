//! The sale's identity as every child needs it: name, namespace and the
//! owner reference, checked once so builders cannot forget a field.

use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, OwnerReference};
use kube::Resource;

use super::{
    BuildError, labels,
    names::{self, Component},
};
use crate::FlashSale;

/// A sale whose name, namespace and uid are known.
pub struct Owner<'a> {
    /// The sale.
    pub sale: &'a FlashSale,
    /// metadata.name.
    pub name: &'a str,
    /// metadata.namespace.
    pub namespace: &'a str,
    /// metadata.uid.
    pub uid: &'a str,
    owner: OwnerReference,
}

impl<'a> Owner<'a> {
    /// Checks the metadata every child needs.
    pub fn new(sale: &'a FlashSale) -> Result<Self, BuildError> {
        let meta = sale.meta();
        let name = meta
            .name
            .as_deref()
            .filter(|n| !n.is_empty())
            .ok_or(BuildError::MissingMetadata("name"))?;
        let namespace = meta
            .namespace
            .as_deref()
            .filter(|n| !n.is_empty())
            .ok_or(BuildError::MissingMetadata("namespace"))?;
        let uid = meta
            .uid
            .as_deref()
            .filter(|u| !u.is_empty())
            .ok_or(BuildError::MissingMetadata("uid"))?;
        let owner = sale
            .controller_owner_ref(&())
            .ok_or(BuildError::MissingMetadata("uid"))?;
        Ok(Self {
            sale,
            name,
            namespace,
            uid,
            owner: OwnerReference {
                // kube sets only `controller`; blocking deletion keeps a
                // foreground delete of the sale waiting for its children.
                block_owner_deletion: Some(true),
                ..owner
            },
        })
    }

    /// The sale id the workloads use: `spec.saleID`, or else
    /// [`names::sale_id`].
    pub fn sale_id(&self) -> String {
        match &self.sale.spec.sale_id {
            Some(id) => id.clone(),
            None => names::sale_id(self.namespace, self.name, self.uid),
        }
    }

    /// Metadata of a child: its name, the sale's namespace, the DESIGN labels
    /// and the sale as controller.
    pub fn object_meta(&self, name: String, component: Component) -> ObjectMeta {
        ObjectMeta {
            name: Some(name),
            namespace: Some(self.namespace.to_owned()),
            labels: Some(labels::labels(self.name, component)),
            owner_references: Some(vec![self.owner.clone()]),
            ..ObjectMeta::default()
        }
    }
}
