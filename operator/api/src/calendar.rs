//! When a drill may run: the ticks of its cron in its time zone, and whether
//! its windows and blackouts allow injection at an instant.
//!
//! Cron ticks are wall-clock times in the drill's zone, turned into instants
//! the way most crons and jiff's `compatible` do it:
//!
//! - a time that a spring-forward gap skips runs as far after the gap as it
//!   was into it (02:30 in New York's 02:00 to 03:00 gap runs at 03:30 EDT);
//!   times that land on the same instant (an hourly cron's 02:00 and 03:00
//!   that night) run once;
//! - a time that a fall-back fold repeats runs once, at its first occurrence
//!   (01:30 EDT, not 01:30 EST); so an hourly cron runs at 01:00 EDT and then
//!   at 02:00 EST, two hours apart, and never in the repeated hour.
//!
//! Windows are read off the wall clock at the instant in question; blackouts
//! are absolute and beat windows.

use jiff::{
    SignedDuration, Timestamp, ToSpan,
    civil::{Date, DateTime},
    tz::{AmbiguousOffset, TimeZone},
};

use crate::{
    ChaosDrillSpec, chaosdrill::Blackout, chaosdrill::Weekday, chaosdrill::Window,
    reasons::DrillReason,
};

/// How far past `after` a search looks, in days: beyond the longest wait of
/// any cron that matches at all (29 February, eight years apart across 2100).
/// A cron that never meets a window gives up after this long.
const HORIZON_DAYS: i32 = 9 * 366;

/// Minutes in a day: a window's `24:00` end.
const MINUTES_PER_DAY: i32 = 24 * 60;

/// What makes a ChaosDrill's calendar unusable, with the field it is in.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum CalendarError {
    /// `spec.schedule.cron` is not a five-field cron expression.
    #[error("spec.schedule.cron: invalid cron expression {expression:?}: {problem}")]
    Cron {
        /// The expression as written.
        expression: String,
        /// What is wrong with it.
        problem: String,
    },
    /// `spec.schedule.timeZone` is not in the bundled tz database.
    #[error(
        "spec.schedule.timeZone: unknown time zone {0:?} (use an IANA name such as Asia/Tokyo)"
    )]
    TimeZone(String),
    /// A window's start or end is not a local time.
    #[error(
        "spec.windows[{index}].{field}: {value:?} is not a local time HH:MM (00:00 to 23:59, or 24:00 for an end)"
    )]
    WindowTime {
        /// Position of the window in `spec.windows`.
        index: usize,
        /// `start` or `end`.
        field: &'static str,
        /// The time as written.
        value: String,
    },
    /// A window ends at or before it starts.
    #[error(
        "spec.windows[{index}].end: {end:?} is not after start {start:?} (windows do not cross midnight)"
    )]
    WindowOrder {
        /// Position of the window in `spec.windows`.
        index: usize,
        /// The start as written.
        start: String,
        /// The end as written.
        end: String,
    },
    /// A window opens on no day.
    #[error("spec.windows[{index}].days: a window needs at least one day")]
    WindowDays {
        /// Position of the window in `spec.windows`.
        index: usize,
    },
    /// A blackout ends at or before it starts.
    #[error("spec.blackouts[{index}].end: {end} is not after start {start}")]
    BlackoutOrder {
        /// Position of the blackout in `spec.blackouts`.
        index: usize,
        /// Its start.
        start: Timestamp,
        /// Its end.
        end: Timestamp,
    },
}

/// Whether injection is allowed at an instant, and if not, why.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Allowance {
    /// Inside a window (or there are none) and outside every blackout.
    Allowed,
    /// Outside every window.
    OutsideWindows,
    /// Inside a blackout.
    InBlackout {
        /// The reason of the first blackout (in spec order) containing the instant.
        reason: Option<String>,
        /// When the blackouts containing the instant, and any they run into, end.
        until: Timestamp,
    },
}

impl Allowance {
    /// The reason for conditions and events: `Allowed`, `OutsideWindow`
    /// or `InBlackout`.
    pub fn reason(&self) -> DrillReason {
        match self {
            Self::Allowed => DrillReason::Allowed,
            Self::OutsideWindows => DrillReason::OutsideWindow,
            Self::InBlackout { .. } => DrillReason::InBlackout,
        }
    }
}

/// Whether `expression` is a five-field cron expression this calendar
/// runs; what is wrong with it if not.
pub fn check_cron(expression: &str) -> Result<(), String> {
    Cron::parse(expression).map(drop)
}

/// When a drill may run: its cron in its IANA time zone, its windows and
/// blackouts.
#[derive(Debug, Clone)]
pub struct Calendar {
    cron: Cron,
    tz: TimeZone,
    windows: Vec<OpenWindow>,
    blackouts: Vec<Closed>,
}

impl Calendar {
    /// The calendar of a drill, or the first field that makes it unusable.
    pub fn new(spec: &ChaosDrillSpec) -> Result<Self, CalendarError> {
        let schedule = &spec.schedule;
        let cron = Cron::parse(&schedule.cron).map_err(|problem| CalendarError::Cron {
            expression: schedule.cron.clone(),
            problem,
        })?;
        let tz = TimeZone::get(&schedule.time_zone)
            .map_err(|_| CalendarError::TimeZone(schedule.time_zone.clone()))?;
        let windows = spec
            .windows
            .iter()
            .enumerate()
            .map(|(index, window)| OpenWindow::new(index, window))
            .collect::<Result<_, _>>()?;
        let blackouts = spec
            .blackouts
            .iter()
            .enumerate()
            .map(|(index, blackout)| Closed::new(index, blackout))
            .collect::<Result<_, _>>()?;
        Ok(Self {
            cron,
            tz,
            windows,
            blackouts,
        })
    }

    /// The first cron tick strictly after `after`, ignoring windows and
    /// blackouts; `None` when the cron has none within about nine years.
    pub fn next_tick(&self, after: Timestamp) -> Option<Timestamp> {
        let from = after.checked_add(SignedDuration::from_nanos(1)).ok()?;
        self.first_tick(from, self.horizon(after))
    }

    /// The first cron tick strictly after `after` that is allowed (inside a
    /// window, outside every blackout); `None` when there is none within
    /// about nine years, as for a cron that never meets a window.
    pub fn next_run(&self, after: Timestamp) -> Option<Timestamp> {
        let last = self.horizon(after);
        let mut from = after.checked_add(SignedDuration::from_nanos(1)).ok()?;
        loop {
            let tick = self.first_tick(from, last)?;
            // Jump over what cannot be allowed instead of trying every tick;
            // always past this tick, so the search ends.
            let past = tick.checked_add(SignedDuration::from_nanos(1)).ok()?;
            from = match self.allowance(tick) {
                Allowance::Allowed => return Some(tick),
                Allowance::InBlackout { until, .. } => until,
                Allowance::OutsideWindows => self.next_opening(tick).unwrap_or(past),
            }
            .max(past);
        }
    }

    /// Whether injection is allowed at `at`. A blackout beats a window.
    pub fn allowance(&self, at: Timestamp) -> Allowance {
        if let Some(blackout) = self.blackouts.iter().find(|b| b.contains(at)) {
            return Allowance::InBlackout {
                reason: blackout.reason.clone(),
                until: self.blackout_end(at),
            };
        }
        let wall = self.tz.to_datetime(at);
        if self.windows.is_empty() || self.windows.iter().any(|w| w.contains(wall)) {
            Allowance::Allowed
        } else {
            Allowance::OutsideWindows
        }
    }

