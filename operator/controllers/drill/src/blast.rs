//! The exact pods an experiment targets, under the blast-radius cap and the
//! namespace's budget, as a pure function of the workload's pods, the pods
//! already under chaos and a seed.
//!
//! The rules:
//! - Live pods are the ready ones that are not terminating; only they count
//!   for the cap and only they are chosen.
//! - The cap is `maxPercent` of the live pods, rounded down, and at most
//!   `maxPods`. The percent is read to a millionth of a percent and the rest
//!   is integer arithmetic, so `2` means exactly 2 % whatever binary float
//!   `2.0` or `0.1 + 1.9` is: 50 pods at 2 % is 1 pod, never 0.
//! - The cap holds for the whole namespace: pods of the workload already
//!   under chaos from any run count against it, ready or not (a failed pod is
//!   still a pod the drills took), so at most `cap` pods are ever under chaos.
//! - A killed pod leaves the list before its replacement serves: such pods
//!   (`pending`, counted by [`super::budget`]) stay held and stay in the
//!   fleet the cap is taken of, so a kill never frees its own share.
//! - Which pods is pseudo-random but reproducible: the same pods and seed
//!   give the same choice, and different seeds spread it over the fleet.

use std::collections::BTreeSet;

use flashsale_api::chaosdrill::BlastRadius;
use flashsale_api::reasons::DrillReason;

/// A pod of the target workload as the controller sees it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Candidate {
    /// The pod's name.
    pub name: String,
    /// Whether the pod is Ready.
    pub ready: bool,
    /// Whether the pod is being deleted.
    pub terminating: bool,
}

impl Candidate {
    /// Whether the pod serves and counts for the cap.
    pub fn live(&self) -> bool {
        self.ready && !self.terminating
    }
}

/// An object's controller, as its owner references name it: `(kind, uid)`.
pub type Owner = (String, String);

/// Whether an object whose controller is `owner` belongs to the sale `sale`
/// (its uid): directly, or through its owners' controllers in `owners` (uid →
/// controller; a Pod's ReplicaSet, the ReplicaSet's Deployment). A pod that
/// merely copies the sale's labels has no such chain and is never a target.
pub fn owned_by_sale(
    owner: Option<&Owner>,
    owners: &std::collections::BTreeMap<String, Owner>,
    sale: &str,
) -> bool {
    let mut next = owner;
    // Pod → ReplicaSet → Deployment → FlashSale, and no deeper.
    for _ in 0..3 {
        match next {
            Some((kind, uid)) if kind == "FlashSale" => return uid == sale,
            Some((_, uid)) => next = owners.get(uid),
            None => return false,
        }
    }
    false
}

/// Fixed-point units of one percent: the percent is read to a millionth.
const PER_PERCENT: u128 = 1_000_000;

/// A whole fleet, in fixed-point units.
const WHOLE: u128 = 100 * PER_PERCENT;

/// The cap for a fleet of `live` pods: `maxPercent` of them rounded down, at
/// most `maxPods`. A percent that is not a positive number allows no pod; one
/// above 100 allows the whole fleet.
pub fn cap(live: usize, radius: &BlastRadius) -> usize {
    let percent = if radius.max_percent.is_finite() {
        radius.max_percent.clamp(0.0, 100.0)
    } else {
        0.0
    };
    // Rounding to a millionth absorbs the float error of a decimal percent;
    // the cast is exact, the value being in [0, 1e8].
    let units = (percent * PER_PERCENT as f64).round() as u128;
    let by_percent = live as u128 * units / WHOLE;
    // Never above `live`, as `units <= WHOLE`, so the cast back is exact.
    let by_percent = usize::try_from(by_percent).unwrap_or(live);
    let max_pods = usize::try_from(radius.max_pods).unwrap_or(0);
    by_percent.min(max_pods)
}

