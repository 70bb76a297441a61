//! Smoke tests: each proves one component of the local stack is the real
//! thing and reachable. A missing component fails its test; nothing is skipped.

mod chaos_mesh;
mod kafka;
mod kube;
mod prometheus;
mod redis;
mod sql;
mod stores;
