//! The operator tests' drill scene (`operator/tests/common/drill.rs`) and
//! gauge exporter, included by path; the `super` items the scene takes from
//! the tests' `common` are given here, with the release operator in place
//! of the test build.

#[allow(dead_code)] // likewise
#[path = "../../tests/common/chart.rs"]
pub mod chart;
#[allow(dead_code)] // the scene's helpers this benchmark does not call
#[path = "../../tests/common/drill.rs"]
pub mod drill;
#[allow(dead_code)] // likewise
#[path = "../../tests/common/exporter.rs"]
pub mod exporter;

pub use super::operator::{Operator, setup};
