//! `--runs N`: each target judged over all runs. One run's ratio is one
//! draw (at one client, where the scheduler puts the two ends of a round
//! trip moves a point by more than the service's margin). A target on a
//! number is MET when the 95 % confidence interval of its mean (Student's
//! t) keeps the bound, MISSED when it breaks it, UNDECIDED when it
//! straddles it; a target that something never happens, only if every run
//! met it.

use std::fmt::Write as _;

use statrs::distribution::{ContinuousCDF, StudentsT};

use crate::report::{lowest_and_highest, Target};

/// The mean of `values` and its 95 % confidence interval (mean, low,
/// high); None for fewer than two values.
pub fn interval(values: &[f64]) -> Option<(f64, f64, f64)> {
    let count = values.len() as f64;
    let mean = values.iter().sum::<f64>() / count;
    let variance = values.iter().map(|v| (v - mean).powi(2)).sum::<f64>() / (count - 1.0);
    let t = StudentsT::new(0.0, 1.0, count - 1.0).ok()?.inverse_cdf(0.975);
    let half = t * (variance / count).sqrt();
    (values.len() >= 2).then_some((mean, mean - half, mean + half))
}

/// One line of the section per target; `runs` holds each run's targets, in
/// the same order in every run (`Report::targets`).
pub fn markdown(runs: &[Vec<Target>]) -> String {
    let mut md = format!(
        "## The targets over {} runs\n\n\
         A target on a number is MET when the 95 % confidence interval of its mean over \
         the runs keeps the bound, MISSED when the interval breaks it, UNDECIDED when it \
         straddles it. A target that something never happens is MET only if every run \
         met it. Each run's report follows.\n\n\
         | target | runs met | mean (95 % interval) | lowest–highest run | over the runs |\n\
         |---|---|---|---|---|\n",
        runs.len()
    );
    for (index, target) in runs.first().into_iter().flatten().enumerate() {
        let of_runs: Vec<&Target> = runs.iter().filter_map(|run| run.get(index)).collect();
        let results: Vec<bool> = of_runs.iter().filter_map(|t| t.met).collect();
        let met = results.iter().filter(|&&met| met).count();
        let numbers: Vec<f64> = of_runs.iter().filter_map(|t| t.number.map(|n| n.0)).collect();
        let bound = of_runs.iter().find_map(|t| t.number.map(|n| n.1));
        let mean = interval(&numbers);
        let verdict = match (bound, mean) {
            _ if results.is_empty() => "not measured",
            (Some(bound), Some((_, low, high))) => match (bound.keeps(low), bound.keeps(high)) {
                (true, true) => "MET",
                (false, false) => "MISSED",
                _ => "UNDECIDED",
            },
            // Never-happens targets, and a number measured once.
            _ if met == results.len() => "MET",
            _ => "MISSED",
        };
        let mean = mean.map_or("—".to_owned(), |(m, l, h)| format!("{m:.2} ({l:.2}–{h:.2})"));
        let range = lowest_and_highest(&numbers)
            .map_or("—".to_owned(), |(l, h)| format!("{l:.2}–{h:.2}"));
        let name = &target.name;
        let _ =
            writeln!(md, "| {name} | {met} of {} | {mean} | {range} | {verdict} |", results.len());
    }
    md
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::report::Bound;

    fn target(value: f64, bound: Bound) -> Target {
        let met = Some(bound.keeps(value));
        Target { name: "t".to_owned(), measured: String::new(), met, number: Some((value, bound)) }
    }

    fn verdict(values: &[f64], bound: Bound) -> String {
        let runs: Vec<Vec<Target>> = values.iter().map(|&v| vec![target(v, bound)]).collect();
        let md = markdown(&runs);
        md.lines().last().unwrap().rsplit('|').nth(1).unwrap().trim().to_owned()
    }

    #[test]
    fn the_interval_is_students_t_around_the_mean() {
        // Mean 1.0, sample standard deviation 0.1, three values: the half
        // width is t(0.975, 2) = 4.303 × 0.1 / √3.
        let (mean, low, high) = interval(&[0.9, 1.0, 1.1]).unwrap();
        let half = 4.303 * 0.1 / 3f64.sqrt();
        assert!((mean - 1.0).abs() < 1e-12);
        assert!((low - (1.0 - half)).abs() < 1e-4 && (high - (1.0 + half)).abs() < 1e-4);
        assert_eq!(interval(&[1.0]), None);
    }

    #[test]
    fn a_number_is_met_only_when_its_whole_interval_keeps_the_bound() {
        let at_least = Bound::AtLeast(1.0);
        assert_eq!(verdict(&[1.13, 1.11, 1.08], at_least), "MET");
        assert_eq!(verdict(&[1.13, 0.97, 1.06, 0.94], at_least), "UNDECIDED");
        assert_eq!(verdict(&[0.90, 0.92, 0.91], at_least), "MISSED");
        assert_eq!(verdict(&[8.0, 20.0, 12.0], Bound::AtMost(15.0)), "UNDECIDED");
        assert_eq!(verdict(&[8.0, 9.0, 10.0], Bound::AtMost(15.0)), "MET");
        let line = markdown(&[vec![target(1.14, at_least)], vec![target(1.08, at_least)]]);
        assert!(line.contains("| t | 2 of 2 | 1.11 ("), "{line}");
    }

    #[test]
    fn a_never_target_is_met_only_if_every_run_met_it() {
        let never =
            |met| vec![Target { name: "n".into(), measured: String::new(), met, number: None }];
        let md = markdown(&[never(Some(true)), never(Some(false)), never(Some(true))]);
        assert!(md.ends_with("| n | 2 of 3 | — | — | MISSED |\n"), "{md}");
        assert!(markdown(&[never(Some(true)), never(Some(true))]).ends_with("| MET |\n"));
        assert!(markdown(&[never(None)]).ends_with("| 0 of 0 | — | — | not measured |\n"));
    }
}
