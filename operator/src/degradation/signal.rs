//! Placeholder, filled in by the signal module work.
