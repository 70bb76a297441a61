//! What more than one controller reads from the running system: the
//! Prometheus load signal ([`signal`]), the workloads' own figures through
//! their ops port ([`probe`]), which pods are ready ([`pods`], [`replicas`]),
//! a standby region's replication and endpoint ([`standby`]), and the orders
//! a region's database holds ([`orders`]).
//! Reading only: nothing here writes to the apiserver.

pub mod orders;
pub mod pods;
pub mod probe;
pub mod replicas;
pub mod signal;
pub mod standby;