    /// The end of the allowed period containing `at` (the close of its
    /// window, or of back-to-back windows, or the start of the next blackout,
    /// whichever comes first), or `None` when `at` is not allowed. Used to
    /// bound a run; `Timestamp::MAX` when nothing ever ends the period.
    pub fn allowed_until(&self, at: Timestamp) -> Option<Timestamp> {
        if self.allowance(at) != Allowance::Allowed {
            return None;
        }
        let window_close = if self.windows.is_empty() {
            Timestamp::MAX
        } else {
            self.window_close(at)
        };
        let blackout_start = self
            .blackouts
            .iter()
            .map(|b| b.start)
            .filter(|start| *start > at)
            .min()
            .unwrap_or(Timestamp::MAX);
        Some(window_close.min(blackout_start))
    }

    /// The last wall-clock date a search from `from` looks at.
    fn horizon(&self, from: Timestamp) -> Date {
        let today = self.tz.to_datetime(from).date();
        today.checked_add(HORIZON_DAYS.days()).unwrap_or(Date::MAX)
    }

    /// The earliest tick at or after `from` whose wall-clock date is at most
    /// `last`.
    fn first_tick(&self, from: Timestamp, last: Date) -> Option<Timestamp> {
        let mut last = last;
        let mut best: Option<(Timestamp, DateTime)> = None;
        let mut cursor = self.scan_start(from);
        while let Some(wall) = self.cron.next_match(cursor, last) {
            // Later wall-clock times run at later instants, except times in a
            // gap, which run after it: by the wall time of the best tick.
            if best.is_some_and(|(_, best_wall)| wall > best_wall) {
                break;
            }
            let tick = self.tz.to_ambiguous_timestamp(wall).compatible().ok()?;
            if tick >= from && best.is_none_or(|(best_tick, _)| tick < best_tick) {
                let tick_wall = self.tz.to_datetime(tick);
                last = last.min(tick_wall.date());
                best = Some((tick, tick_wall));
            }
            cursor = wall.checked_add(SignedDuration::from_mins(1)).ok()?;
        }
        best.map(|(tick, _)| tick)
    }

    /// Where on the wall clock a search for ticks at or after `from` starts:
    /// earlier by the jump when the clock sprang forward within the last day,
    /// because a time in that gap runs after it, perhaps at `from` or later.
    fn scan_start(&self, from: Timestamp) -> DateTime {
        let wall = self.tz.to_datetime(from);
        from.checked_sub(SignedDuration::from_hours(24))
            .map_or(wall, |day_before| {
                self.tz.to_offset(day_before).to_datetime(from).min(wall)
            })
    }

    /// The first instant after `at` (outside every window) at which a window
    /// opens. No tick in between can be allowed.
    fn next_opening(&self, at: Timestamp) -> Option<Timestamp> {
        let wall = self.tz.to_datetime(at);
        // Days in order, so the first day with an opening has the first one.
        let opening = (0..=7)
            .filter_map(|days| wall.date().checked_add(days.days()).ok())
            .find_map(|date| {
                self.windows
                    .iter()
                    .filter(|w| w.open_on(date))
                    .filter_map(|w| wall_clock(date, w.start))
                    .filter(|opening| *opening > wall)
                    .min()
            })?;
        self.reach(opening, at)
    }

    /// When the windows containing `at`, and any they run into, close.
    fn window_close(&self, at: Timestamp) -> Timestamp {
        let wall = self.tz.to_datetime(at);
        // Back-to-back windows chained for more than a week never close.
        let never = wall.checked_add(8.days()).unwrap_or(DateTime::MAX);
        let mut close = wall;
        while let Some(later) = self
            .windows
            .iter()
            .filter(|w| w.contains(close))
            .filter_map(|w| wall_clock(close.date(), w.end))
            .max()
        {
            if later > never {
                return Timestamp::MAX;
            }
            close = later;
        }
        self.reach(close, at).unwrap_or(Timestamp::MAX)
    }

    /// When the blackouts containing `at`, and any they run into, end.
    fn blackout_end(&self, at: Timestamp) -> Timestamp {
        let mut end = at;
        while let Some(later) = self
            .blackouts
            .iter()
            .filter(|b| b.contains(end))
            .map(|b| b.end)
            .max()
        {
            end = later;
        }
        end
    }

    /// The first instant after `after` at which the wall clock reads `wall`
    /// or later: the end of the gap for a time a gap skips, the first
    /// occurrence after `after` for a time a fold repeats.
    fn reach(&self, wall: DateTime, after: Timestamp) -> Option<Timestamp> {
        let ambiguous = self.tz.to_ambiguous_timestamp(wall);
        match ambiguous.offset() {
            AmbiguousOffset::Gap { .. } => {
                let before_gap = ambiguous.earlier().ok()?;
                self.tz.following(before_gap).next().map(|t| t.timestamp())
            }
            _ => [ambiguous.earlier().ok()?, ambiguous.later().ok()?]
                .into_iter()
                .find(|instant| *instant > after),
        }
    }
}

/// `minutes` after the start of `date` on the wall clock.
fn wall_clock(date: Date, minutes: i32) -> Option<DateTime> {
    date.at(0, 0, 0, 0)
        .checked_add(SignedDuration::from_mins(i64::from(minutes)))
        .ok()
}

/// Minutes since midnight of a wall-clock time, seconds dropped.
fn minute_of_day(wall: DateTime) -> i32 {
    i32::from(wall.hour()) * 60 + i32::from(wall.minute())
}

/// Whether `set` (bit n for value n) holds `value`.
fn has(set: u64, value: i8) -> bool {
    (set >> value) & 1 == 1
}

/// The smallest value of `set` at or above `from`.
fn first_from(set: u64, from: i8) -> Option<i8> {
    let rest = (set >> from) << from;
    if rest == 0 {
        return None;
    }
    i8::try_from(rest.trailing_zeros()).ok()
}

/// A parsed five-field cron expression: each field as the set of values it
/// matches, bit n for value n.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Cron {
    minutes: u64,
    hours: u64,
    days_of_month: u64,
    months: u64,
    /// 0 is Sunday (a written 7 is folded onto it).
    days_of_week: u64,
    /// Vixie cron's rule: when both day fields are restricted, a day matches
    /// if either does; a field starting with `*` (`*`, `*/2`) is unrestricted.
    either_day: bool,
}

impl Cron {
    /// Parses `minute hour day-of-month month day-of-week`.
    fn parse(expression: &str) -> Result<Self, String> {
        let fields: Vec<&str> = expression.split_whitespace().collect();
        let &[minute, hour, day_of_month, month, day_of_week] = fields.as_slice() else {
            return Err(format!(
                "expected five fields (minute hour day-of-month month day-of-week), found {}",
                fields.len()
            ));
        };
        // In field order, so the first problem reported is the leftmost.
        let minutes = MINUTE.parse(minute)?;
        let hours = HOUR.parse(hour)?;
        let days_of_month = DAY_OF_MONTH.parse(day_of_month)?;
        let months = MONTH.parse(month)?;
        let days_of_week = DAY_OF_WEEK.parse(day_of_week)?;
        Ok(Self {
            minutes,
            hours,
            days_of_month,
            months,
            // 7 is Sunday too.
            days_of_week: (days_of_week & 0x7f) | (days_of_week >> 7),
            either_day: !day_of_month.starts_with('*') && !day_of_week.starts_with('*'),
        })
    }

