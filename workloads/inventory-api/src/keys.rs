//! The inventory's Redis key schema. Every key of sale `S` starts with
//! `fs:{S}:` and so lives in one Redis Cluster slot, except the keys of a
//! sharded SKU's shards, which get a slot each (`fs:{S#K#i}:`) so that a hot
//! SKU spreads over cluster nodes. See `docs/design/inventory.md`.
//!
//! | key | type | what |
//! |---|---|---|
//! | `fs:{S}:sku:<K>` | hash | `stock` (as first loaded), `limit`, `shards`, `sold` |
//! | `fs:{S}:user:<K>:<U>` | int | units user U holds of K (reserved + sold) |
//! | `fs:{S}:req:<R>` | string | request id R → `<reservation id> <sku> <qty>`; lives as long as the reservation |
//! | `fs:{S}:resv:<ID>` | hash | `sku`, `user`, `qty`, `amount` (minor units), `shard`, `state`, `expires_at` (ms), `request`, and once released `reason` and `prior` (the state it left) |
//! | `fs:{S}:expiry` | zset | reservation id → when the sweeper must look at it (ms) |
//! | `fs:{S}:outbox` | stream | `reservation` ids that lapsed unpaid or were cancelled, until their `expired` order event is acknowledged by Kafka; consumer group `publishers` |
//! | `fs:{S}:loaded` | string | set when the sale's stock is first loaded (to its opening, Unix ms); its absence in a running sale means Redis lost the sale |
//! | `fs:{S}:audit` | stream | stock adjustments: sku, requested, applied, reason, stock before/after |
//! | `<shard>avail:<K>:<i>` | int | units shard i can still give |
//! | `<shard>held:<K>:<i>` | int | units shard i gave (reserved or sold) |
//! | `<shard>taken:<ID>` | int | units shard i gave reservation ID (the proof for give-back); `fenced` once a claim that never settled was released, so its late step 2 takes nothing (expires after a day) |
//!
//! `<shard>` is `fs:{S}:` for a SKU with one shard and `fs:{S#K#i}:` otherwise.
//!
//! The gateway keeps its own keys in the same sale prefix:
//!
//! | key | type | what |
//! |---|---|---|
//! | `fs:{S}:rl:<U>` | int | user U's GCRA theoretical arrival time (µs, Redis clock), expires when it is past |
//! | `fs:{S}:wr:seq` | int | waiting room: last queue position handed out |
//! | `fs:{S}:wr:frontier` | hash | waiting room: `admitted` (positions up to it are let in), `last_us` (Redis clock the admission credit counts from) |
//! | `fs:{S}:wr:user:<U>` | hash | waiting room: user U's `position` and `issued_ms` (Redis clock), expires with U's ticket |
//! | `fs:{S}:wr:used:<P>` | string | waiting room: set (to a random claim) while position P's pass is redeemed; lives ticket TTL + pass TTL |
//! | `fs:{S}:ord:req:<R>` | string | gateway: the answer (JSON) of the order of request id R, once its created event was acknowledged by Kafka, so a client's retry neither publishes again nor needs a waiting-room pass again; expires after a day |
//!
//! For every shard, `avail + held` is constant (changed only by stock
//! adjustments), and a SKU's stock is the sum of that over its shards.

/// Keys of one sale.
#[derive(Debug, Clone)]
pub struct SaleKeys {
    sale: String,
}

impl SaleKeys {
    /// Keys of sale `sale`.
    pub fn new(sale: &str) -> Self {
        Self {
            sale: sale.to_owned(),
        }
    }

    fn key(&self, rest: &str) -> String {
        format!("fs:{{{}}}:{rest}", self.sale)
    }

    /// A SKU's record.
    pub fn sku(&self, sku: &str) -> String {
        self.key(&format!("sku:{sku}"))
    }

    /// A user's held units of a SKU.
    pub fn user(&self, sku: &str, user: &str) -> String {
        self.key(&format!("user:{sku}:{user}"))
    }

    /// Request id → reservation id.
    pub fn request(&self, request_id: &str) -> String {
        self.key(&format!("req:{request_id}"))
    }

    /// A reservation's record.
    pub fn reservation(&self, id: &str) -> String {
        self.key(&format!("resv:{id}"))
    }

    /// Audit stream of stock adjustments.
    pub fn audit(&self) -> String {
        self.key("audit")
    }

    /// The sweeper's queue.
    pub fn expiry(&self) -> String {
        self.key("expiry")
    }

    /// Marker that the sale's stock was loaded (the sale's opening, Unix
    /// ms): gone only when Redis lost the sale's data.
    pub fn loaded(&self) -> String {
        self.key("loaded")
    }

    /// Reservations whose `expired` event is still to be published.
    pub fn outbox(&self) -> String {
        self.key("outbox")
    }

    /// Keys of shard `index` of `sku`, which has `shards` shards.
    pub fn shard(&self, sku: &str, shards: u32, index: u32) -> ShardKeys {
        let prefix = if shards <= 1 {
            format!("fs:{{{}}}:", self.sale)
        } else {
            format!("fs:{{{}#{sku}#{index}}}:", self.sale)
        };
        ShardKeys {
            prefix,
            sku: sku.to_owned(),
            index,
        }
    }
}

/// Which workload a Redis ACL user is for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Workload {
    /// The gateway: rate limits (per user and per source), waiting room
    /// and its published-order notes.
    Gateway,
    /// The inventory: stock, reservations, their queues and audit.
    Inventory,
}

