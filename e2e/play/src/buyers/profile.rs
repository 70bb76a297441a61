//! The load's shape over time: which share of the buyers is active.

use std::time::Duration;

/// One stretch of the profile: the active share moves linearly from `from`
/// to `to` over `duration`.
#[derive(Debug, Clone, PartialEq)]
pub struct Phase {
    /// What the phase is called ("warm", "ramp up", ...), for markers.
    pub name: String,
    /// How long it lasts.
    pub duration: Duration,
    /// Active share (0-1) at its start.
    pub from: f64,
    /// Active share (0-1) at its end.
    pub to: f64,
}

impl Phase {
    /// A phase named `name`.
    pub fn new(name: &str, duration: Duration, from: f64, to: f64) -> Self {
        Self {
            name: name.to_owned(),
            duration,
            from,
            to,
        }
    }
}

/// Why a profile was refused.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum ProfileError {
    /// No phase at all.
    #[error("a load profile needs at least one phase")]
    Empty,
    /// A share outside 0-1.
    #[error("phase {phase:?}: shares must lie within 0-1, got {share}")]
    Share {
        /// The phase's name.
        phase: String,
        /// The share.
        share: f64,
    },
}

/// Phases one after the other; after the last, the load holds at its `to`.
#[derive(Debug, Clone, PartialEq)]
pub struct Profile {
    phases: Vec<Phase>,
}

/// The share of the warm-up and the tail in [`Profile::sale`].
pub const LOW_SHARE: f64 = 0.1;

impl Profile {
    /// A profile of `phases`, checked.
    pub fn new(phases: Vec<Phase>) -> Result<Self, ProfileError> {
        if phases.is_empty() {
            return Err(ProfileError::Empty);
        }
        for phase in &phases {
            for share in [phase.from, phase.to] {
                if !(0.0..=1.0).contains(&share) {
                    return Err(ProfileError::Share {
                        phase: phase.name.clone(),
                        share,
                    });
                }
            }
        }
        Ok(Self { phases })
    }

    /// `share` of the buyers from the start, held.
    pub fn constant(share: f64) -> Result<Self, ProfileError> {
        Self::new(vec![Phase::new("constant", Duration::ZERO, share, share)])
    }

    /// The usual shape of a sale over `total`: warm (10% of the time at
    /// [`LOW_SHARE`]), ramp up to every buyer (20%), plateau (40%), ramp
    /// down (15%), tail at [`LOW_SHARE`] (15%).
    pub fn sale(total: Duration) -> Self {
        let part = |percent: u32| total * percent / 100;
        let (warm, up, plateau, down) = (part(10), part(20), part(40), part(15));
        // The tail takes what rounding left, so the phases add up to `total`.
        let tail = total.saturating_sub(warm + up + plateau + down);
        Self {
            phases: vec![
                Phase::new("warm", warm, LOW_SHARE, LOW_SHARE),
                Phase::new("ramp up", up, LOW_SHARE, 1.0),
                Phase::new("plateau", plateau, 1.0, 1.0),
                Phase::new("ramp down", down, 1.0, LOW_SHARE),
                Phase::new("tail", tail, LOW_SHARE, LOW_SHARE),
            ],
        }
    }

    /// The phases, in order.
    pub fn phases(&self) -> &[Phase] {
        &self.phases
    }

    /// The sum of the phases' durations.
    pub fn total(&self) -> Duration {
        self.phases.iter().map(|p| p.duration).sum()
    }

    /// Each phase with its start (from the run's start), in order; the
    /// boundaries a caller marks.
    pub fn starts(&self) -> Vec<(Duration, &Phase)> {
        let mut at = Duration::ZERO;
        self.phases
            .iter()
            .map(|phase| {
                let start = at;
                at += phase.duration;
                (start, phase)
            })
            .collect()
    }

    /// Where the first phase called `name` starts.
    pub fn start_of(&self, name: &str) -> Option<Duration> {
        self.starts()
            .into_iter()
            .find(|(_, phase)| phase.name == name)
            .map(|(at, _)| at)
    }

    /// The active share `elapsed` after the start: linear within a phase,
    /// the last `to` after the end.
    pub fn share_at(&self, elapsed: Duration) -> f64 {
        let mut start = Duration::ZERO;
        for phase in &self.phases {
            let end = start + phase.duration;
            if elapsed < end {
                let into = (elapsed - start).as_secs_f64() / phase.duration.as_secs_f64();
                return phase.from + (phase.to - phase.from) * into;
            }
            start = end;
        }
        self.phases.last().map_or(0.0, |p| p.to)
    }

    /// How many of `users` buyers are active `elapsed` after the start:
    /// `round(share × users)`; buyer `i` is active while `i` is below it.
    pub fn active_at(&self, elapsed: Duration, users: usize) -> usize {
        // Within 0..=users since the share lies within 0-1.
        (self.share_at(elapsed) * users as f64).round() as usize
    }
}
