//! Small types every kind shares.

use std::collections::BTreeMap;

use k8s_openapi::{
    api::core::v1::{ResourceRequirements, Toleration},
    apimachinery::pkg::apis::meta::v1::{Condition, Time},
};
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use crate::reasons::Reason;

/// A key of a Secret in the object's own namespace.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct SecretKeyRef {
    /// Name of the Secret.
    #[schemars(length(min = 1, max = 253))]
    pub name: String,
    /// Key within the Secret.
    #[schemars(length(min = 1, max = 253))]
    pub key: String,
}

/// A FlashSale in the same namespace.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct SaleRef {
    /// Name of the FlashSale.
    #[schemars(length(min = 1, max = 63))]
    pub name: String,
}

/// Which nodes a sale's pods may run on, for every workload of the sale:
/// dedicated nodes for a big sale, or the local stack's real node, which is
/// tainted so only what asks for it lands there.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct Placement {
    /// Labels a node must carry.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub node_selector: BTreeMap<String, String>,
    /// Taints the pods tolerate.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = 32))]
    pub tolerations: Vec<Toleration>,
}

/// How one workload runs: size, image and resources. Every field is optional;
/// the operator's defaults apply to what is left out.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct WorkloadSpec {
    /// Pod replicas while the sale is warming up or live.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 0, max = 1000))]
    pub replicas: Option<i32>,
    /// Container image, overriding the operator's default for this workload.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(min = 1, max = 512))]
    pub image: Option<String>,
    /// Container resources (requests and limits).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub resources: Option<ResourceRequirements>,
}

/// Cuts `text` to at most `max` bytes on a character boundary, marking the
/// cut with `…`: what goes into a status field or an Event with a length
/// bound, so a long error never gets the whole write refused.
pub fn truncate(text: &mut String, max: usize) {
    if text.len() > max {
        let mut end = max.saturating_sub('…'.len_utf8());
        while !text.is_char_boundary(end) {
            end -= 1;
        }
        text.truncate(end);
        text.push('…');
    }
}

/// Status fields every kind shares, flattened into each kind's status.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct ObservedConditions {
    /// The generation this status describes.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub observed_generation: Option<i64>,
    /// Standard conditions (Ready, Progressing, Stalled), one per type.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(extend("x-kubernetes-list-type" = "map", "x-kubernetes-list-map-keys" = ["type"]))]
    pub conditions: Vec<Condition>,
}

impl ObservedConditions {
    /// Sets the condition of `type_`, keeping its `lastTransitionTime` when
    /// the status does not change, so an unchanged status compares equal and
    /// is not written again.
    pub fn set(
        &mut self,
        type_: &str,
        status: bool,
        reason: impl Reason,
        message: impl Into<String>,
        now: &Time,
    ) {
        let status = if status { "True" } else { "False" };
        self.set_raw(type_, status, reason.as_str(), message.into(), now);
    }

    /// Sets the condition of `type_` to `Unknown`.
    pub fn set_unknown(
        &mut self,
        type_: &str,
        reason: impl Reason,
        message: impl Into<String>,
        now: &Time,
    ) {
        self.set_raw(type_, "Unknown", reason.as_str(), message.into(), now);
    }

    fn set_raw(&mut self, type_: &str, status: &str, reason: &str, message: String, now: &Time) {
        let generation = self.observed_generation;
        let condition = Condition {
            type_: type_.to_owned(),
            status: status.to_owned(),
            reason: reason.to_owned(),
            message,
            observed_generation: generation,
            last_transition_time: now.clone(),
        };
        match self.conditions.iter_mut().find(|c| c.type_ == type_) {
            Some(old) => {
                let since = if old.status == condition.status {
                    old.last_transition_time.clone()
                } else {
                    condition.last_transition_time.clone()
                };
                *old = Condition {
                    last_transition_time: since,
                    ..condition
                };
            }
            None => self.conditions.push(condition),
        }
    }

    /// Drops the condition of `type_` (what it reported no longer applies).
    pub fn remove(&mut self, type_: &str) {
        self.conditions.retain(|c| c.type_ != type_);
    }

    /// The condition of `type_`, if set.
    pub fn get(&self, type_: &str) -> Option<&Condition> {
        self.conditions.iter().find(|c| c.type_ == type_)
    }

    /// Whether the condition of `type_` is `True`.
    pub fn is_true(&self, type_: &str) -> bool {
        self.get(type_).is_some_and(|c| c.status == "True")
    }
}