    /// The first matching wall-clock minute at or after the minute of `from`,
    /// on or before `last`. Walks months, then days, then hours and minutes.
    fn next_match(&self, from: DateTime, last: Date) -> Option<DateTime> {
        let mut date = from.date();
        let mut earliest = (from.hour(), from.minute());
        while date <= last {
            if !has(self.months, date.month()) {
                date = date.last_of_month().tomorrow().ok()?;
            } else {
                if self.day_matches(date)
                    && let Some((hour, minute)) = self.time_from(earliest)
                {
                    return Some(date.at(hour, minute, 0, 0));
                }
                date = date.tomorrow().ok()?;
            }
            earliest = (0, 0);
        }
        None
    }

    /// Whether `date` matches the day fields.
    fn day_matches(&self, date: Date) -> bool {
        let by_month = has(self.days_of_month, date.day());
        let by_week = has(self.days_of_week, date.weekday().to_sunday_zero_offset());
        if self.either_day {
            by_month || by_week
        } else {
            by_month && by_week
        }
    }

    /// The first matching hour and minute at or after `(hour, minute)`.
    fn time_from(&self, (hour, minute): (i8, i8)) -> Option<(i8, i8)> {
        (hour..24).filter(|h| has(self.hours, *h)).find_map(|h| {
            let from = if h == hour { minute } else { 0 };
            first_from(self.minutes, from).map(|m| (h, m))
        })
    }
}

/// One field of a cron expression: its bounds and the names it accepts.
struct FieldKind {
    /// Name in messages.
    name: &'static str,
    min: i8,
    max: i8,
    /// Names of the values from `min` on, matched without regard to case.
    names: &'static [&'static str],
    /// What a value may be, in messages.
    expected: &'static str,
}

const MINUTE: FieldKind = FieldKind {
    name: "minute",
    min: 0,
    max: 59,
    names: &[],
    expected: "a number",
};

const HOUR: FieldKind = FieldKind {
    name: "hour",
    min: 0,
    max: 23,
    names: &[],
    expected: "a number",
};

const DAY_OF_MONTH: FieldKind = FieldKind {
    name: "day-of-month",
    min: 1,
    max: 31,
    names: &[],
    expected: "a number",
};

const MONTH: FieldKind = FieldKind {
    name: "month",
    min: 1,
    max: 12,
    names: &[
        "JAN", "FEB", "MAR", "APR", "MAY", "JUN", "JUL", "AUG", "SEP", "OCT", "NOV", "DEC",
    ],
    expected: "a number or a month name (JAN-DEC)",
};

/// 0 and 7 are both Sunday.
const DAY_OF_WEEK: FieldKind = FieldKind {
    name: "day-of-week",
    min: 0,
    max: 7,
    names: &["SUN", "MON", "TUE", "WED", "THU", "FRI", "SAT"],
    expected: "a number or a day name (SUN-SAT)",
};

impl FieldKind {
    /// The values of a comma-separated list of `*`, `a` and `a-b`, the
    /// first and last with an optional `/step`.
    fn parse(&self, text: &str) -> Result<u64, String> {
        text.split(',')
            .try_fold(0, |set, item| Ok(set | self.item(item)?))
            .map_err(|problem: String| format!("{}: {problem}", self.name))
    }

    /// The values of one list item.
    fn item(&self, item: &str) -> Result<u64, String> {
        let (range, step) = match item.split_once('/') {
            Some((range, step)) => (range, Some(self.step(step)?)),
            None => (item, None),
        };
        let (first, last) = match range.split_once('-') {
            _ if range == "*" => (self.min, self.max),
            Some((first, last)) => (self.value(first)?, self.value(last)?),
            None if step.is_some() => {
                return Err(format!(
                    "{item:?} steps from a single value; write */n or a-b/n"
                ));
            }
            None => {
                let value = self.value(range)?;
                (value, value)
            }
        };
        if first > last {
            return Err(format!("range {range:?} runs backwards"));
        }
        Ok((first..=last)
            .step_by(step.unwrap_or(1))
            .fold(0, |set, value| set | (1 << value)))
    }

    /// One value: a number within the bounds, or a name.
    fn value(&self, text: &str) -> Result<i8, String> {
        if let Some((value, _)) = (self.min..)
            .zip(self.names)
            .find(|(_, name)| name.eq_ignore_ascii_case(text))
        {
            return Ok(value);
        }
        if text.is_empty() {
            return Err("a value is missing".to_owned());
        }
        if !text.bytes().all(|b| b.is_ascii_digit()) {
            return Err(format!("{text:?} is not {}", self.expected));
        }
        text.parse::<i8>()
            .ok()
            .filter(|value| (self.min..=self.max).contains(value))
            .ok_or_else(|| format!("{text} is out of range {}-{}", self.min, self.max))
    }

    /// A step: a number from 1 to the field's largest value.
    fn step(&self, text: &str) -> Result<usize, String> {
        if text.is_empty() || !text.bytes().all(|b| b.is_ascii_digit()) {
            return Err(format!("step {text:?} is not a number"));
        }
        text.parse::<usize>()
            .ok()
            .filter(|step| (1..=self.max.unsigned_abs().into()).contains(step))
            .ok_or_else(|| format!("step {text} is out of range 1-{}", self.max))
    }
}

/// A window: minutes of the day `[start, end)` on some weekdays.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct OpenWindow {
    /// Bit n for n days after Sunday.
    days: u8,
    start: i32,
    end: i32,
}

impl OpenWindow {
    fn new(index: usize, window: &Window) -> Result<Self, CalendarError> {
        let time = |field: &'static str, value: &str, latest: i32| {
            parse_clock(value)
                .filter(|minutes| *minutes <= latest)
                .ok_or_else(|| CalendarError::WindowTime {
                    index,
                    field,
                    value: value.to_owned(),
                })
        };
        let start = time("start", &window.start, MINUTES_PER_DAY - 1)?;
        let end = time("end", &window.end, MINUTES_PER_DAY)?;
        if end <= start {
            return Err(CalendarError::WindowOrder {
                index,
                start: window.start.clone(),
                end: window.end.clone(),
            });
        }
        if window.days.is_empty() {
            return Err(CalendarError::WindowDays { index });
        }
        let days = window
            .days
            .iter()
            .fold(0, |days, day| days | (1 << sunday_offset(*day)));
        Ok(Self { days, start, end })
    }

    /// Whether the window opens on `date`.
    fn open_on(&self, date: Date) -> bool {
        (self.days >> date.weekday().to_sunday_zero_offset()) & 1 == 1
    }

    /// Whether the wall-clock time `wall` is inside the window.
    fn contains(&self, wall: DateTime) -> bool {
        self.open_on(wall.date()) && (self.start..self.end).contains(&minute_of_day(wall))
    }
}

/// Days after Sunday.
fn sunday_offset(day: Weekday) -> u8 {
    match day {
        Weekday::Sun => 0,
        Weekday::Mon => 1,
        Weekday::Tue => 2,
        Weekday::Wed => 3,
        Weekday::Thu => 4,
        Weekday::Fri => 5,
        Weekday::Sat => 6,
    }
}

