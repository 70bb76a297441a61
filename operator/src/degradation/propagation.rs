//! Placeholder, filled in by the propagation module work.
