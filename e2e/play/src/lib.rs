//! Plays a whole flash sale on the local stack and proves what happened:
//! buyers under load (`buyers`), the scenario that drives the sale, its
//! degradation policy and a chaos drill (`scenario`), and the report made
//! from the run's own data (`report`).

pub mod buyers;
pub mod report;
pub mod scenario;