/// Minutes since midnight of `HH:MM` (up to 24:00), or `None`.
fn parse_clock(text: &str) -> Option<i32> {
    let (hours, minutes) = text.split_once(':')?;
    let two_digits = |part: &str| part.len() == 2 && part.bytes().all(|b| b.is_ascii_digit());
    if !two_digits(hours) || !two_digits(minutes) {
        return None;
    }
    let (hours, minutes): (i32, i32) = (hours.parse().ok()?, minutes.parse().ok()?);
    (minutes < 60 && hours * 60 + minutes <= MINUTES_PER_DAY).then_some(hours * 60 + minutes)
}

/// A blackout: `[start, end)`.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Closed {
    start: Timestamp,
    end: Timestamp,
    reason: Option<String>,
}

impl Closed {
    fn new(index: usize, blackout: &Blackout) -> Result<Self, CalendarError> {
        let (start, end) = (blackout.start.0, blackout.end.0);
        if end <= start {
            return Err(CalendarError::BlackoutOrder { index, start, end });
        }
        Ok(Self {
            start,
            end,
            reason: blackout.reason.clone(),
        })
    }

    fn contains(&self, at: Timestamp) -> bool {
        (self.start..self.end).contains(&at)
    }
}

#[cfg(test)]
mod tests {
    use std::time::{Duration, Instant};

    use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;

    use super::*;
    use crate::ChaosDrill;

    /// The shipped example: 14:30 Tokyo on Tue and Thu, window Tue/Thu
    /// 14:00-16:00, blackout 2026-11-10 to 2026-11-12 (Tokyo midnights).
    fn example() -> ChaosDrillSpec {
        match serde_yaml_ng::from_str::<ChaosDrill>(include_str!(
            "../../../crds/examples/chaosdrill-pod-kill.yaml"
        )) {
            Ok(drill) => drill.spec,
            Err(e) => panic!("example: {e}"),
        }
    }

    fn example_calendar() -> Calendar {
        Calendar::new(&example()).unwrap_or_else(|e| panic!("example: {e}"))
    }

    fn spec(
        cron: &str,
        time_zone: &str,
        windows: Vec<Window>,
        blackouts: Vec<Blackout>,
    ) -> ChaosDrillSpec {
        let mut spec = example();
        spec.schedule.cron = cron.to_owned();
        spec.schedule.time_zone = time_zone.to_owned();
        spec.windows = windows;
        spec.blackouts = blackouts;
        spec
    }

    fn drill(
        cron: &str,
        time_zone: &str,
        windows: Vec<Window>,
        blackouts: Vec<Blackout>,
    ) -> Calendar {
        Calendar::new(&spec(cron, time_zone, windows, blackouts))
            .unwrap_or_else(|e| panic!("calendar: {e}"))
    }

    fn ts(text: &str) -> Timestamp {
        text.parse()
            .unwrap_or_else(|e| panic!("timestamp {text}: {e}"))
    }

    fn window(days: &[Weekday], start: &str, end: &str) -> Window {
        Window {
            days: days.to_vec(),
            start: start.to_owned(),
            end: end.to_owned(),
        }
    }

    fn blackout(start: &str, end: &str, reason: Option<&str>) -> Blackout {
        Blackout {
            start: Time(ts(start)),
            end: Time(ts(end)),
            reason: reason.map(str::to_owned),
        }
    }

    /// `n` successive ticks after `after`.
    fn ticks(calendar: &Calendar, after: &str, n: usize) -> Vec<Timestamp> {
        std::iter::successors(calendar.next_tick(ts(after)), |t| calendar.next_tick(*t))
            .take(n)
            .collect()
    }

    fn all(texts: &[&str]) -> Vec<Timestamp> {
        texts.iter().map(|t| ts(t)).collect()
    }

    /// The values of a field's set, ascending.
    fn values(set: u64) -> Vec<i8> {
        (0..64).filter(|v| has(set, *v)).collect()
    }

    #[test]
    fn the_example_allows_tuesday_and_thursday_afternoons_in_tokyo() {
        let calendar = example_calendar();
        for (at, expected) in [
            ("2026-11-03T13:59:59+09:00", Allowance::OutsideWindows),
            ("2026-11-03T14:00:00+09:00", Allowance::Allowed),
            ("2026-11-03T15:59:59+09:00", Allowance::Allowed),
            ("2026-11-03T16:00:00+09:00", Allowance::OutsideWindows),
            ("2026-11-04T14:30:00+09:00", Allowance::OutsideWindows),
            ("2026-11-05T14:00:00+09:00", Allowance::Allowed),
            // 14:30 Tokyo is 05:30 UTC: the window is read in Tokyo.
            ("2026-11-03T05:30:00Z", Allowance::Allowed),
        ] {
            assert_eq!(calendar.allowance(ts(at)), expected, "{at}");
        }
        let monday = ts("2026-11-02T09:00:00+09:00");
        let tuesday = ts("2026-11-03T14:30:00+09:00");
        assert_eq!(calendar.next_tick(monday), Some(tuesday));
        assert_eq!(calendar.next_run(monday), Some(tuesday));
        assert_eq!(
            calendar.next_run(tuesday),
            Some(ts("2026-11-05T14:30:00+09:00"))
        );
        assert_eq!(
            calendar.allowed_until(tuesday),
            Some(ts("2026-11-03T16:00:00+09:00"))
        );
    }

    #[test]
    fn a_blackout_over_tuesday_moves_the_run_to_thursday() {
        let calendar = example_calendar();
        let monday = ts("2026-11-09T09:00:00+09:00");
        let tuesday = ts("2026-11-10T14:30:00+09:00");
        assert_eq!(
            calendar.next_tick(monday),
            Some(tuesday),
            "ticks ignore blackouts"
        );
        assert_eq!(
            calendar.next_run(monday),
            Some(ts("2026-11-12T14:30:00+09:00"))
        );
        let blocked = calendar.allowance(tuesday);
        assert_eq!(
            blocked,
            Allowance::InBlackout {
                reason: Some("singles-day freeze".to_owned()),
                until: ts("2026-11-12T00:00:00+09:00"),
            }
        );
        assert_eq!(calendar.allowed_until(tuesday), None);
        assert_eq!(
            [
                Allowance::Allowed.reason().as_str(),
                Allowance::OutsideWindows.reason().as_str(),
                blocked.reason().as_str()
            ],
            ["Allowed", "OutsideWindow", "InBlackout"]
        );
        // The blackout ends before Thursday's window and run.
        assert_eq!(
            calendar.allowance(ts("2026-11-12T00:00:00+09:00")),
            Allowance::OutsideWindows
        );
    }

    #[test]
    fn spring_forward_runs_a_skipped_time_once_after_the_gap() {
        // New York, 2026-03-08: 02:00 EST jumps to 03:00 EDT.
        let calendar = drill("30 2 * * *", "America/New_York", vec![], vec![]);
        for (after, expected) in [
            ("2026-03-07T12:00:00-05:00", "2026-03-08T03:30:00-04:00"),
            ("2026-03-08T01:59:00-05:00", "2026-03-08T03:30:00-04:00"),
            // Already past the gap on the wall clock, yet before the shifted run.
            ("2026-03-08T03:10:00-04:00", "2026-03-08T03:30:00-04:00"),
            ("2026-03-08T03:30:00-04:00", "2026-03-09T02:30:00-04:00"),
        ] {
            assert_eq!(calendar.next_tick(ts(after)), Some(ts(expected)), "{after}");
        }
        assert_eq!(
            ticks(&calendar, "2026-03-07T00:00:00-05:00", 3),
            all(&[
                "2026-03-07T02:30:00-05:00",
                "2026-03-08T03:30:00-04:00",
                "2026-03-09T02:30:00-04:00",
            ])
        );
    }

