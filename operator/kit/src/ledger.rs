//! What a controller last applied to each child it owns, and what its watches
//! last saw of it, so that a child is written only when the controller wants
//! something new of it or someone else changed it.
//!
//! A child is *current* when the object the controller would apply now is
//! the one it last applied (same hash) and the child's watch last saw it as
//! that apply left it (same fingerprint). Anything else (a new desired
//! object, a hand edit, a deletion, a restart of the operator, a watch that
//! has not caught up) makes it not current, and the next reconcile applies
//! it: at worst one extra no-op apply, never a missed one.
//!
//! The fingerprint leaves out what other controllers write as a matter of
//! course (a Deployment's status and revision annotation), so they do not
//! make a child look edited: kinds with a `metadata.generation` are compared
//! by it (it moves on every change of the spec), the others by
//! `resourceVersion`; uid, labels and owners are compared for all.

use std::{
    collections::{BTreeMap, HashMap},
    hash::{DefaultHasher, Hash, Hasher},
    sync::Mutex,
};

use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use serde::Serialize;

/// One child: its kind, namespace and name.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct ChildKey {
    /// The child's kind (`Deployment`).
    pub kind: &'static str,
    /// Its namespace.
    pub namespace: String,
    /// Its name.
    pub name: String,
}

/// What a watch event of a child means to its owner.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Seen {
    /// The child as the owner's last apply left it: nothing to do.
    AsApplied,
    /// Changed by someone else, or never applied by this process: the
    /// owner should look at it.
    Changed,
}

#[derive(Debug, Default)]
struct Entry {
    /// Hash of the desired object and fingerprint of the apply's result.
    applied: Option<(u64, u64)>,
    /// Fingerprint of the child as last watched, and the relist it was seen
    /// in.
    seen: Option<(u64, u64)>,
    /// The owner's name, to wake it when a relist finds the child gone.
    owner: Option<String>,
}

/// The ledger of one controller's children. Entries disappear with their
/// child's deletion event (or its absence from a relist), so the ledger
/// holds no more than the watches do.
#[derive(Debug, Default)]
pub struct Ledger {
    entries: Mutex<HashMap<ChildKey, Entry>>,
    /// The current relist of each kind.
    relists: Mutex<HashMap<&'static str, u64>>,
}

/// The hash of an object the controller is about to apply.
pub fn desired_hash<T: Serialize>(object: &T) -> u64 {
    let mut hasher = DefaultHasher::new();
    // Serialising cannot fail for the kinds applied (plain data, string
    // keys); a failure hashes as empty, which only costs an apply.
    serde_json::to_vec(object)
        .unwrap_or_default()
        .hash(&mut hasher);
    hasher.finish()
}

/// The fingerprint of a child as the apiserver holds it.
pub fn fingerprint(meta: &ObjectMeta) -> u64 {
    let mut hasher = DefaultHasher::new();
    meta.uid.hash(&mut hasher);
    match meta.generation {
        Some(generation) => generation.hash(&mut hasher),
        None => meta.resource_version.hash(&mut hasher),
    }
    meta.labels
        .as_ref()
        .unwrap_or(&BTreeMap::new())
        .hash(&mut hasher);
    for owner in meta.owner_references.iter().flatten() {
        (&owner.uid, owner.controller).hash(&mut hasher);
    }
    hasher.finish()
}

impl Ledger {
    fn entries(&self) -> std::sync::MutexGuard<'_, HashMap<ChildKey, Entry>> {
        self.entries.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn relist(&self, kind: &'static str) -> u64 {
        let relists = self.relists.lock().unwrap_or_else(|p| p.into_inner());
        relists.get(kind).copied().unwrap_or(0)
    }

    /// Whether applying an object of hash `desired` to `key` would change
    /// nothing.
    pub fn is_current(&self, key: &ChildKey, desired: u64) -> bool {
        self.entries().get(key).is_some_and(|entry| {
            matches!((entry.applied, entry.seen), (Some((hash, applied)), Some((seen, _)))
                if hash == desired && applied == seen)
        })
    }

    /// Whether the child's watch holds it (it exists and carries the
    /// controller's labels).
    pub fn is_watched(&self, key: &ChildKey) -> bool {
        self.entries().get(key).is_some_and(|e| e.seen.is_some())
    }

    /// Records an apply of an object of hash `desired` to `key`, owned by
    /// `owner`, which left the child with `meta`.
    pub fn applied(&self, key: ChildKey, owner: &str, desired: u64, meta: &ObjectMeta) {
        let mut entries = self.entries();
        let entry = entries.entry(key).or_default();
        entry.applied = Some((desired, fingerprint(meta)));
        entry.owner = Some(owner.to_owned());
    }

    /// Records a watch event that shows the child `key` with `meta`, owned
    /// by `owner`.
    pub fn saw(&self, key: ChildKey, owner: Option<&str>, meta: &ObjectMeta) -> Seen {
        let relist = self.relist(key.kind);
        let seen = fingerprint(meta);
        let mut entries = self.entries();
        let entry = entries.entry(key).or_default();
        entry.seen = Some((seen, relist));
        if let Some(owner) = owner {
            entry.owner = Some(owner.to_owned());
        }
        match entry.applied {
            Some((_, applied)) if applied == seen => Seen::AsApplied,
            _ => Seen::Changed,
        }
    }

    /// Forgets a deleted child: the next reconcile of its owner applies it
    /// again if it still wants it.
    pub fn deleted(&self, key: &ChildKey) {
        self.entries().remove(key);
    }

