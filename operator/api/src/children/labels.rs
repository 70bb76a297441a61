//! The labels every child carries (DESIGN contract) and the selector labels
//! of a workload's pods.

use std::collections::BTreeMap;

use super::names::Component;

pub use flashsale_degradation::{MANAGED_BY, MANAGED_BY_KEY};
/// `app.kubernetes.io/part-of`: the sale's name.
pub const PART_OF_KEY: &str = "app.kubernetes.io/part-of";
/// `app.kubernetes.io/component`: gateway, inventory or order-writer.
pub const COMPONENT_KEY: &str = "app.kubernetes.io/component";
/// `app.kubernetes.io/name`: the component again, for generic dashboards.
pub const NAME_KEY: &str = "app.kubernetes.io/name";

/// Labels every child carries: managed-by, part-of, component and name.
pub fn labels(sale_name: &str, component: Component) -> BTreeMap<String, String> {
    let mut labels = selector(sale_name, component);
    labels.insert(MANAGED_BY_KEY.to_owned(), MANAGED_BY.to_owned());
    labels.insert(NAME_KEY.to_owned(), component.label().to_owned());
    labels
}

/// The selector labels of a workload's pods: part-of and component only,
/// because Deployment selectors are immutable and must never have to change.
pub fn selector(sale_name: &str, component: Component) -> BTreeMap<String, String> {
    BTreeMap::from([
        (PART_OF_KEY.to_owned(), sale_name.to_owned()),
        (COMPONENT_KEY.to_owned(), component.label().to_owned()),
    ])
}