    #[test]
    fn fall_back_runs_a_repeated_time_once_at_its_first_occurrence() {
        // New York, 2026-11-01: 02:00 EDT falls back to 01:00 EST.
        let calendar = drill("30 1 * * *", "America/New_York", vec![], vec![]);
        for (after, expected) in [
            ("2026-11-01T00:00:00-04:00", "2026-11-01T01:30:00-04:00"),
            ("2026-11-01T01:30:00-04:00", "2026-11-02T01:30:00-05:00"),
            // In the repeated hour, before the second 01:30: not run again.
            ("2026-11-01T01:10:00-05:00", "2026-11-02T01:30:00-05:00"),
        ] {
            assert_eq!(calendar.next_tick(ts(after)), Some(ts(expected)), "{after}");
        }
    }

    #[test]
    fn an_hourly_cron_across_both_transitions_has_no_duplicates() {
        let calendar = drill("0 * * * *", "America/New_York", vec![], vec![]);
        // Spring forward: 02:00 runs at 03:00 EDT, the same instant as 03:00,
        // which counts once.
        assert_eq!(
            ticks(&calendar, "2026-03-08T00:30:00-05:00", 4),
            all(&[
                "2026-03-08T01:00:00-05:00",
                "2026-03-08T03:00:00-04:00",
                "2026-03-08T04:00:00-04:00",
                "2026-03-08T05:00:00-04:00",
            ])
        );
        // Fall back: 01:00 runs at 01:00 EDT only; 01:00 EST is skipped by
        // design, so the ticks are two hours apart there.
        assert_eq!(
            ticks(&calendar, "2026-11-01T00:30:00-04:00", 4),
            all(&[
                "2026-11-01T01:00:00-04:00",
                "2026-11-01T02:00:00-05:00",
                "2026-11-01T03:00:00-05:00",
                "2026-11-01T04:00:00-05:00",
            ])
        );
        assert_eq!(
            calendar.next_tick(ts("2026-11-01T01:00:00-05:00")),
            Some(ts("2026-11-01T02:00:00-05:00"))
        );
    }

    #[test]
    fn london_transitions() {
        let calendar = drill("30 1 * * *", "Europe/London", vec![], vec![]);
        for (after, expected) in [
            // 2026-03-29: 01:00 GMT jumps to 02:00 BST.
            ("2026-03-29T00:00:00Z", "2026-03-29T01:30:00Z"),
            ("2026-03-29T01:30:00Z", "2026-03-30T00:30:00Z"),
            // 2026-10-25: 02:00 BST falls back to 01:00 GMT.
            ("2026-10-24T23:00:00Z", "2026-10-25T00:30:00Z"),
            ("2026-10-25T00:30:00Z", "2026-10-26T01:30:00Z"),
        ] {
            assert_eq!(calendar.next_tick(ts(after)), Some(ts(expected)), "{after}");
        }
    }

    #[test]
    fn next_tick_is_strictly_after() {
        let calendar = drill("30 14 * * *", "UTC", vec![], vec![]);
        for (after, expected) in [
            ("2026-01-05T14:29:59.999999999Z", "2026-01-05T14:30:00Z"),
            ("2026-01-05T14:30:00Z", "2026-01-06T14:30:00Z"),
            ("2026-01-05T14:30:00.000000001Z", "2026-01-06T14:30:00Z"),
            ("2026-12-31T23:59:00Z", "2027-01-01T14:30:00Z"),
        ] {
            assert_eq!(calendar.next_tick(ts(after)), Some(ts(expected)), "{after}");
        }
    }

    #[test]
    fn either_day_field_matches_when_both_are_restricted() {
        // January 2026: Fridays are the 2nd, 9th, 16th, 23rd and 30th; the 13th is a Tuesday.
        for (cron, expected) in [
            (
                "0 12 13 * FRI",
                &[
                    "2026-01-02T12:00:00Z",
                    "2026-01-09T12:00:00Z",
                    "2026-01-13T12:00:00Z",
                    "2026-01-16T12:00:00Z",
                    "2026-01-23T12:00:00Z",
                ],
            ),
            (
                "0 12 13 * *",
                &[
                    "2026-01-13T12:00:00Z",
                    "2026-02-13T12:00:00Z",
                    "2026-03-13T12:00:00Z",
                    "2026-04-13T12:00:00Z",
                    "2026-05-13T12:00:00Z",
                ],
            ),
            (
                "0 12 * * 5",
                &[
                    "2026-01-02T12:00:00Z",
                    "2026-01-09T12:00:00Z",
                    "2026-01-16T12:00:00Z",
                    "2026-01-23T12:00:00Z",
                    "2026-01-30T12:00:00Z",
                ],
            ),
            // As in Vixie cron, `*/2` counts as unrestricted: odd days AND Fridays.
            (
                "0 12 */2 * fri",
                &[
                    "2026-01-09T12:00:00Z",
                    "2026-01-23T12:00:00Z",
                    "2026-02-13T12:00:00Z",
                    "2026-02-27T12:00:00Z",
                    "2026-03-13T12:00:00Z",
                ],
            ),
        ] {
            let calendar = drill(cron, "UTC", vec![], vec![]);
            assert_eq!(
                ticks(&calendar, "2026-01-01T00:00:00Z", 5),
                all(expected),
                "{cron}"
            );
        }
    }

    #[test]
    fn fields_parse_lists_ranges_steps_and_names() {
        let cron = match Cron::parse("*/15 9-17/4 1,15-17 jan-MAR,Dec mon-FRI,7") {
            Ok(c) => c,
            Err(e) => panic!("{e}"),
        };
        assert_eq!(values(cron.minutes), [0, 15, 30, 45]);
        assert_eq!(values(cron.hours), [9, 13, 17]);
        assert_eq!(values(cron.days_of_month), [1, 15, 16, 17]);
        assert_eq!(values(cron.months), [1, 2, 3, 12]);
        assert_eq!(values(cron.days_of_week), [0, 1, 2, 3, 4, 5]);
        assert!(cron.either_day);

        for (cron, field, expected) in [
            ("0 0 * * 7", 4, vec![0]),
            ("0 0 * * 0", 4, vec![0]),
            ("0 0 * * 5-7", 4, vec![0, 5, 6]),
            ("0 0 * * */2", 4, vec![0, 2, 4, 6]),
            ("0 0 * * *", 4, vec![0, 1, 2, 3, 4, 5, 6]),
            ("0 0 * * SUN,sat", 4, vec![0, 6]),
            ("0 0 */10 * *", 2, vec![1, 11, 21, 31]),
            ("0 0 * FEB-apr/2 *", 3, vec![2, 4]),
            ("0 0 * * *", 3, (1..=12).collect()),
            ("0 */6 * * *", 1, vec![0, 6, 12, 18]),
            ("5,10-12,58-59 * * * *", 0, vec![5, 10, 11, 12, 58, 59]),
            ("0-59/20 * * * *", 0, vec![0, 20, 40]),
        ] {
            let cron_fields = match Cron::parse(cron) {
                Ok(c) => [
                    c.minutes,
                    c.hours,
                    c.days_of_month,
                    c.months,
                    c.days_of_week,
                ],
                Err(e) => panic!("{cron}: {e}"),
            };
            assert_eq!(values(cron_fields[field]), expected, "{cron}");
        }
        for (cron, either_day) in [
            ("0 0 1 * 1", true),
            ("0 0 * * 1", false),
            ("0 0 1 * *", false),
            ("0 0 */2 * 1", false),
            ("0 0 1 * */2", false),
        ] {
            assert_eq!(
                Cron::parse(cron).map(|c| c.either_day),
                Ok(either_day),
                "{cron}"
            );
        }
        // Fields may be separated by any whitespace.
        assert_eq!(
            Cron::parse(" 30\t14 * *  2,4 "),
            Cron::parse("30 14 * * 2,4")
        );
    }

