//! What more than one controller reads from the running system: the
//! Prometheus load signal ([`signal`]), the workloads' own figures through
//! their ops port ([`probe`]), which pods are ready ([`pods`], [`replicas`]),
//! and a standby region's replication and endpoint ([`standby`]).
//! Reading only: nothing here writes to the apiserver.

pub mod pods;
pub mod probe;
pub mod replicas;
pub mod signal;
pub mod standby;
