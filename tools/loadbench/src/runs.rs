//! Several full runs, and each target judged over all of them
//! (`scripts/bench --runs N`).
//!
//! One run's ratio is one draw: at one client, where the scheduler puts the
//! two ends of a round trip moves a point by more than the service's margin
//! (BENCHMARKS.md, rounds 16 and 18), so a target at or near parity passes
//! one run and misses the next. Over runs, a target on a number is judged by
//! the mean and its 95 % confidence interval (Student's t, the runs taken as
//! independent draws):
//!
//! - **met**: the whole interval keeps the bound;
//! - **missed**: the whole interval breaks it;
//! - **undecided**: the interval straddles it: more runs, or a real margin,
//!   would tell.
//!
//! A target that something never happens (a request over 100 ms, a non-2xx
//! answer) has no mean: it is met only if every run met it.

use std::fmt::Write as _;

use crate::report::{lowest_and_highest, Target};

/// What the runs say of one target.
#[derive(Debug, PartialEq)]
pub struct Judgement {
    pub name: String,
    /// Runs that met it, of the runs that measured it.
    pub met: usize,
    pub measured: usize,
    /// The mean over the runs with its 95 % interval, for a target on a
    /// number measured at least twice.
    pub mean: Option<Interval>,
    /// The lowest and the highest run.
    pub range: Option<(f64, f64)>,
    pub verdict: Verdict,
}

#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Interval {
    pub mean: f64,
    pub low: f64,
    pub high: f64,
}

#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Verdict {
    Met,
    Missed,
    Undecided,
}

impl Verdict {
    fn text(self) -> &'static str {
        match self {
            Verdict::Met => "MET",
            Verdict::Missed => "MISSED",
            Verdict::Undecided => "UNDECIDED",
        }
    }
}

/// Two-sided 95 % quantiles of Student's t for 1 to 30 degrees of freedom.
/// Past 30 the value for 30 is used: a little wider than the truth, never
/// narrower.
const T_95: [f64; 30] = [
    12.706, 4.303, 3.182, 2.776, 2.571, 2.447, 2.365, 2.306, 2.262, 2.228, 2.201, 2.179, 2.160,
    2.145, 2.131, 2.120, 2.110, 2.101, 2.093, 2.086, 2.080, 2.074, 2.069, 2.064, 2.060, 2.056,
    2.052, 2.048, 2.045, 2.042,
];

/// The mean of `values` and its 95 % confidence interval; None for fewer
/// than two values.
pub fn interval(values: &[f64]) -> Option<Interval> {
    let n = values.len();
    if n < 2 {
        return None;
    }
    let count = n as f64;
    let mean = values.iter().sum::<f64>() / count;
    let variance = values.iter().map(|v| (v - mean).powi(2)).sum::<f64>() / (count - 1.0);
    let t = T_95[(n - 2).min(T_95.len() - 1)];
    let half = t * (variance / count).sqrt();
    Some(Interval {
        mean,
        low: mean - half,
        high: mean + half,
    })
}

/// Judges each target over the runs; `runs` holds each run's targets, in
/// the same order in every run (`Report::targets`).
pub fn judge(runs: &[Vec<Target>]) -> Vec<Judgement> {
    let Some(first) = runs.first() else {
        return Vec::new();
    };
    first
        .iter()
        .enumerate()
        .map(|(index, target)| {
            let of_runs: Vec<&Target> = runs.iter().filter_map(|run| run.get(index)).collect();
            judge_one(&target.name, &of_runs)
        })
        .collect()
}