    /// A watch of `kind` starts listing everything again.
    pub fn relist_started(&self, kind: &'static str) {
        let mut relists = self.relists.lock().unwrap_or_else(|p| p.into_inner());
        *relists.entry(kind).or_insert(0) += 1;
    }

    /// A relist of `kind` is complete: children it did not show were deleted
    /// while the watch was down. Forgets them and returns their owners as
    /// (namespace, name), to be woken.
    pub fn relist_done(&self, kind: &'static str) -> Vec<(String, String)> {
        let relist = self.relist(kind);
        let mut owners = Vec::new();
        self.entries().retain(|key, entry| {
            // An entry never watched (an apply whose watch event is still to
            // come) is kept.
            let gone = key.kind == kind && entry.seen.is_some_and(|(_, r)| r < relist);
            if gone && let Some(owner) = &entry.owner {
                owners.push((key.namespace.clone(), owner.clone()));
            }
            !gone
        });
        owners
    }

    /// Children in the ledger (for tests and metrics).
    pub fn len(&self) -> usize {
        self.entries().len()
    }

    /// Whether the ledger is empty.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

#[cfg(test)]
mod tests {
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::OwnerReference;

    use super::*;

    fn key(name: &str) -> ChildKey {
        ChildKey {
            kind: "Deployment",
            namespace: "ns".into(),
            name: name.into(),
        }
    }

    fn meta(generation: Option<i64>, version: &str) -> ObjectMeta {
        ObjectMeta {
            uid: Some("u1".into()),
            generation,
            resource_version: Some(version.into()),
            labels: Some([("a".to_owned(), "b".to_owned())].into()),
            owner_references: Some(vec![OwnerReference {
                uid: "sale".into(),
                controller: Some(true),
                ..OwnerReference::default()
            }]),
            ..ObjectMeta::default()
        }
    }

    #[test]
    fn a_child_is_current_only_once_its_watch_shows_the_apply() {
        let ledger = Ledger::default();
        let applied = meta(Some(1), "10");
        assert!(!ledger.is_current(&key("a"), 7), "never applied");
        ledger.applied(key("a"), "s", 7, &applied);
        assert!(
            !ledger.is_current(&key("a"), 7),
            "the watch has not seen it"
        );
        assert_eq!(ledger.saw(key("a"), Some("s"), &applied), Seen::AsApplied);
        assert!(ledger.is_current(&key("a"), 7));
        assert!(!ledger.is_current(&key("a"), 8), "something else is wanted");
    }

    #[test]
    fn status_updates_are_not_edits_but_spec_labels_owner_and_uid_changes_are() {
        let ledger = Ledger::default();
        ledger.applied(key("a"), "s", 7, &meta(Some(1), "10"));
        // A status write by another controller: new version, same generation.
        assert_eq!(
            ledger.saw(key("a"), Some("s"), &meta(Some(1), "11")),
            Seen::AsApplied
        );
        assert!(ledger.is_current(&key("a"), 7));
        let edits = [
            meta(Some(2), "12"),
            ObjectMeta {
                labels: None,
                ..meta(Some(1), "12")
            },
            ObjectMeta {
                owner_references: None,
                ..meta(Some(1), "12")
            },
            ObjectMeta {
                uid: Some("u2".into()),
                ..meta(Some(1), "12")
            },
        ];
        for edited in edits {
            assert_eq!(
                ledger.saw(key("a"), Some("s"), &edited),
                Seen::Changed,
                "{edited:?}"
            );
            assert!(!ledger.is_current(&key("a"), 7));
            ledger.saw(key("a"), Some("s"), &meta(Some(1), "10"));
        }
    }

    #[test]
    fn kinds_without_a_generation_compare_the_resource_version() {
        let ledger = Ledger::default();
        ledger.applied(key("c"), "s", 1, &meta(None, "5"));
        assert_eq!(
            ledger.saw(key("c"), None, &meta(None, "5")),
            Seen::AsApplied
        );
        assert_eq!(ledger.saw(key("c"), None, &meta(None, "6")), Seen::Changed);
        assert!(!ledger.is_current(&key("c"), 1));
    }

    #[test]
    fn a_deleted_child_is_forgotten() {
        let ledger = Ledger::default();
        ledger.applied(key("a"), "s", 7, &meta(Some(1), "10"));
        ledger.saw(key("a"), Some("s"), &meta(Some(1), "10"));
        ledger.deleted(&key("a"));
        assert!(!ledger.is_current(&key("a"), 7));
        assert!(!ledger.is_watched(&key("a")));
        assert!(ledger.is_empty());
    }

    #[test]
    fn a_relist_forgets_children_it_no_longer_shows_and_names_their_owners() {
        let ledger = Ledger::default();
        for name in ["kept", "gone"] {
            ledger.applied(key(name), "s", 1, &meta(Some(1), "1"));
            ledger.saw(key(name), Some("s"), &meta(Some(1), "1"));
        }
        // Applied, its watch event still on the way: not gone.
        ledger.applied(key("new"), "s", 1, &meta(Some(1), "2"));
        ledger.relist_started("Deployment");
        ledger.saw(key("kept"), Some("s"), &meta(Some(1), "1"));
        let woken = ledger.relist_done("Deployment");
        assert_eq!(woken, vec![("ns".to_owned(), "s".to_owned())]);
        assert!(ledger.is_current(&key("kept"), 1));
        assert!(!ledger.is_watched(&key("gone")));
        assert_eq!(ledger.len(), 2, "kept and new");
    }
}
