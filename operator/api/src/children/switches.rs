//! The one child of a sale that another controller writes: the
//! `<sale>-degradation` ConfigMap of the DegradationPolicy controller.

use k8s_openapi::api::core::v1::ConfigMap;

use super::{BuildError, Component, Owner, names};
use crate::FlashSale;

/// The `<sale>-degradation` ConfigMap holding `state`, in the format of the
/// `flashsale-degradation` contract, labelled and owned like the sale's
/// other children so it goes with the sale. Only the DegradationPolicy
/// controller writes it.
pub fn degradation_config_map(
    sale: &FlashSale,
    state: &flashsale_degradation::Degradation,
) -> Result<ConfigMap, BuildError> {
    let owner = Owner::new(sale)?;
    Ok(ConfigMap {
        metadata: owner.object_meta(names::degradation(sale), Component::Gateway),
        data: Some(state.to_data()),
        ..ConfigMap::default()
    })
}