    #[test]
    fn invalid_crons_name_the_field_and_the_problem() {
        for (cron, problem) in [
            ("61 * * * *", "minute: 61 is out of range 0-59"),
            (
                "* * *",
                "expected five fields (minute hour day-of-month month day-of-week), found 3",
            ),
            (
                "0 14 * * 2,4 2027",
                "expected five fields (minute hour day-of-month month day-of-week), found 6",
            ),
            ("a b c d e", "minute: \"a\" is not a number"),
            ("*/0 * * * *", "minute: step 0 is out of range 1-59"),
            ("*/60 * * * *", "minute: step 60 is out of range 1-59"),
            ("0 24 * * *", "hour: 24 is out of range 0-23"),
            ("0 0 0 * *", "day-of-month: 0 is out of range 1-31"),
            ("0 0 32 * *", "day-of-month: 32 is out of range 1-31"),
            ("0 0 * 13 *", "month: 13 is out of range 1-12"),
            ("0 0 * * 8", "day-of-week: 8 is out of range 0-7"),
            (
                "0 0 * FOO *",
                "month: \"FOO\" is not a number or a month name (JAN-DEC)",
            ),
            (
                "0 0 * * MONDAY",
                "day-of-week: \"MONDAY\" is not a number or a day name (SUN-SAT)",
            ),
            ("5-1 * * * *", "minute: range \"5-1\" runs backwards"),
            ("0 0 * DEC-JAN *", "month: range \"DEC-JAN\" runs backwards"),
            (
                "5/10 * * * *",
                "minute: \"5/10\" steps from a single value; write */n or a-b/n",
            ),
            ("1,,2 * * * *", "minute: a value is missing"),
            (
                "0 0 * * SUN-SAT/0",
                "day-of-week: step 0 is out of range 1-7",
            ),
            ("0 0 * JAN-DEC/13 *", "month: step 13 is out of range 1-12"),
        ] {
            let error = Calendar::new(&spec(cron, "UTC", vec![], vec![])).map(|_| ());
            assert_eq!(
                error,
                Err(CalendarError::Cron {
                    expression: cron.to_owned(),
                    problem: problem.to_owned(),
                }),
                "{cron}"
            );
        }
        assert_eq!(
            Calendar::new(&spec("61 * * * *", "UTC", vec![], vec![]))
                .map(|_| ())
                .map_err(|e| e.to_string()),
            Err("spec.schedule.cron: invalid cron expression \"61 * * * *\": minute: 61 is out of range 0-59".to_owned())
        );
    }

    #[test]
    fn garbage_crons_are_errors_not_panics() {
        for (cron, problem) in [
            (
                "",
                "expected five fields (minute hour day-of-month month day-of-week), found 0",
            ),
            (
                "\t\n ",
                "expected five fields (minute hour day-of-month month day-of-week), found 0",
            ),
            ("*/ * * * *", "minute: step \"\" is not a number"),
            ("- * * * *", "minute: a value is missing"),
            ("1--2 * * * *", "minute: \"-2\" is not a number"),
            ("-0 * * * *", "minute: a value is missing"),
            ("ñ * * * *", "minute: \"ñ\" is not a number"),
            ("٣ * * * *", "minute: \"٣\" is not a number"),
            (
                "99999999999999999999 * * * *",
                "minute: 99999999999999999999 is out of range 0-59",
            ),
            (
                "*/99999999999999999999 * * * *",
                "minute: step 99999999999999999999 is out of range 1-59",
            ),
            ("L * * * *", "minute: \"L\" is not a number"),
            ("0 0 ? * *", "day-of-month: \"?\" is not a number"),
            ("0 0 L * *", "day-of-month: \"L\" is not a number"),
            (
                "0 0 * * 5#3",
                "day-of-week: \"5#3\" is not a number or a day name (SUN-SAT)",
            ),
            ("*-* * * * *", "minute: \"*\" is not a number"),
            ("1/2/3 * * * *", "minute: step \"2/3\" is not a number"),
            ("0 0 31- * *", "day-of-month: a value is missing"),
            ("+5 * * * *", "minute: \"+5\" is not a number"),
            (
                "0 0 * * 0x1",
                "day-of-week: \"0x1\" is not a number or a day name (SUN-SAT)",
            ),
            ("0 0 * * ,", "day-of-week: a value is missing"),
            (
                "0 0 * * SU",
                "day-of-week: \"SU\" is not a number or a day name (SUN-SAT)",
            ),
        ] {
            assert_eq!(Cron::parse(cron), Err(problem.to_owned()), "{cron:?}");
        }
    }

    /// Calendars with one bad field each, and the message naming it.
    fn bad_calendars() -> Vec<(&'static str, Vec<Window>, Vec<Blackout>, &'static str)> {
        let tue = [Weekday::Tue];
        let good = window(&tue, "14:00", "16:00");
        vec![
            (
                "Mars/Olympus",
                vec![],
                vec![],
                "spec.schedule.timeZone: unknown time zone \"Mars/Olympus\" (use an IANA name such as Asia/Tokyo)",
            ),
            (
                "",
                vec![],
                vec![],
                "spec.schedule.timeZone: unknown time zone \"\" (use an IANA name such as Asia/Tokyo)",
            ),
            (
                "UTC",
                vec![good.clone(), window(&tue, "9:00", "16:00")],
                vec![],
                "spec.windows[1].start: \"9:00\" is not a local time HH:MM (00:00 to 23:59, or 24:00 for an end)",
            ),
            (
                "UTC",
                vec![window(&tue, "24:00", "24:00")],
                vec![],
                "spec.windows[0].start: \"24:00\" is not a local time HH:MM (00:00 to 23:59, or 24:00 for an end)",
            ),
            (
                "UTC",
                vec![window(&tue, "14:00", "24:01")],
                vec![],
                "spec.windows[0].end: \"24:01\" is not a local time HH:MM (00:00 to 23:59, or 24:00 for an end)",
            ),
            (
                "UTC",
                vec![window(&tue, "14:00", "12:60")],
                vec![],
                "spec.windows[0].end: \"12:60\" is not a local time HH:MM (00:00 to 23:59, or 24:00 for an end)",
            ),
            (
                "UTC",
                vec![window(&tue, "ab:cd", "16:00")],
                vec![],
                "spec.windows[0].start: \"ab:cd\" is not a local time HH:MM (00:00 to 23:59, or 24:00 for an end)",
            ),
            (
                "UTC",
                vec![good.clone(), good.clone(), window(&tue, "16:00", "14:00")],
                vec![],
                "spec.windows[2].end: \"14:00\" is not after start \"16:00\" (windows do not cross midnight)",
            ),
            (
                "UTC",
                vec![window(&tue, "14:00", "14:00")],
                vec![],
                "spec.windows[0].end: \"14:00\" is not after start \"14:00\" (windows do not cross midnight)",
            ),
            (
                "UTC",
                vec![window(&[], "14:00", "16:00")],
                vec![],
                "spec.windows[0].days: a window needs at least one day",
            ),
            (
                "UTC",
                vec![],
                vec![
                    blackout("2026-01-01T00:00:00Z", "2026-01-02T00:00:00Z", None),
                    blackout("2026-01-02T00:00:00Z", "2026-01-01T00:00:00Z", None),
                ],
                "spec.blackouts[1].end: 2026-01-01T00:00:00Z is not after start 2026-01-02T00:00:00Z",
            ),
        ]
    }

