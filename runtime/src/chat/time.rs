//! The clock a chat template sees: a civil date and time, and the `strftime` formatting behind
//! the `strftime_now(fmt)` global that Hugging Face `apply_chat_template` provides (it calls
//! Python's `datetime.now().strftime(fmt)`).
//!
//! Times are plain wall-clock values with no time zone: `--now` gives one exactly, and the
//! system clock is read as UTC (modelc carries no time-zone database; Hugging Face uses the
//! machine's local time, so on a machine set to UTC the two agree).

use std::fmt::Write as _;
use std::time::{SystemTime, UNIX_EPOCH};

/// A wall-clock date and time (proleptic Gregorian calendar, no time zone, whole seconds).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct CivilTime {
    /// Year, e.g. 2026.
    pub year: i32,
    /// Month, 1..=12.
    pub month: u32,
    /// Day of the month, 1..=31 (valid for the month).
    pub day: u32,
    /// Hour, 0..=23.
    pub hour: u32,
    /// Minute, 0..=59.
    pub minute: u32,
    /// Second, 0..=59.
    pub second: u32,
}

const MONTH_NAMES: [&str; 12] = [
    "January",
    "February",
    "March",
    "April",
    "May",
    "June",
    "July",
    "August",
    "September",
    "October",
    "November",
    "December",
];

/// Weekday names, Monday first (ISO order).
const WEEKDAY_NAMES: [&str; 7] = [
    "Monday",
    "Tuesday",
    "Wednesday",
    "Thursday",
    "Friday",
    "Saturday",
    "Sunday",
];

fn is_leap(year: i32) -> bool {
    (year % 4 == 0 && year % 100 != 0) || year % 400 == 0
}

fn days_in_month(year: i32, month: u32) -> u32 {
    match month {
        1 | 3 | 5 | 7 | 8 | 10 | 12 => 31,
        4 | 6 | 9 | 11 => 30,
        2 if is_leap(year) => 29,
        2 => 28,
        _ => 0,
    }
}

/// Days since 1970-01-01 of a civil date (Howard Hinnant's `days_from_civil` algorithm).
fn days_from_civil(year: i32, month: u32, day: u32) -> i64 {
    let y = i64::from(year) - i64::from(month <= 2);
    let era = y.div_euclid(400);
    let yoe = y - era * 400; // [0, 399]
    let m = i64::from(month);
    let doy = (153 * (if m > 2 { m - 3 } else { m + 9 }) + 2) / 5 + i64::from(day) - 1; // [0, 365]
    let doe = yoe * 365 + yoe / 4 - yoe / 100 + doy; // [0, 146096]
    era * 146097 + doe - 719468
}

/// The civil date of a day count since 1970-01-01 (inverse of [`days_from_civil`]).
fn civil_from_days(z: i64) -> (i32, u32, u32) {
    let z = z + 719468;
    let era = z.div_euclid(146097);
    let doe = z - era * 146097; // [0, 146096]
    let yoe = (doe - doe / 1460 + doe / 36524 - doe / 146096) / 365; // [0, 399]
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100); // [0, 365]
    let mp = (5 * doy + 2) / 153; // [0, 11]
    let day = (doy - (153 * mp + 2) / 5 + 1) as u32;
    let month = if mp < 10 { mp + 3 } else { mp - 9 } as u32;
    let year = (yoe + era * 400 + i64::from(month <= 2)) as i32;
    (year, month, day)
}

impl CivilTime {
    /// Builds a time, checking every field's range (including the day against the month).
    ///
    /// Errors: a message naming the field that is out of range.
    pub fn new(
        year: i32,
        month: u32,
        day: u32,
        hour: u32,
        minute: u32,
        second: u32,
    ) -> Result<CivilTime, String> {
        if !(1..=9999).contains(&year) {
            return Err(format!("year {year} is outside 1..=9999"));
        }
        if !(1..=12).contains(&month) {
            return Err(format!("month {month} is outside 1..=12"));
        }
        if day < 1 || day > days_in_month(year, month) {
            return Err(format!("day {day} does not exist in {year}-{month:02}"));
        }
        if hour > 23 || minute > 59 || second > 59 {
            return Err(format!(
                "time {hour:02}:{minute:02}:{second:02} is not a valid time of day"
            ));
        }
        Ok(CivilTime {
            year,
            month,
            day,
            hour,
            minute,
            second,
        })
    }

