//! Queues of waiting work, one per key (a SKU's reservations, a sale's
//! acknowledgements), each drained by one task at a time: the first push
//! for a key starts the drain, later pushes join its queue, and the empty
//! take that ends the drain lets the next push start a new one. Nothing
//! idles per key, and the lock around them is held only to push or take.
//! Pure bookkeeping, so it is tested without Redis.

use std::{
    collections::{HashMap, VecDeque},
    future::Future,
    hash::Hash,
    sync::{Mutex, PoisonError},
    time::Duration,
};

use scopeguard::ScopeGuard;

/// Queues of waiting work per key. A key is present exactly while a drain
/// task runs for it.
#[derive(Debug)]
pub(crate) struct Queues<K, T> {
    pending: HashMap<K, VecDeque<T>>,
}

impl<K, T> Default for Queues<K, T> {
    fn default() -> Self {
        Self {
            pending: HashMap::new(),
        }
    }
}

impl<K: Hash + Eq, T> Queues<K, T> {
    /// Queues `item`; `true` if no drain runs for the key, so the caller
    /// must start one.
    pub(crate) fn push(&mut self, key: K, item: T) -> bool {
        match self.pending.get_mut(&key) {
            Some(queue) => {
                queue.push_back(item);
                false
            }
            None => {
                self.pending.insert(key, VecDeque::from([item]));
                true
            }
        }
    }

    /// The next batch of the key, oldest first, at most `max` (at least one);
    /// empty when nothing waits, and then the key's drain is over: the next
    /// push starts a new one.
    pub(crate) fn take(&mut self, key: &K, max: usize) -> Vec<T> {
        let Some(queue) = self.pending.get_mut(key) else {
            return Vec::new();
        };
        if queue.is_empty() {
            self.pending.remove(key);
            return Vec::new();
        }
        let count = queue.len().min(max.max(1));
        queue.drain(..count).collect()
    }

    /// Ends the key's drain, giving back what still waits.
    pub(crate) fn abandon(&mut self, key: &K) -> Vec<T> {
        self.pending.remove(key).map(Vec::from).unwrap_or_default()
    }

    /// Whether a drain runs for the key.
    #[cfg(test)]
    fn draining(&self, key: &K) -> bool {
        self.pending.contains_key(key)
    }
}

/// Queues `item` under `key` in the locked `queues`; `true` if no drain
/// runs for the key, so the caller must start one ([`drain`]).
pub(crate) fn enqueue<K: Hash + Eq, T>(queues: &Mutex<Queues<K, T>>, key: K, item: T) -> bool {
    // The lock guards plain pushes and takes; a panic cannot leave it torn.
    queues
        .lock()
        .unwrap_or_else(PoisonError::into_inner)
        .push(key, item)
}

/// The drain task of `key`: waits `delay`, then hands `call` the key's
/// queued items, at most `max` at a time and oldest first, until the queue
/// is empty. If the task
/// is dropped or panics mid-way the drain still ends, so the key does not
/// stay "draining" forever: the items still queued are dropped (their
/// waiters see their senders gone) and the next push starts afresh.
pub(crate) async fn drain<K, T, F, Fut>(
    queues: &Mutex<Queues<K, T>>,
    key: &K,
    max: usize,
    delay: Duration,
    mut call: F,
) where
    K: Hash + Eq,
    F: FnMut(Vec<T>) -> Fut,
    Fut: Future<Output = ()>,
{
    // The lock guards plain pushes and takes; a panic cannot leave it torn.
    let lock = || queues.lock().unwrap_or_else(PoisonError::into_inner);
    let abandon = scopeguard::guard((), |()| drop(lock().abandon(key)));
    if !delay.is_zero() {
        tokio::time::sleep(delay).await;
    }
    loop {
        let batch = lock().take(key, max);
        if batch.is_empty() {
            // The empty take ended the drain.
            ScopeGuard::into_inner(abandon);
            return;
        }
        call(batch).await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn key(sku: &str) -> (String, String) {
        ("s".to_owned(), sku.to_owned())
    }

    #[test]
    fn the_first_request_starts_a_drain_and_later_ones_join_it() {
        let mut queues = Queues::default();
        assert!(queues.push(key("A"), 1));
        assert!(!queues.push(key("A"), 2));
        // Another SKU has a drain of its own.
        assert!(queues.push(key("B"), 10));
        assert!(!queues.push(key("A"), 3));
        assert_eq!(queues.take(&key("A"), 128), vec![1, 2, 3]);
        assert_eq!(queues.take(&key("B"), 128), vec![10]);
    }

    #[test]
    fn batches_are_bounded_and_keep_arrival_order() {
        let mut queues = Queues::default();
        for i in 0..300 {
            queues.push(key("A"), i);
        }
        let first = queues.take(&key("A"), 128);
        let second = queues.take(&key("A"), 128);
        let third = queues.take(&key("A"), 128);
        assert_eq!(first, (0..128).collect::<Vec<_>>());
        assert_eq!(second, (128..256).collect::<Vec<_>>());
        assert_eq!(third, (256..300).collect::<Vec<_>>());
        // A zero bound still makes progress.
        queues.push(key("A"), 7);
        assert_eq!(queues.take(&key("A"), 0), vec![7]);
    }

    #[test]
    fn an_empty_take_ends_the_drain_so_the_next_request_starts_one() {
        let mut queues = Queues::default();
        assert!(queues.push(key("A"), 1));
        assert_eq!(queues.take(&key("A"), 128), vec![1]);
        // Still draining: the call is in flight.
        assert!(queues.draining(&key("A")));
        assert!(!queues.push(key("A"), 2));
        assert_eq!(queues.take(&key("A"), 128), vec![2]);
        assert!(queues.take(&key("A"), 128).is_empty());
        assert!(!queues.draining(&key("A")));
        assert!(queues.push(key("A"), 3));
    }

    #[test]
    fn an_abandoned_drain_hands_back_every_waiter_once() {
        let mut queues = Queues::default();
        queues.push(key("A"), 1);
        queues.push(key("A"), 2);
        assert_eq!(queues.abandon(&key("A")), vec![1, 2]);
        assert!(queues.abandon(&key("A")).is_empty());
        assert!(queues.take(&key("A"), 128).is_empty());
        assert!(queues.push(key("A"), 3));
    }
}