/// What the selection gave.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Selection {
    /// These pods, with the others under chaos, fill the cap.
    Chosen {
        /// The pods to target, sorted by name.
        pods: Vec<String>,
        /// The workload's live pods.
        live: usize,
        /// The cap for that many live pods.
        cap: usize,
    },
    /// The cap is 0: even one pod would exceed it.
    TooSmall {
        /// The workload's live pods.
        live: usize,
        /// The cap for that many live pods (0).
        cap: usize,
    },
    /// Pods under chaos from other runs already fill the cap.
    BudgetExhausted {
        /// The workload's live pods.
        live: usize,
        /// The cap for that many live pods.
        cap: usize,
        /// The workload's pods already under chaos.
        under_chaos: usize,
    },
}

impl Selection {
    /// A stable CamelCase reason for conditions and Events.
    pub fn reason(&self) -> DrillReason {
        match self {
            Self::Chosen { .. } => DrillReason::Chosen,
            Self::TooSmall { .. } => DrillReason::FleetTooSmall,
            Self::BudgetExhausted { .. } => DrillReason::BudgetExhausted,
        }
    }

    /// Why, as one sentence with the numbers and the rule.
    pub fn message(&self) -> String {
        match self {
            Self::Chosen { pods, live, cap } => {
                // Chosen fills the cap exactly, so the rest were under chaos.
                let under_chaos = cap.saturating_sub(pods.len());
                format!(
                    "{} of {live} live pods chosen ({}): with {under_chaos} already under \
                     chaos, the namespace holds the blast-radius cap of {cap}",
                    pods.len(),
                    pods.join(", ")
                )
            }
            Self::TooSmall { live, cap } => format!(
                "{live} live pods allow a blast-radius cap of {cap} (maxPercent of the live \
                 pods rounded down, at most maxPods): even one pod would exceed it"
            ),
            Self::BudgetExhausted {
                live,
                cap,
                under_chaos,
            } => format!(
                "{under_chaos} pods are already under chaos in the namespace and the \
                 blast-radius cap for {live} live pods is {cap}: no pod is left to choose"
            ),
        }
    }
}

/// Picks `cap - under_chaos` pods among the live pods not already under
/// chaos, pseudo-randomly but reproducibly from `seed`. `under_chaos` names
/// the pods any run of the namespace holds; names that are not among `pods`
/// are ignored. `pending` killed pods, gone from `pods` and not yet replaced
/// by a live one, count as held and as part of the fleet.
pub fn select(
    pods: &[Candidate],
    under_chaos: &BTreeSet<String>,
    pending: usize,
    radius: &BlastRadius,
    seed: u64,
) -> Selection {
    // Sets: a name listed twice is still one pod.
    let names: BTreeSet<&str> = pods.iter().map(|p| p.name.as_str()).collect();
    let live: BTreeSet<&str> = pods
        .iter()
        .filter(|p| p.live())
        .map(|p| p.name.as_str())
        .collect();
    let cap = cap(live.len() + pending, radius);
    let held = under_chaos
        .iter()
        .filter(|name| names.contains(name.as_str()))
        .count()
        + pending;
    if cap == 0 {
        return Selection::TooSmall {
            live: live.len(),
            cap,
        };
    }
    if held >= cap {
        return Selection::BudgetExhausted {
            live: live.len(),
            cap,
            under_chaos: held,
        };
    }
    let mut free: Vec<&str> = live
        .iter()
        .copied()
        .filter(|name| !under_chaos.contains(*name))
        .collect();
    // The name breaks a tie of keys, so the order is total.
    free.sort_by_key(|name| (shuffle_key(seed, name), *name));
    // Enough are free: `cap <= live` and at most `held` live pods are held.
    let mut chosen: Vec<String> = free
        .into_iter()
        .take(cap - held)
        .map(str::to_owned)
        .collect();
    chosen.sort();
    Selection::Chosen {
        pods: chosen,
        live: live.len(),
        cap,
    }
}

