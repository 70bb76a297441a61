//! Which `created` events of a batch are new orders, which are replays of an
//! order already stored (no-ops), and which clash with a stored order: the
//! same idempotency key under another order id, or the same order id under
//! another key. A clash is reported, never skipped silently: the writer
//! dead-letters it.

use std::collections::{HashMap, HashSet};

use super::SourcedEvent;

/// A stored order that shares an idempotency key or an order id with a
/// `created` event of the batch, as the database matched it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) struct StoredIdentity {
    /// Its order id.
    pub order_id: String,
    /// Its idempotency key.
    pub idempotency_key: String,
}

/// How a `created` event clashes with a stored order.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ConflictKind {
    /// The idempotency key is already stored for another order.
    #[error("idempotency key already stored for order {order_id}")]
    KeyTaken {
        /// The order that holds the key.
        order_id: String,
    },
    /// The order id is already stored with another idempotency key.
    #[error("order id already stored with another idempotency key")]
    OrderIdTaken,
    /// The key or the order id equals a stored order's under the database's
    /// collation (a MySQL one that ignores case or trailing spaces), though
    /// not byte for byte.
    #[error(
        "idempotency key or order id equal, by the database's collation, to stored order {order_id}"
    )]
    CollationEqual {
        /// The stored order.
        order_id: String,
    },
}

/// A `created` event not stored because it clashes with a stored order.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Conflict {
    /// Its position in the batch.
    pub index: usize,
    /// How it clashes.
    pub kind: ConflictKind,
}

/// The verdict on a batch's `created` events.
#[derive(Debug, Default, PartialEq, Eq)]
pub(super) struct Plan {
    /// Positions in the batch to insert.
    pub fresh: Vec<usize>,
    /// Events that clash, in batch order.
    pub conflicts: Vec<Conflict>,
}

/// Decides for each `created` event at `created` (positions in `batch`),
/// given the stored orders that share a key or an order id with any of them.
/// Earlier events of the batch count as stored for later ones, so an event
/// delivered twice in one batch is inserted once.
pub(super) fn plan(batch: &[SourcedEvent], created: &[usize], stored: &[StoredIdentity]) -> Plan {
    // Key → order id, and the order ids, of what is stored or claimed by an
    // earlier event of this batch.
    let mut by_key: HashMap<&str, &str> = stored
        .iter()
        .map(|s| (s.idempotency_key.as_str(), s.order_id.as_str()))
        .collect();
    let mut ids: HashSet<&str> = stored.iter().map(|s| s.order_id.as_str()).collect();
    // A row the database matched that equals no event's key or order id byte
    // for byte comes from a collation that folds case or trailing spaces.
    // Which event it belongs to is only certain when there is one event:
    // with more, the insert fails on the unique index and the writer retries
    // the events one at a time, which lands here with one.
    let folded = match created {
        [only] => stored.iter().find(|s| {
            let e = &batch[*only].event;
            s.idempotency_key != e.idempotency_key && s.order_id != e.order_id
        }),
        _ => None,
    };
    let mut plan = Plan::default();
    for &index in created {
        let event = &batch[index].event;
        let kind = match by_key.get(event.idempotency_key.as_str()) {
            // The same order again: a replay, a no-op.
            Some(&order_id) if order_id == event.order_id => continue,
            Some(&order_id) => Some(ConflictKind::KeyTaken {
                order_id: order_id.to_owned(),
            }),
            None if ids.contains(event.order_id.as_str()) => Some(ConflictKind::OrderIdTaken),
            None => folded.map(|s| ConflictKind::CollationEqual {
                order_id: s.order_id.clone(),
            }),
        };
        match kind {
            Some(kind) => plan.conflicts.push(Conflict { index, kind }),
            None => {
                by_key.insert(&event.idempotency_key, &event.order_id);
                ids.insert(&event.order_id);
                plan.fresh.push(index);
            }
        }
    }
    plan
}

