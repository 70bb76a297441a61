//! Leader election through a coordination.k8s.io Lease.
