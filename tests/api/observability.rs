//! What an on-call engineer relies on: metrics that move when their event
//! happens (`metrics`), log lines tied to the request that caused them and
//! no secret in any log (`logs`).

use std::collections::HashMap;

use crate::helpers::TestApp;

mod logs;
mod metrics;

/// The sum of the samples of `family` whose labels include all of `labels`
/// (histograms: their `_count`).
pub fn sample(text: &str, family: &str, labels: &[(&str, &str)]) -> f64 {
    text.lines()
        .filter(|line| !line.starts_with('#'))
        .filter_map(|line| {
            let (series, value) = line.rsplit_once(' ')?;
            let (name, rest) = series.split_once('{').unwrap_or((series, "}"));
            if name != family {
                return None;
            }
            let found: HashMap<&str, &str> = rest
                .trim_end_matches('}')
                .split(',')
                .filter_map(|pair| pair.split_once('='))
                .map(|(k, v)| (k, v.trim_matches('"')))
                .collect();
            labels
                .iter()
                .all(|(k, v)| found.get(k) == Some(v))
                .then(|| value.parse::<f64>().ok())
                .flatten()
        })
        .sum()
}

pub async fn scrape(app: &TestApp) -> String {
    let reply = app.get("/metrics").await;
    assert_eq!(reply.status, 200);
    assert!(reply
        .header("content-type")
        .is_some_and(|t| t.starts_with("text/plain")));
    reply.body
}