    #[test]
    fn time_zones_windows_and_blackouts_are_checked() {
        for (time_zone, windows, blackouts, message) in bad_calendars() {
            let found = Calendar::new(&spec("0 * * * *", time_zone, windows, blackouts))
                .map(|_| ())
                .map_err(|e| e.to_string());
            assert_eq!(found, Err(message.to_owned()));
        }
    }

    #[test]
    fn the_cron_is_checked_first_as_the_spec_reads() {
        assert_eq!(
            Calendar::new(&spec("* * *", "Mars/Olympus", vec![], vec![])).map(|_| ()),
            Err(CalendarError::Cron {
                expression: "* * *".to_owned(),
                problem:
                    "expected five fields (minute hour day-of-month month day-of-week), found 3"
                        .to_owned(),
            })
        );
    }

    #[test]
    fn twenty_four_hundred_is_the_end_of_the_day() {
        let tue = [Weekday::Tue];
        let late = drill(
            "0 * * * *",
            "UTC",
            vec![window(&tue, "23:00", "24:00")],
            vec![],
        );
        assert_eq!(
            late.allowance(ts("2026-01-06T23:59:59Z")),
            Allowance::Allowed
        );
        assert_eq!(
            late.allowance(ts("2026-01-07T00:00:00Z")),
            Allowance::OutsideWindows
        );
    }

    #[test]
    fn a_cron_that_never_meets_a_window_has_no_next_run() {
        let started = Instant::now();
        let mondays = vec![window(&[Weekday::Mon], "09:00", "12:00")];
        let never = drill("30 14 * * 2,4", "Asia/Tokyo", mondays.clone(), vec![]);
        assert_eq!(never.next_run(ts("2026-11-02T00:00:00Z")), None);
        assert_eq!(
            never.next_tick(ts("2026-11-02T00:00:00Z")),
            Some(ts("2026-11-03T14:30:00+09:00"))
        );
        // Every minute of every day but never in the window's hours.
        let busy = drill("* 0-8,12-23 * * *", "Asia/Tokyo", mondays, vec![]);
        assert_eq!(busy.next_run(ts("2026-11-02T00:00:00Z")), None);
        // A day that does not exist never ticks.
        let no_day = drill("0 12 30 2 *", "UTC", vec![], vec![]);
        assert_eq!(no_day.next_tick(ts("2026-01-01T00:00:00Z")), None);
        assert_eq!(no_day.next_run(ts("2026-01-01T00:00:00Z")), None);
        // The sparsest cron that ticks: eight years apart across 2100.
        let leap = drill("0 12 29 2 *", "UTC", vec![], vec![]);
        assert_eq!(
            leap.next_tick(ts("2096-03-01T00:00:00Z")),
            Some(ts("2104-02-29T12:00:00Z"))
        );
        // The searches jump from window to window: no minute-by-minute walk.
        assert!(
            started.elapsed() < Duration::from_secs(2),
            "{:?}",
            started.elapsed()
        );
    }

    #[test]
    fn next_run_jumps_to_the_first_allowed_tick() {
        // 2026-01-05 is a Monday.
        let monday_morning = vec![window(&[Weekday::Mon], "09:30", "11:00")];
        for (cron, expected) in [
            ("0 * * * *", Some("2026-01-05T10:00:00Z")),
            ("*/10 * * * *", Some("2026-01-05T09:30:00Z")),
            ("45 10 * * *", Some("2026-01-05T10:45:00Z")),
            ("0 9 * * *", None),
            // 11:00 is the close, outside the window.
            ("0 11 * * *", None),
        ] {
            let calendar = drill(cron, "UTC", monday_morning.clone(), vec![]);
            assert_eq!(
                calendar.next_run(ts("2026-01-05T00:00:00Z")),
                expected.map(ts),
                "{cron}"
            );
        }
        // A window opening in New York's spring-forward gap opens when the
        // gap ends: the 02:00 tick runs at 03:00 EDT, inside 02:30-04:00.
        let gap = drill(
            "*/15 * * * *",
            "America/New_York",
            vec![window(&[Weekday::Sun], "02:30", "04:00")],
            vec![],
        );
        assert_eq!(
            gap.next_run(ts("2026-03-08T00:00:00-05:00")),
            Some(ts("2026-03-08T03:00:00-04:00"))
        );
        assert_eq!(
            gap.next_run(ts("2026-03-08T03:50:00-04:00")),
            Some(ts("2026-03-15T02:30:00-04:00"))
        );
    }

    #[test]
    fn blackouts_beat_windows_and_run_into_each_other() {
        let calendar = drill(
            "0 * * * *",
            "UTC",
            vec![],
            vec![
                blackout("2026-01-10T00:00:00Z", "2026-01-11T00:00:00Z", Some("a")),
                blackout("2026-01-10T12:00:00Z", "2026-01-12T00:00:00Z", None),
                blackout("2026-01-12T00:00:00Z", "2026-01-13T00:00:00Z", Some("c")),
                blackout("2026-02-01T00:00:00Z", "2026-02-02T00:00:00Z", None),
            ],
        );
        let blocked = |reason: Option<&str>, until: &str| Allowance::InBlackout {
            reason: reason.map(str::to_owned),
            until: ts(until),
        };
        for (at, expected) in [
            ("2026-01-09T23:59:59Z", Allowance::Allowed),
            (
                "2026-01-10T00:00:00Z",
                blocked(Some("a"), "2026-01-13T00:00:00Z"),
            ),
            (
                "2026-01-10T13:00:00Z",
                blocked(Some("a"), "2026-01-13T00:00:00Z"),
            ),
            (
                "2026-01-11T06:00:00Z",
                blocked(None, "2026-01-13T00:00:00Z"),
            ),
            (
                "2026-01-12T06:00:00Z",
                blocked(Some("c"), "2026-01-13T00:00:00Z"),
            ),
            ("2026-01-13T00:00:00Z", Allowance::Allowed),
            (
                "2026-02-01T12:00:00Z",
                blocked(None, "2026-02-02T00:00:00Z"),
            ),
        ] {
            assert_eq!(calendar.allowance(ts(at)), expected, "{at}");
        }
        assert_eq!(
            calendar.next_run(ts("2026-01-10T00:00:00Z")),
            Some(ts("2026-01-13T00:00:00Z"))
        );
        assert_eq!(
            calendar.next_run(ts("2026-01-09T22:00:00Z")),
            Some(ts("2026-01-09T23:00:00Z"))
        );
        // A blackout is absolute: it beats a window that is open.
        let windowed = drill(
            "0 * * * *",
            "UTC",
            vec![window(&[Weekday::Sat], "00:00", "24:00")],
            vec![blackout(
                "2026-01-10T12:00:00Z",
                "2026-01-10T13:00:00Z",
                Some("b"),
            )],
        );
        assert_eq!(
            windowed.allowance(ts("2026-01-10T12:30:00Z")),
            blocked(Some("b"), "2026-01-10T13:00:00Z")
        );
        assert_eq!(
            windowed.next_run(ts("2026-01-10T11:00:00Z")),
            Some(ts("2026-01-10T13:00:00Z"))
        );
    }