    /// Parses `YYYY-MM-DD`, `YYYY-MM-DDTHH:MM`, or `YYYY-MM-DDTHH:MM:SS` (a space may stand
    /// for the `T`), the form `modelc template --now` takes.
    ///
    /// Errors: a message quoting the text and the expected form.
    pub fn parse(text: &str) -> Result<CivilTime, String> {
        let bad = || format!("invalid time {text:?}: expected YYYY-MM-DD[THH:MM[:SS]]");
        let (date, time) = match text.find(['T', ' ']) {
            Some(i) => (&text[..i], Some(&text[i + 1..])),
            None => (text, None),
        };
        let num = |s: &str, len: usize| -> Result<u32, String> {
            if s.len() != len || !s.bytes().all(|b| b.is_ascii_digit()) {
                return Err(bad());
            }
            s.parse::<u32>().map_err(|_| bad())
        };
        let d: Vec<&str> = date.split('-').collect();
        if d.len() != 3 {
            return Err(bad());
        }
        let year = num(d[0], 4)? as i32;
        let (month, day) = (num(d[1], 2)?, num(d[2], 2)?);
        let (mut hour, mut minute, mut second) = (0, 0, 0);
        if let Some(time) = time {
            let t: Vec<&str> = time.split(':').collect();
            if t.len() < 2 || t.len() > 3 {
                return Err(bad());
            }
            hour = num(t[0], 2)?;
            minute = num(t[1], 2)?;
            if t.len() == 3 {
                second = num(t[2], 2)?;
            }
        }
        CivilTime::new(year, month, day, hour, minute, second)
            .map_err(|e| format!("invalid time {text:?}: {e}"))
    }

    /// The current time from the system clock, as UTC.
    pub fn now_utc() -> CivilTime {
        let secs = match SystemTime::now().duration_since(UNIX_EPOCH) {
            Ok(d) => d.as_secs() as i64,
            Err(e) => -(e.duration().as_secs() as i64),
        };
        let (year, month, day) = civil_from_days(secs.div_euclid(86400));
        let tod = secs.rem_euclid(86400) as u32;
        CivilTime {
            year,
            month,
            day,
            hour: tod / 3600,
            minute: tod / 60 % 60,
            second: tod % 60,
        }
    }

    /// Day of the week, 0 = Monday … 6 = Sunday.
    pub fn weekday(&self) -> u32 {
        // 1970-01-01 was a Thursday (3).
        (days_from_civil(self.year, self.month, self.day) + 3).rem_euclid(7) as u32
    }

    /// Day of the year, 1..=366.
    pub fn ordinal(&self) -> u32 {
        (days_from_civil(self.year, self.month, self.day) - days_from_civil(self.year, 1, 1)) as u32
            + 1
    }