impl SaleKeys {
    /// The Redis ACL rules (arguments of `ACL SETUSER <user> ...`, after the
    /// user's name and password) that let `workload` touch exactly its own
    /// keys of this sale: the internet-facing gateway cannot read or change
    /// stock, and the inventory cannot touch the waiting room. Commands are
    /// every command but the dangerous ones (KEYS, FLUSHALL, CONFIG, DEBUG,
    /// ...); no Pub/Sub channels.
    pub fn acl_rules(&self, workload: Workload) -> Vec<String> {
        let own = |rest: &str| format!("~{}", self.key(rest));
        let mut rules = vec![
            "resetkeys".to_owned(),
            "resetchannels".to_owned(),
            "+@all".to_owned(),
            "-@dangerous".to_owned(),
        ];
        match workload {
            Workload::Gateway => rules.extend(["rl:*", "src:*", "wr:*", "ord:*"].map(own)),
            Workload::Inventory => {
                rules.extend(
                    [
                        "sku:*", "user:*", "req:*", "resv:*", "expiry", "outbox", "audit",
                        "loaded", "avail:*", "held:*", "taken:*",
                    ]
                    .map(own),
                );
                // The shards of a hot SKU, each in a slot of its own.
                rules.push(format!("~fs:{{{}#*", self.sale));
            }
        }
        rules
    }
}

/// Keys of one shard of a SKU.
#[derive(Debug, Clone)]
pub struct ShardKeys {
    prefix: String,
    sku: String,
    index: u32,
}

impl ShardKeys {
    /// Units the shard can still give.
    pub fn avail(&self) -> String {
        format!("{}avail:{}:{}", self.prefix, self.sku, self.index)
    }

    /// Units the shard gave.
    pub fn held(&self) -> String {
        format!("{}held:{}:{}", self.prefix, self.sku, self.index)
    }

    /// Proof that the shard gave units to reservation `id`.
    pub fn taken(&self, id: &str) -> String {
        format!("{}taken:{id}", self.prefix)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Redis Cluster's hash tag: the part between the first `{` and the next `}`.
    fn hash_tag(key: &str) -> &str {
        let open = key.find('{').map(|i| i + 1).unwrap_or(0);
        let close = key[open..].find('}').map(|i| open + i).unwrap_or(key.len());
        &key[open..close]
    }

    /// Whether Redis's glob `pattern` (only `*` occurs in the rules) matches `key`.
    fn glob(pattern: &str, key: &str) -> bool {
        match pattern.split_once('*') {
            None => pattern == key,
            Some((head, tail)) => key.strip_prefix(head).is_some_and(|rest| {
                (0..=rest.len()).any(|i| rest.is_char_boundary(i) && glob(tail, &rest[i..]))
            }),
        }
    }

    fn allowed(keys: &SaleKeys, workload: Workload, key: &str) -> bool {
        keys.acl_rules(workload)
            .iter()
            .filter_map(|r| r.strip_prefix('~'))
            .any(|p| glob(p, key))
    }

    #[test]
    fn each_workload_reaches_exactly_its_own_keys() {
        let keys = SaleKeys::new("ns.s11.0123abcd");
        let shard = keys.shard("PHONE", 8, 3);
        let inventory = [
            keys.sku("PHONE"),
            keys.user("PHONE", "u1"),
            keys.request("r1"),
            keys.reservation("id"),
            keys.expiry(),
            keys.outbox(),
            keys.audit(),
            keys.shard("PHONE", 1, 0).avail(),
            shard.avail(),
            shard.held(),
            shard.taken("id"),
        ];
        let gateway = [
            "fs:{ns.s11.0123abcd}:rl:u1",
            "fs:{ns.s11.0123abcd}:src:ip:203.0.113.7",
            "fs:{ns.s11.0123abcd}:wr:seq",
            "fs:{ns.s11.0123abcd}:wr:spent:42",
            "fs:{ns.s11.0123abcd}:wr:user:u1",
            "fs:{ns.s11.0123abcd}:ord:req:0a1b2c",
        ];
        for key in &inventory {
            assert!(allowed(&keys, Workload::Inventory, key), "{key}");
            assert!(!allowed(&keys, Workload::Gateway, key), "{key}");
        }
        for key in gateway {
            assert!(allowed(&keys, Workload::Gateway, key), "{key}");
            assert!(!allowed(&keys, Workload::Inventory, key), "{key}");
        }
        // Nothing of another sale, even one whose id starts the same.
        let other = SaleKeys::new("ns.s11.0123abcdX");
        assert!(!allowed(&keys, Workload::Inventory, &other.sku("PHONE")));
        assert!(!allowed(
            &keys,
            Workload::Gateway,
            "fs:{ns.s11.0123abcdX}:rl:u1"
        ));
    }

    #[test]
    fn a_sale_stays_in_one_slot_unless_sharded() {
        let keys = SaleKeys::new("s11");
        let single = keys.shard("PHONE", 1, 0);
        for key in [
            keys.sku("PHONE"),
            keys.user("PHONE", "u1"),
            keys.request("r1"),
            keys.reservation("id"),
            keys.expiry(),
            keys.outbox(),
            single.avail(),
            single.held(),
            single.taken("id"),
        ] {
            assert!(key.starts_with("fs:{s11}:"), "{key}");
            assert_eq!(hash_tag(&key), "s11");
        }
        let tags: std::collections::BTreeSet<String> = (0..8)
            .map(|i| hash_tag(&keys.shard("PHONE", 8, i).avail()).to_owned())
            .collect();
        assert_eq!(tags.len(), 8, "each shard in its own slot: {tags:?}");
        let shard = keys.shard("PHONE", 8, 3);
        assert_eq!(
            hash_tag(&shard.avail()),
            hash_tag(&shard.taken("id")),
            "a shard's keys share a slot"
        );
    }
}