    #[test]
    fn allowed_until_ends_at_a_window_close_or_a_blackout() {
        // 2026-01-05 is a Monday.
        let calendar = drill(
            "0 * * * *",
            "UTC",
            vec![
                window(&[Weekday::Mon], "20:00", "24:00"),
                window(&[Weekday::Tue], "00:00", "02:00"),
                window(&[Weekday::Wed], "09:00", "17:00"),
                window(&[Weekday::Wed], "16:00", "18:00"),
            ],
            vec![blackout(
                "2026-01-07T12:00:00Z",
                "2026-01-07T13:00:00Z",
                Some("lunch"),
            )],
        );
        for (at, expected) in [
            // Back-to-back windows make one period.
            ("2026-01-05T21:00:00Z", Some("2026-01-06T02:00:00Z")),
            ("2026-01-06T01:00:00Z", Some("2026-01-06T02:00:00Z")),
            ("2026-01-06T02:00:00Z", None),
            ("2026-01-07T10:00:00Z", Some("2026-01-07T12:00:00Z")),
            ("2026-01-07T12:30:00Z", None),
            // Overlapping windows make one period too.
            ("2026-01-07T13:00:00Z", Some("2026-01-07T18:00:00Z")),
            ("2026-01-07T17:00:00Z", Some("2026-01-07T18:00:00Z")),
            ("2026-01-04T12:00:00Z", None),
        ] {
            assert_eq!(calendar.allowed_until(ts(at)), expected.map(ts), "{at}");
        }
        let every_day = [
            Weekday::Mon,
            Weekday::Tue,
            Weekday::Wed,
            Weekday::Thu,
            Weekday::Fri,
            Weekday::Sat,
            Weekday::Sun,
        ];
        let always = drill(
            "0 * * * *",
            "UTC",
            vec![window(&every_day, "00:00", "24:00")],
            vec![],
        );
        assert_eq!(
            always.allowed_until(ts("2026-01-05T21:00:00Z")),
            Some(Timestamp::MAX)
        );
        let unbounded = drill("0 * * * *", "UTC", vec![], vec![]);
        assert_eq!(
            unbounded.allowance(ts("2026-01-05T21:00:00Z")),
            Allowance::Allowed
        );
        assert_eq!(
            unbounded.allowed_until(ts("2026-01-05T21:00:00Z")),
            Some(Timestamp::MAX)
        );
        let until_blackout = drill(
            "0 * * * *",
            "UTC",
            vec![],
            vec![blackout(
                "2026-03-01T00:00:00Z",
                "2026-03-02T00:00:00Z",
                None,
            )],
        );
        assert_eq!(
            until_blackout.allowed_until(ts("2026-01-05T21:00:00Z")),
            Some(ts("2026-03-01T00:00:00Z"))
        );
    }

    #[test]
    fn windows_follow_the_wall_clock_across_transitions() {
        // New York, 2026-03-08: the wall clock jumps from 02:00 to 03:00,
        // so a window closing at 02:30 closes at the jump.
        let spring = drill(
            "0 * * * *",
            "America/New_York",
            vec![window(&[Weekday::Sun], "01:00", "02:30")],
            vec![],
        );
        assert_eq!(
            spring.allowed_until(ts("2026-03-08T01:30:00-05:00")),
            Some(ts("2026-03-08T03:00:00-04:00"))
        );
        assert_eq!(
            spring.allowance(ts("2026-03-08T03:00:00-04:00")),
            Allowance::OutsideWindows
        );
        // 2026-11-01: the wall clock reads 01:00-02:00 twice, so a window
        // 01:00-01:30 opens twice and closes at the 01:30 that follows.
        let fall = drill(
            "0 * * * *",
            "America/New_York",
            vec![window(&[Weekday::Sun], "01:00", "01:30")],
            vec![],
        );
        for (at, allowance, until) in [
            (
                "2026-11-01T01:10:00-04:00",
                Allowance::Allowed,
                Some("2026-11-01T01:30:00-04:00"),
            ),
            ("2026-11-01T01:40:00-04:00", Allowance::OutsideWindows, None),
            (
                "2026-11-01T01:10:00-05:00",
                Allowance::Allowed,
                Some("2026-11-01T01:30:00-05:00"),
            ),
            ("2026-11-01T01:30:00-05:00", Allowance::OutsideWindows, None),
        ] {
            assert_eq!(
                (fall.allowance(ts(at)), fall.allowed_until(ts(at))),
                (allowance, until.map(ts)),
                "{at}"
            );
        }
        // The hourly tick runs once in the repeated hour, at 01:00 EDT.
        assert_eq!(
            fall.next_run(ts("2026-11-01T00:30:00-04:00")),
            Some(ts("2026-11-01T01:00:00-04:00"))
        );
        assert_eq!(
            fall.next_run(ts("2026-11-01T01:00:00-04:00")),
            Some(ts("2026-11-08T01:00:00-05:00"))
        );
    }

    #[test]
    fn the_ends_of_time_give_none_not_panics() {
        let daily = drill("0 0 * * *", "UTC", vec![], vec![]);
        assert_eq!(daily.next_tick(Timestamp::MAX), None);
        assert_eq!(daily.next_run(Timestamp::MAX), None);
        assert_eq!(daily.allowed_until(Timestamp::MAX), Some(Timestamp::MAX));
        assert_eq!(
            daily.next_tick(Timestamp::MIN),
            Some(ts("-009999-01-03T00:00:00Z"))
        );
        // The last midnight in New York is past the last instant.
        let new_york = drill(
            "0 0 * * *",
            "America/New_York",
            vec![window(&[Weekday::Fri], "00:00", "24:00")],
            vec![],
        );
        assert_eq!(
            new_york.next_tick(ts("9999-12-29T06:00:00Z")),
            Some(ts("9999-12-30T00:00:00-05:00"))
        );
        assert_eq!(new_york.next_tick(ts("9999-12-30T06:00:00Z")), None);
        assert_eq!(
            new_york.next_run(ts("9999-12-20T00:00:00Z")),
            Some(ts("9999-12-24T00:00:00-05:00"))
        );
        assert_eq!(new_york.next_run(ts("9999-12-25T00:00:00Z")), None);
        assert_eq!(
            new_york.allowed_until(ts("9999-12-24T12:00:00Z")),
            Some(ts("9999-12-25T00:00:00-05:00"))
        );
    }
}