    /// Formats like C / Python `strftime` in the C locale (what `datetime.strftime` gives on
    /// Linux): `%a %A %b %B %h %c %d %e %F %H %I %j %m %M %p %S %T %D %R %u %w %y %Y %C %G %V
    /// %U %W %x %X %n %t %%`, `%z` and `%Z` as empty (no time zone), and glibc's `-` flag
    /// (`%-d`: no padding). An unknown directive is copied through unchanged, as glibc does.
    pub fn strftime(&self, fmt: &str) -> String {
        let mut out = String::with_capacity(fmt.len() + 16);
        let mut chars = fmt.chars().peekable();
        while let Some(c) = chars.next() {
            if c != '%' {
                out.push(c);
                continue;
            }
            let no_pad = chars.peek() == Some(&'-');
            if no_pad {
                chars.next();
            }
            let Some(d) = chars.next() else {
                out.push('%');
                if no_pad {
                    out.push('-');
                }
                break;
            };
            // A zero-padded number, or unpadded under the `-` flag.
            let num = |out: &mut String, v: i64, width: usize| {
                if no_pad {
                    let _ = write!(out, "{v}");
                } else {
                    let _ = write!(out, "{v:0width$}");
                }
            };
            let wd = self.weekday() as usize;
            // Fields are public; an out-of-range month prints as "???" instead of panicking.
            let month_name = MONTH_NAMES
                .get((self.month as usize).wrapping_sub(1))
                .copied()
                .unwrap_or("???");
            let hour12 = match self.hour % 12 {
                0 => 12,
                h => h,
            };
            match d {
                'a' => out.push_str(&WEEKDAY_NAMES[wd][..3]),
                'A' => out.push_str(WEEKDAY_NAMES[wd]),
                'b' | 'h' => out.push_str(&month_name[..3]),
                'B' => out.push_str(month_name),
                'c' => {
                    let _ = write!(
                        out,
                        "{} {} {:>2} {:02}:{:02}:{:02} {}",
                        &WEEKDAY_NAMES[wd][..3],
                        &month_name[..3],
                        self.day,
                        self.hour,
                        self.minute,
                        self.second,
                        self.year
                    );
                }
                'C' => num(&mut out, i64::from(self.year / 100), 2),
                'd' => num(&mut out, i64::from(self.day), 2),
                'e' => {
                    if no_pad {
                        let _ = write!(out, "{}", self.day);
                    } else {
                        let _ = write!(out, "{:>2}", self.day);
                    }
                }
                'D' | 'x' => {
                    let _ = write!(
                        out,
                        "{:02}/{:02}/{:02}",
                        self.month,
                        self.day,
                        self.year % 100
                    );
                }
                'F' => {
                    let _ = write!(out, "{:04}-{:02}-{:02}", self.year, self.month, self.day);
                }
                'H' => num(&mut out, i64::from(self.hour), 2),
                'I' => num(&mut out, i64::from(hour12), 2),
                'j' => num(&mut out, i64::from(self.ordinal()), 3),
                'm' => num(&mut out, i64::from(self.month), 2),
                'M' => num(&mut out, i64::from(self.minute), 2),
                'n' => out.push('\n'),
                'p' => out.push_str(if self.hour < 12 { "AM" } else { "PM" }),
                'R' => {
                    let _ = write!(out, "{:02}:{:02}", self.hour, self.minute);
                }
                'S' => num(&mut out, i64::from(self.second), 2),
                't' => out.push('\t'),
                'T' | 'X' => {
                    let _ = write!(
                        out,
                        "{:02}:{:02}:{:02}",
                        self.hour, self.minute, self.second
                    );
                }
                'u' => {
                    let _ = write!(out, "{}", wd + 1);
                }
                'w' => {
                    let _ = write!(out, "{}", (wd + 1) % 7);
                }
                'y' => num(&mut out, i64::from(self.year % 100), 2),
                'Y' => {
                    let _ = write!(out, "{}", self.year);
                }
                'G' => {
                    let _ = write!(out, "{}", self.iso_week().0);
                }
                'V' => num(&mut out, i64::from(self.iso_week().1), 2),
                'U' => {
                    // Week of the year, Sunday first; days before the first Sunday are week 0.
                    let sunday_based = (wd + 1) % 7;
                    let v = (self.ordinal() as i64 - 1 + 7 - sunday_based as i64) / 7;
                    num(&mut out, v, 2);
                }
                'W' => {
                    let v = (self.ordinal() as i64 - 1 + 7 - wd as i64) / 7;
                    num(&mut out, v, 2);
                }
                'z' | 'Z' => {}
                '%' => out.push('%'),
                other => {
                    out.push('%');
                    if no_pad {
                        out.push('-');
                    }
                    out.push(other);
                }
            }
        }
        out
    }

    /// ISO 8601 week-numbering year and week (1..=53).
    fn iso_week(&self) -> (i32, u32) {
        let wd = self.weekday() as i64; // Monday = 0
        let days = days_from_civil(self.year, self.month, self.day);
        // The Thursday of this week decides the ISO year.
        let thursday = days - wd + 3;
        let (iso_year, _, _) = civil_from_days(thursday);
        let week = (thursday - days_from_civil(iso_year, 1, 1)) / 7 + 1;
        (iso_year, week as u32)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn civil_round_trip_and_weekday() {
        for z in [-1000i64, 0, 59, 365, 10957, 20786, 100000] {
            let (y, m, d) = civil_from_days(z);
            assert_eq!(days_from_civil(y, m, d), z);
        }
        // 2026-11-29 is a Sunday.
        let t = CivilTime::parse("2026-11-29T12:00:00").unwrap();
        assert_eq!(t.weekday(), 6);
        assert_eq!(t.ordinal(), 333);
    }

    #[test]
    fn strftime_matches_c_locale() {
        let t = CivilTime::parse("2026-11-29 09:05:07").unwrap();
        assert_eq!(t.strftime("%d %b %Y"), "29 Nov 2026");
        assert_eq!(t.strftime("%Y-%m-%d %H:%M:%S"), "2026-11-29 09:05:07");
        assert_eq!(
            t.strftime("%A %B %-d, %I %p %j"),
            "Sunday November 29, 09 AM 333"
        );
        assert_eq!(t.strftime("%F %T %% %Q"), "2026-11-29 09:05:07 % %Q");
        let jan = CivilTime::parse("2027-01-03").unwrap();
        assert_eq!(jan.strftime("%e|%-m|%G-W%V|%U|%W"), " 3|1|2026-W53|01|00");
    }

    #[test]
    fn parse_rejects_bad_input() {
        assert!(CivilTime::parse("2026-02-29").is_err());
        assert!(CivilTime::parse("2026-11-29T25:00").is_err());
        assert!(CivilTime::parse("yesterday").is_err());
        assert!(CivilTime::parse("2026-11-29T12").is_err());
    }
}