fn judge_one(name: &str, runs: &[&Target]) -> Judgement {
    let results: Vec<bool> = runs.iter().filter_map(|target| target.met).collect();
    let met = results.iter().filter(|&&met| met).count();
    let numbers: Vec<f64> = runs
        .iter()
        .filter_map(|target| target.number.map(|number| number.value))
        .collect();
    let bound = runs
        .iter()
        .find_map(|target| target.number.map(|number| number.bound));
    let mean = interval(&numbers);
    let range = lowest_and_highest(&numbers);
    let verdict = match (bound, mean) {
        (Some(bound), Some(mean)) => {
            let keeps_low = bound.keeps(mean.low);
            let keeps_high = bound.keeps(mean.high);
            match (keeps_low, keeps_high) {
                (true, true) => Verdict::Met,
                (false, false) => Verdict::Missed,
                _ => Verdict::Undecided,
            }
        }
        // Never-happens targets, and a number measured once: every run
        // must have met it.
        _ if results.is_empty() => Verdict::Undecided,
        _ if met == results.len() => Verdict::Met,
        _ => Verdict::Missed,
    };
    Judgement {
        name: name.to_owned(),
        met,
        measured: results.len(),
        mean,
        range,
        verdict,
    }
}

/// The judgements as a Markdown section.
pub fn markdown(judgements: &[Judgement], runs: usize) -> String {
    let mut md = String::new();
    let _ = writeln!(
        md,
        "## The targets over {runs} runs\n\n\
         A target on a number is MET when the 95 % confidence interval of its mean over \
         the runs keeps the bound, MISSED when the interval breaks it, UNDECIDED when it \
         straddles it. A target that something never happens is MET only if every run \
         met it. Each run's report follows.\n\n\
         | target | runs met | mean (95 % interval) | lowest–highest run | over the runs |\n\
         |---|---|---|---|---|"
    );
    for judgement in judgements {
        let mean = judgement.mean.map_or("—".to_owned(), |interval| {
            format!(
                "{:.2} ({:.2}–{:.2})",
                interval.mean, interval.low, interval.high
            )
        });
        let range = judgement.range.map_or("—".to_owned(), |(low, high)| {
            format!("{low:.2}–{high:.2}")
        });
        let verdict = match judgement.measured {
            0 => "not measured",
            _ => judgement.verdict.text(),
        };
        let _ = writeln!(
            md,
            "| {} | {} of {} | {mean} | {range} | {verdict} |",
            judgement.name, judgement.met, judgement.measured,
        );
    }
    md
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::report::{Bound, Bounded};

    fn ratio_target(value: f64) -> Target {
        Target {
            name: "replay ≥ 1.0 × floor at 1".to_owned(),
            measured: format!("{value:.2}"),
            met: Some(value >= 1.0),
            number: Some(Bounded {
                value,
                bound: Bound::AtLeast(1.0),
            }),
        }
    }

    fn never_target(met: bool) -> Target {
        Target {
            name: "zero non-2xx answers".to_owned(),
            measured: String::new(),
            met: Some(met),
            number: None,
        }
    }

    fn runs_of(values: &[f64]) -> Vec<Vec<Target>> {
        values
            .iter()
            .map(|&value| vec![ratio_target(value), never_target(true)])
            .collect()
    }

    #[test]
    fn the_interval_is_students_t_around_the_mean() {
        // Mean 1.0, sample standard deviation 0.1, three values: the half
        // width is 4.303 × 0.1 / √3.
        let interval = interval(&[0.9, 1.0, 1.1]).unwrap();
        assert!((interval.mean - 1.0).abs() < 1e-12);
        let half = 4.303 * 0.1 / 3f64.sqrt();
        assert!((interval.low - (1.0 - half)).abs() < 1e-9, "{interval:?}");
        assert!((interval.high - (1.0 + half)).abs() < 1e-9, "{interval:?}");
        // Beyond 31 values the table's last quantile is used.
        let many: Vec<f64> = (0..40).map(|i| f64::from(i % 2)).collect();
        let wide = super::interval(&many).unwrap();
        let sd = (10.0f64 / 39.0).sqrt();
        assert!((wide.high - 0.5 - 2.042 * sd / 40f64.sqrt()).abs() < 1e-9);
        assert_eq!(super::interval(&[1.0]), None);
        assert_eq!(super::interval(&[]), None);
    }

    #[test]
    fn a_ratio_is_met_only_when_its_whole_interval_keeps_the_bound() {
        // Round 18's three runs: every one over 1.0, the interval too.
        let met = &judge(&runs_of(&[1.13, 1.11, 1.08]))[0];
        assert_eq!(met.verdict, Verdict::Met);
        assert_eq!((met.met, met.measured), (3, 3));
        assert_eq!(met.range, Some((1.08, 1.13)));
        // Round 16's four: two runs under 1.0, the mean over it, the
        // interval across it.
        let undecided = &judge(&runs_of(&[1.13, 0.97, 1.06, 0.94]))[0];
        assert_eq!(undecided.verdict, Verdict::Undecided);
        assert_eq!(undecided.met, 2);
        let mean = undecided.mean.unwrap();
        assert!(mean.low < 1.0 && mean.mean > 1.0 && mean.high > 1.0);
        // Every run under: the interval too.
        let missed = &judge(&runs_of(&[0.90, 0.92, 0.91]))[0];
        assert_eq!(missed.verdict, Verdict::Missed);
        // Every run over, but two runs too far apart to say.
        assert_eq!(
            judge(&runs_of(&[1.01, 1.30]))[0].verdict,
            Verdict::Undecided
        );
    }

    #[test]
    fn an_upper_bound_is_judged_from_the_other_side() {
        let p99 = |value: f64| Target {
            name: "p99 of new at 32 ≤ 15 ms".to_owned(),
            measured: String::new(),
            met: Some(value <= 15.0),
            number: Some(Bounded {
                value,
                bound: Bound::AtMost(15.0),
            }),
        };
        let runs = |values: &[f64]| -> Vec<Vec<Target>> {
            values.iter().map(|&value| vec![p99(value)]).collect()
        };
        assert_eq!(judge(&runs(&[8.0, 9.0, 10.0]))[0].verdict, Verdict::Met);
        assert_eq!(
            judge(&runs(&[20.0, 21.0, 22.0]))[0].verdict,
            Verdict::Missed
        );
        assert_eq!(
            judge(&runs(&[8.0, 20.0, 12.0]))[0].verdict,
            Verdict::Undecided
        );
    }

    #[test]
    fn a_never_target_is_met_only_if_every_run_met_it() {
        let runs = |results: &[bool]| -> Vec<Vec<Target>> {
            results.iter().map(|&met| vec![never_target(met)]).collect()
        };
        assert_eq!(judge(&runs(&[true, true, true]))[0].verdict, Verdict::Met);
        let once = &judge(&runs(&[true, false, true]))[0];
        assert_eq!(once.verdict, Verdict::Missed);
        assert_eq!((once.met, once.measured), (2, 3));
        assert_eq!(once.mean, None);
        // Not measured in any run: nothing to say.
        let unmeasured = Target {
            met: None,
            ..never_target(true)
        };
        assert_eq!(judge(&[vec![unmeasured]])[0].verdict, Verdict::Undecided);
    }

    #[test]
    fn the_section_has_a_line_per_target() {
        let judgements = judge(&runs_of(&[1.13, 1.11, 1.08]));
        let md = markdown(&judgements, 3);
        assert!(md.starts_with("## The targets over 3 runs\n"), "{md}");
        assert!(
            md.contains(
                "| replay ≥ 1.0 × floor at 1 | 3 of 3 | 1.11 (1.04–1.17) | 1.08–1.13 | MET |"
            ),
            "{md}"
        );
        assert!(
            md.contains("| zero non-2xx answers | 3 of 3 | — | — | MET |"),
            "{md}"
        );
        // A quick run measures no point at 64 clients.
        let unmeasured = Target {
            met: None,
            number: None,
            ..ratio_target(1.0)
        };
        let md = markdown(&judge(&[vec![unmeasured]]), 1);
        assert!(md.contains("| 0 of 0 | — | — | not measured |"), "{md}");
    }
}