/// A pod's place in the shuffle for `seed`: SplitMix64's finalizer over the
/// seed mixed with the name's 64-bit FNV-1a hash. Both are fixed, so a
/// choice is reproducible across builds and versions.
fn shuffle_key(seed: u64, name: &str) -> u64 {
    splitmix64(splitmix64(seed) ^ fnv1a(name))
}

/// 64-bit FNV-1a.
fn fnv1a(text: &str) -> u64 {
    const OFFSET: u64 = 0xcbf2_9ce4_8422_2325;
    const PRIME: u64 = 0x0000_0100_0000_01b3;
    text.bytes().fold(OFFSET, |hash, byte| {
        (hash ^ u64::from(byte)).wrapping_mul(PRIME)
    })
}

/// One step of SplitMix64: a bijective mix in which every input bit moves
/// every output bit.
fn splitmix64(state: u64) -> u64 {
    let mut z = state.wrapping_add(0x9e37_79b9_7f4a_7c15);
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use super::*;

    fn radius(max_percent: f64, max_pods: i32) -> BlastRadius {
        BlastRadius {
            max_percent,
            max_pods,
        }
    }

    /// `n` ready pods `gateway-000`, `gateway-001`, ...
    fn fleet(n: usize) -> Vec<Candidate> {
        (0..n)
            .map(|i| Candidate {
                name: format!("gateway-{i:03}"),
                ready: true,
                terminating: false,
            })
            .collect()
    }

    fn names(of: &[&str]) -> BTreeSet<String> {
        of.iter().map(|name| (*name).to_owned()).collect()
    }

    fn chosen(selection: &Selection) -> Vec<String> {
        match selection {
            Selection::Chosen { pods, .. } => pods.clone(),
            other => panic!("nothing chosen: {other:?}"),
        }
    }

    #[test]
    fn the_cap_rounds_down_exactly() {
        let cases = [
            // (live, maxPercent, maxPods, cap)
            (3, 10.0, 100, 0),
            (3, 33.0, 100, 0),
            (3, 33.34, 100, 1),
            (3, 66.0, 100, 1),
            (3, 66.67, 100, 2),
            (3, 100.0, 100, 3),
            (3, 100.0, 2, 2),
            (50, 2.0, 100, 1),
            (50, 0.1 + 1.9, 100, 1),
            (50, 1.99, 100, 0),
            (50, 10.0, 100, 5),
            (50, 10.0, 3, 3),
            (50, 14.0, 100, 7),
            (50, 0.29 * 100.0, 100, 14),
            // 28.999999999999996 and 56.99999999999999 as floats.
            (100, 0.29 * 100.0, 100, 29),
            (100, 0.57 * 100.0, 100, 57),
            (50, 50.0, 100, 25),
            (50, 100.0, 100, 50),
            (1000, 2.0, 100, 20),
            (1000, 2.0, 10, 10),
            (1000, 0.1, 100, 1),
            (1000, 0.099_999, 100, 0),
            (1000, 57.0, 1000, 570),
            (1000, 100.0, 1, 1),
            (0, 100.0, 100, 0),
            (1, 99.999_999, 100, 0),
            (1, 100.0, 100, 1),
        ];
        for (live, percent, max_pods, want) in cases {
            assert_eq!(
                cap(live, &radius(percent, max_pods)),
                want,
                "{live} pods at {percent} % (max {max_pods})"
            );
        }
    }

    #[test]
    fn a_third_is_whatever_floor_says() {
        let third = 100.0 / 3.0;
        // Read to a millionth, a third is 33.333333 %: of 3 pods, 0.99999999
        // of a pod, rounded down.
        assert_eq!(cap(3, &radius(third, 100)), 0);
        assert_eq!(cap(3, &radius(33.333_333, 100)), 0);
        assert_eq!(cap(300, &radius(third, 1000)), 99);
    }

    #[test]
    fn a_cap_out_of_range_fails_closed() {
        let cases = [
            (radius(0.0, 10), 0),
            (radius(-5.0, 10), 0),
            (radius(f64::NAN, 10), 0),
            (radius(f64::INFINITY, 10), 0),
            (radius(150.0, 1000), 50),
            (radius(10.0, 0), 0),
            (radius(10.0, -3), 0),
            (radius(1e-9, 10), 0),
        ];
        for (radius, want) in cases {
            assert_eq!(cap(50, &radius), want, "{radius:?}");
        }
    }

    #[test]
    fn only_live_pods_count_and_are_chosen() {
        let mut pods = fleet(10);
        pods[0].ready = false;
        pods[1].terminating = true;
        pods[2].ready = false;
        pods[2].terminating = true;
        // 7 live pods at 50 %: 3.
        for seed in 0..200 {
            let got = select(&pods, &BTreeSet::new(), 0, &radius(50.0, 100), seed);
            let Selection::Chosen {
                pods: chosen,
                live,
                cap,
            } = &got
            else {
                panic!("nothing chosen: {got:?}");
            };
            assert_eq!((*live, *cap, chosen.len()), (7, 3, 3));
            for out in ["gateway-000", "gateway-001", "gateway-002"] {
                assert!(!chosen.iter().any(|name| name == out), "{out} chosen");
            }
        }
    }

    #[test]
    fn a_cap_of_zero_is_a_fleet_too_small() {
        let got = select(&fleet(3), &BTreeSet::new(), 0, &radius(10.0, 5), 7);
        assert_eq!(got, Selection::TooSmall { live: 3, cap: 0 });
        assert_eq!(got.reason().as_str(), "FleetTooSmall");
        assert_eq!(
            got.message(),
            "3 live pods allow a blast-radius cap of 0 (maxPercent of the live pods rounded \
             down, at most maxPods): even one pod would exceed it"
        );
        // No pod at all, or none live.
        let none = select(&[], &BTreeSet::new(), 0, &radius(100.0, 5), 7);
        assert_eq!(none, Selection::TooSmall { live: 0, cap: 0 });
        let mut dead = fleet(4);
        for pod in &mut dead {
            pod.ready = false;
        }
        let got = select(&dead, &BTreeSet::new(), 0, &radius(100.0, 5), 7);
        assert_eq!(got, Selection::TooSmall { live: 0, cap: 0 });
    }

    #[test]
    fn other_runs_pods_count_against_the_cap() {
        let pods = fleet(50);
        let gateways = |of: &[usize]| -> BTreeSet<String> {
            of.iter().map(|i| format!("gateway-{i:03}")).collect()
        };
        // 50 pods at 10 %: 5.
        let cases = [
            (gateways(&[]), Some(5)),
            (gateways(&[7]), Some(4)),
            (gateways(&[7, 11, 42]), Some(2)),
            (gateways(&[1, 2, 3, 4]), Some(1)),
            // Pods of another workload, or gone, do not count.
            (
                names(&["inventory-0", "gateway-999", "gateway-001"]),
                Some(4),
            ),
            (
                names(&["inventory-0", "inventory-1", "inventory-2"]),
                Some(5),
            ),
            (gateways(&[0, 10, 20, 30, 40]), None),
            (gateways(&[0, 10, 20, 30, 40, 49]), None),
        ];
        for (held, more) in cases {
            let got = select(&pods, &held, 0, &radius(10.0, 100), 42);
            let Some(more) = more else {
                assert_eq!(got.reason().as_str(), "BudgetExhausted", "{held:?}");
                continue;
            };
            let chosen = chosen(&got);
            assert_eq!(chosen.len(), more, "{held:?}");
            assert!(chosen.iter().all(|name| !held.contains(name)), "{held:?}");
        }
        let got = select(
            &pods,
            &gateways(&[0, 10, 20, 30, 40, 49]),
            0,
            &radius(10.0, 100),
            42,
        );
        assert_eq!(
            got,
            Selection::BudgetExhausted {
                live: 50,
                cap: 5,
                under_chaos: 6
            }
        );
        assert_eq!(
            got.message(),
            "6 pods are already under chaos in the namespace and the blast-radius cap for 50 \
             live pods is 5: no pod is left to choose"
        );
    }

    #[test]
    fn a_pod_failed_by_another_run_still_counts() {
        // 10 pods, 2 of them made unready by a pod-failure run: 8 live at
        // 50 % is 4, of which those 2 hold 2.
        let mut pods = fleet(10);
        pods[3].ready = false;
        pods[4].ready = false;
        let held = names(&["gateway-003", "gateway-004"]);
        let got = select(&pods, &held, 0, &radius(50.0, 100), 1);
        let Selection::Chosen {
            pods: chosen,
            live,
            cap,
        } = &got
        else {
            panic!("nothing chosen: {got:?}");
        };
        assert_eq!((*live, *cap, chosen.len()), (8, 4, 2));
    }

    #[test]
    fn only_a_pod_the_sale_owns_through_its_deployment_is_a_candidate() {
        let owner = |kind: &str, uid: &str| (kind.to_owned(), uid.to_owned());
        let owners = BTreeMap::from([
            ("rs-1".to_owned(), owner("Deployment", "deploy-1")),
            ("deploy-1".to_owned(), owner("FlashSale", "sale-1")),
            ("rs-2".to_owned(), owner("Deployment", "deploy-2")),
            ("deploy-2".to_owned(), owner("FlashSale", "other-sale")),
        ]);
        let cases = [
            (Some(owner("ReplicaSet", "rs-1")), true),
            (Some(owner("FlashSale", "sale-1")), true),
            // Copied labels, another sale's pod, a hand-made pod.
            (Some(owner("ReplicaSet", "rs-2")), false),
            (Some(owner("ReplicaSet", "unknown")), false),
            (None, false),
        ];
        for (pod_owner, want) in cases {
            assert_eq!(
                owned_by_sale(pod_owner.as_ref(), &owners, "sale-1"),
                want,
                "{pod_owner:?}"
            );
        }
    }

    #[test]
    fn a_killed_pod_not_yet_replaced_still_counts() {
        // Ten pods at 10 %: one was killed and is gone from the list; its
        // replacement does not serve yet.
        let pods = fleet(9);
        let got = select(&pods, &BTreeSet::new(), 1, &radius(10.0, 100), 3);
        assert_eq!(got.reason().as_str(), "BudgetExhausted", "{got:?}");
        // Without the pending victim nine pods at 10 % allow none at all,
        // and with it the fleet is still ten pods.
        let wider = select(&pods, &BTreeSet::new(), 1, &radius(20.0, 100), 3);
        assert_eq!(chosen(&wider).len(), 1, "{wider:?}");
    }

    #[test]
    fn the_choice_is_reproducible_by_seed() {
        let pods = fleet(50);
        let held = names(&["gateway-013"]);
        let wide = radius(20.0, 100);
        for seed in [0, 1, 42, u64::MAX] {
            let once = select(&pods, &held, 0, &wide, seed);
            assert_eq!(select(&pods, &held, 0, &wide, seed), once, "seed {seed}");
            // The order the pods are listed in does not matter.
            let mut reversed = pods.clone();
            reversed.reverse();
            assert_eq!(
                select(&reversed, &held, 0, &wide, seed),
                once,
                "seed {seed}"
            );
        }
        assert_ne!(
            select(&pods, &held, 0, &wide, 1),
            select(&pods, &held, 0, &wide, 2)
        );
    }

    #[test]
    fn different_seeds_spread_the_choice() {
        // One pod of 50, over 5000 seeds: every pod is chosen, none often.
        let pods = fleet(50);
        let mut times: BTreeMap<String, usize> = BTreeMap::new();
        for seed in 0..5000 {
            for name in chosen(&select(&pods, &BTreeSet::new(), 0, &radius(2.0, 1), seed)) {
                *times.entry(name).or_default() += 1;
            }
        }
        assert_eq!(times.len(), 50, "{times:?}");
        // 100 expected each; a fair choice stays well within 50..150.
        assert!(times.values().all(|&n| (50..150).contains(&n)), "{times:?}");
    }

    #[test]
    fn the_hashes_are_the_published_ones() {
        // FNV-1a 64 test vectors, and SplitMix64's first output for seed 0.
        assert_eq!(fnv1a(""), 0xcbf2_9ce4_8422_2325);
        assert_eq!(fnv1a("a"), 0xaf63_dc4c_8601_ec8c);
        assert_eq!(fnv1a("foobar"), 0x8594_4171_f739_67e8);
        assert_eq!(splitmix64(0), 0xe220_a839_7b1d_cdaf);
    }

    #[test]
    fn the_message_names_the_pods_and_the_numbers() {
        let got = Selection::Chosen {
            pods: vec!["gateway-004".to_owned(), "gateway-031".to_owned()],
            live: 50,
            cap: 5,
        };
        assert_eq!(got.reason().as_str(), "Chosen");
        assert_eq!(
            got.message(),
            "2 of 50 live pods chosen (gateway-004, gateway-031): with 3 already under chaos, \
             the namespace holds the blast-radius cap of 5"
        );
    }

    #[test]
    fn the_cap_holds_for_every_fleet_percent_and_budget() {
        // Percents in tenths, so the bound is integer arithmetic.
        let tenths: [u64; 12] = [1, 5, 10, 20, 25, 100, 200, 333, 334, 500, 999, 1000];
        let mut sizes: Vec<usize> = (0..=120).collect();
        sizes.extend([199, 200, 999, 1000, 1001]);
        for &size in &sizes {
            let mut pods = fleet(size);
            // Every seventh pod not ready, every eleventh terminating.
            for (i, pod) in pods.iter_mut().enumerate() {
                pod.ready = i % 7 != 3;
                pod.terminating = i % 11 == 5;
            }
            let live: Vec<&Candidate> = pods.iter().filter(|p| p.live()).collect();
            for &tenth in &tenths {
                for max_pods in [1, 2, 5, 20, 10_000] {
                    let radius = radius(tenth as f64 / 10.0, max_pods);
                    let bound = (live.len() as u64 * tenth / 1000).min(max_pods as u64);
                    let cap = cap(live.len(), &radius);
                    assert_eq!(cap as u64, bound, "{size} pods at {radius:?}");
                    // Other runs hold some pods: every fifth name, up to 3.
                    for held_count in [0, 1, 3] {
                        let held: BTreeSet<String> = pods
                            .iter()
                            .step_by(5)
                            .take(held_count)
                            .map(|p| p.name.clone())
                            .collect();
                        let seed = (size * 31 + held_count) as u64 ^ tenth;
                        let got = select(&pods, &held, 0, &radius, seed);
                        let context = format!("{size} pods, {radius:?}, held {held:?}");
                        let under = held.len();
                        match got {
                            Selection::TooSmall { cap: 0, .. } => {
                                assert_eq!(bound, 0, "{context}")
                            }
                            Selection::BudgetExhausted { under_chaos, .. } => {
                                assert!(under_chaos as u64 >= bound, "{context}");
                                assert_eq!(under_chaos, under, "{context}");
                            }
                            Selection::Chosen { pods: chosen, .. } => {
                                assert_eq!(chosen.len(), cap - under, "{context}");
                                assert!((chosen.len() + under) as u64 <= bound, "{context}");
                                assert!(chosen.is_sorted(), "{context}");
                                let unique: BTreeSet<&String> = chosen.iter().collect();
                                assert_eq!(unique.len(), chosen.len(), "{context}");
                                for name in &chosen {
                                    assert!(!held.contains(name), "{name}: {context}");
                                    assert!(
                                        live.iter().any(|p| &p.name == name),
                                        "{name}: {context}"
                                    );
                                }
                            }
                            other => panic!("{other:?}: {context}"),
                        }
                    }
                }
            }
        }
    }
}
