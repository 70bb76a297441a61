//! Helpers for tests that run against the local stack (`e2e/local/stack`):
//! where each component is, and how to wait for a condition with a deadline
//! instead of sleeping.

pub mod browser;
pub mod clusters;
pub mod faults;
pub mod kafka;
pub mod kube;
pub mod operator;
pub mod private_redis;
pub mod redis_keys;
pub mod sales;
pub mod stack;
pub mod wait;