#[cfg(test)]
mod tests {
    use flashsale_orders::{EventKind, OrderEvent, SCHEMA_VERSION};

    use super::*;

    fn created(order_id: &str, key: &str) -> SourcedEvent {
        SourcedEvent {
            event: OrderEvent {
                schema_version: SCHEMA_VERSION,
                kind: EventKind::Created,
                order_id: order_id.into(),
                sale: "shop.sale.0123abcd".into(),
                user_id: "u1".into(),
                sku: "PHONE".into(),
                quantity: 1,
                amount_minor: 100,
                idempotency_key: key.into(),
                reservation_id: "r1".into(),
                created_at: jiff::Timestamp::UNIX_EPOCH,
            },
            partition: 0,
            offset: 0,
        }
    }

    fn stored(order_id: &str, key: &str) -> StoredIdentity {
        StoredIdentity {
            order_id: order_id.into(),
            idempotency_key: key.into(),
        }
    }

    fn all(batch: &[SourcedEvent]) -> Vec<usize> {
        (0..batch.len()).collect()
    }

    #[test]
    fn new_orders_are_fresh_and_replays_are_skipped() {
        let batch = [created("o1", "k1"), created("o2", "k2")];
        let plan = plan(&batch, &all(&batch), &[stored("o1", "k1")]);
        assert_eq!(
            plan,
            Plan {
                fresh: vec![1],
                conflicts: vec![]
            }
        );
    }

    #[test]
    fn a_key_stored_under_another_order_is_a_conflict() {
        let batch = [created("o2", "k1")];
        let plan = plan(&batch, &all(&batch), &[stored("o1", "k1")]);
        assert_eq!(plan.fresh, Vec::<usize>::new());
        assert_eq!(
            plan.conflicts,
            vec![Conflict {
                index: 0,
                kind: ConflictKind::KeyTaken {
                    order_id: "o1".into()
                }
            }]
        );
    }

    #[test]
    fn an_order_id_stored_with_another_key_is_a_conflict() {
        let batch = [created("o1", "k2")];
        let plan = plan(&batch, &all(&batch), &[stored("o1", "k1")]);
        assert_eq!(plan.conflicts[0].kind, ConflictKind::OrderIdTaken);
        assert!(plan.fresh.is_empty());
    }

    #[test]
    fn inside_one_batch_the_first_event_wins() {
        let batch = [
            created("o1", "k1"),
            created("o1", "k1"), // delivered twice: a replay
            created("o2", "k1"), // the key again, another order
            created("o1", "k3"), // the order again, another key
            created("o4", "k4"),
        ];
        let plan = plan(&batch, &all(&batch), &[]);
        assert_eq!(plan.fresh, vec![0, 4]);
        let kinds: Vec<_> = plan.conflicts.iter().map(|c| (c.index, &c.kind)).collect();
        assert_eq!(
            kinds,
            vec![
                (
                    2,
                    &ConflictKind::KeyTaken {
                        order_id: "o1".into()
                    }
                ),
                (3, &ConflictKind::OrderIdTaken)
            ]
        );
    }

    #[test]
    fn a_row_matched_only_by_collation_belongs_to_a_lone_event() {
        let lone = [created("o2", "k1")];
        let plan_one = plan(&lone, &all(&lone), &[stored("o1", "K1")]);
        assert_eq!(
            plan_one.conflicts[0].kind,
            ConflictKind::CollationEqual {
                order_id: "o1".into()
            }
        );
        // With several events it cannot be told whose it is: the insert
        // decides (a unique violation sends the events one at a time).
        let two = [created("o2", "k1"), created("o3", "k3")];
        assert_eq!(
            plan(&two, &all(&two), &[stored("o1", "K1")]).fresh,
            vec![0, 1]
        );
    }

    #[test]
    fn only_the_given_positions_are_judged() {
        let batch = [created("o1", "k1"), created("o2", "k2")];
        assert_eq!(plan(&batch, &[1], &[]).fresh, vec![1]);
    }
}
