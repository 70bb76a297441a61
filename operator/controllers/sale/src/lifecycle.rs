//! How big a sale's workloads are in each phase of its timeline: a pure
//! function, so every transition is tested without waiting for it.

use flashsale_api::flashsale::SalePhase;

use super::build::Stage;

/// How big the workloads are for a scheduled phase. A sale scales to zero only
/// once settled and with the order-writer's lag seen at zero: until then a
/// late payment must still reach the database. `drained` is sticky (it comes
/// from the status), because after scaling to zero the lag can no longer be
/// read.
pub fn stage(phase: SalePhase, settled: bool, drained: bool) -> Stage {
    match phase {
        SalePhase::Pending => Stage::Pending,
        SalePhase::WarmingUp | SalePhase::Live => Stage::Active,
        SalePhase::Ended if settled && drained => Stage::Drained,
        // Failed is never scheduled; it is reported over the scheduled phase.
        SalePhase::Ended | SalePhase::Failed => Stage::Ending,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn workloads_scale_to_zero_only_when_settled_and_drained() {
        assert_eq!(stage(SalePhase::Pending, false, false), Stage::Pending);
        assert_eq!(stage(SalePhase::WarmingUp, false, false), Stage::Active);
        assert_eq!(stage(SalePhase::Live, false, false), Stage::Active);
        assert_eq!(stage(SalePhase::Ended, false, false), Stage::Ending);
        assert_eq!(stage(SalePhase::Ended, false, true), Stage::Ending);
        assert_eq!(stage(SalePhase::Ended, true, false), Stage::Ending);
        assert_eq!(stage(SalePhase::Ended, true, true), Stage::Drained);
    }
}
