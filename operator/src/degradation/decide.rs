//! Placeholder, filled in by the decide module work.
