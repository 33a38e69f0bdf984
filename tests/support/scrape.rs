//! `/metrics` as Prometheus reads it: the text parsed by a Prometheus text-format parser, and
//! the samples looked up by metric name and labels.

use prom_text_format_parser::{Metric, Sample, Scrape, Type, ValueType};

/// A parsed scrape.
pub struct Metrics(Scrape);

/// One bucket of a histogram: how many observations were at most `le`.
#[derive(Debug, Clone, Copy)]
pub struct Bucket {
    pub le: f64,
    pub count: f64,
}

impl Metrics {
    /// Parses the text exposition `text`, failing the test if it does not parse.
    pub fn parse(text: &str) -> Metrics {
        Metrics(Scrape::parse(text).expect("the Prometheus text format"))
    }

    fn metric(&self, name: &str) -> Option<&Metric> {
        self.0.metrics.iter().find(|metric| metric.name == name)
    }

    /// The samples of `metric` of type `value_type` whose labels include every pair of
    /// `labels`.
    fn samples<'a>(
        &'a self,
        metric: &str,
        value_type: ValueType,
        labels: &'a [(&'a str, &'a str)],
    ) -> impl Iterator<Item = &'a Sample> + 'a {
        self.metric(metric)
            .into_iter()
            .flat_map(|metric| &metric.samples)
            .filter(move |sample| {
                sample.value.value_type == value_type
                    && labels.iter().all(|(name, value)| {
                        sample
                            .labels
                            .iter()
                            .any(|label| label.key == *name && label.value == *value)
                    })
            })
    }

    /// The one sample of `metric` with `labels`, of `value_type`; `None` when there is none.
    fn one(&self, metric: &str, value_type: ValueType, labels: &[(&str, &str)]) -> Option<f64> {
        let mut found = self.samples(metric, value_type, labels);
        let value = found.next().map(|sample| sample.value.value.as_f64());
        assert!(found.next().is_none(), "{metric} {labels:?} is ambiguous");
        value
    }

    /// The value of the counter or gauge `metric` with `labels`; `None` when there is none.
    pub fn value(&self, metric: &str, labels: &[(&str, &str)]) -> Option<f64> {
        if let Some(found) = self.metric(metric) {
            assert!(
                matches!(found.kind, Type::Counter | Type::Gauge),
                "{metric} is a {}",
                found.kind
            );
        }
        self.one(metric, ValueType::Sample, labels)
    }

    /// The buckets of the histogram `metric` with `labels`, by bound; empty when there is
    /// none.
    pub fn buckets(&self, metric: &str, labels: &[(&str, &str)]) -> Vec<Bucket> {
        let mut buckets: Vec<Bucket> = self
            .samples(metric, ValueType::Sample, labels)
            .map(|sample| {
                let le = sample
                    .labels
                    .iter()
                    .find(|label| label.key == "le")
                    .expect("a bucket has its bound");
                Bucket {
                    le: le.value.parse().expect("a bucket's bound is a number"),
                    count: sample.value.value.as_f64(),
                }
            })
            .collect();
        buckets.sort_by(|a, b| a.le.total_cmp(&b.le));
        buckets
    }

    /// How many observations the histogram `metric` with `labels` holds (its `_count`); 0
    /// when it has none yet.
    pub fn count(&self, metric: &str, labels: &[(&str, &str)]) -> f64 {
        self.one(metric, ValueType::Count, labels).unwrap_or(0.0)
    }

    /// Every value label `name` takes, across every sample.
    pub fn label_values(&self, name: &str) -> Vec<String> {
        self.0
            .metrics
            .iter()
            .flat_map(|metric| &metric.samples)
            .flat_map(|sample| sample.labels.iter())
            .filter(|label| label.key == name)
            .map(|label| label.value.clone())
            .collect()
    }

    /// The help text of `metric`.
    pub fn help(&self, metric: &str) -> Option<&str> {
        self.metric(metric)?.help_desc.as_deref()
    }
}
