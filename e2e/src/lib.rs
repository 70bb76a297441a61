//! The test kit of the project, for tests, benchmarks and the play that run
//! against the local stack (`e2e/local/stack`): where each component is, how
//! to wait for a condition with a deadline instead of sleeping, where the
//! checkout is, the operator process, the standby region and its global
//! endpoint, a Service reached from outside the cluster (by its cluster IP
//! or through the apiserver alone), the cluster's stores as its Secret
//! names them and which store an address leads to, a slow dependency the
//! test owns, and the worlds tests
//! build (a drill's scene, an exporter the test sets, the chart and its
//! rights, the drill library, the audit log, Prometheus's rules and alerts,
//! the gateway's funnel, order topics, a sale on the real node).

pub mod audit;
pub mod browser;
pub mod chart;
pub mod checkout;
pub mod clusters;
pub mod delay;
pub mod drill;
pub mod exporter;
pub mod faults;
pub mod forward;
pub mod funnel;
pub mod gateway_command;
pub mod inside;
pub mod kafka;
pub mod kube;
pub mod library;
pub mod metrics;
pub mod operator;
pub mod order_flow;
pub mod orders;
pub mod private_redis;
pub mod prometheus;
pub mod reach;
pub mod real_node;
pub mod redis_connection;
pub mod redis_keys;
pub mod region;
pub mod sales;
pub mod same_store;
pub mod stack;
pub mod stores;
pub mod wait;
