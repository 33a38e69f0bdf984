//! `/metrics` as Prometheus reads it: the text parsed by a Prometheus text parser, and the
//! samples looked up by metric name and labels.

use prometheus_parse::{HistogramCount, Scrape, Value};

/// A parsed scrape.
pub struct Metrics(Scrape);

impl Metrics {
    /// Parses the text exposition `text`, failing the test if it does not parse.
    pub fn parse(text: &str) -> Metrics {
        let lines = text.lines().map(|line| Ok(line.to_owned()));
        Metrics(Scrape::parse(lines).expect("the Prometheus text format"))
    }

    /// The samples of `metric` whose labels include every pair of `labels`.
    fn matching<'a>(
        &'a self,
        metric: &'a str,
        labels: &'a [(&'a str, &'a str)],
    ) -> impl Iterator<Item = &'a prometheus_parse::Sample> + 'a {
        self.0.samples.iter().filter(move |sample| {
            sample.metric == metric
                && labels
                    .iter()
                    .all(|(name, value)| sample.labels.get(name) == Some(*value))
        })
    }

    /// The value of the one counter or gauge sample of `metric` with `labels`; `None` when
    /// there is none.
    pub fn value(&self, metric: &str, labels: &[(&str, &str)]) -> Option<f64> {
        let mut found = self
            .matching(metric, labels)
            .map(|sample| match sample.value {
                Value::Counter(v) | Value::Gauge(v) | Value::Untyped(v) => v,
                ref other => panic!("{metric} is not a single value: {other:?}"),
            });
        let value = found.next();
        assert!(found.next().is_none(), "{metric} {labels:?} is ambiguous");
        value
    }

    /// The buckets of the one histogram `metric` with `labels`, in order; empty when there
    /// is none.
    pub fn buckets(&self, metric: &str, labels: &[(&str, &str)]) -> Vec<HistogramCount> {
        let mut found = self
            .matching(metric, labels)
            .filter_map(|sample| match &sample.value {
                Value::Histogram(buckets) => Some(buckets.clone()),
                _ => None,
            });
        let mut buckets = found.next().unwrap_or_default();
        assert!(found.next().is_none(), "{metric} {labels:?} is ambiguous");
        buckets.sort_by(|a, b| a.less_than.total_cmp(&b.less_than));
        buckets
    }

    /// How many observations histogram `metric` with `labels` has (its `_count`); 0 when it
    /// has none yet.
    pub fn count(&self, metric: &str, labels: &[(&str, &str)]) -> f64 {
        self.value(&format!("{metric}_count"), labels)
            .unwrap_or(0.0)
    }

    /// Every value label `name` takes across the samples of every metric.
    pub fn label_values(&self, name: &str) -> Vec<String> {
        self.0
            .samples
            .iter()
            .filter_map(|sample| sample.labels.get(name).map(str::to_owned))
            .collect()
    }

    /// The help text of `metric`.
    pub fn help(&self, metric: &str) -> Option<&str> {
        self.0.docs.get(metric).map(String::as_str)
    }
}
