//! Alerts: a JSON POST to a configurable webhook when a farm cannot do what is asked
//! (too few eligible nodes, contention). Without a webhook alerts are only logged.

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::Duration;

use serde::Serialize;
use tokio::time::Instant;

/// The same incident is sent at most this often.
const REPEAT_AFTER: Duration = Duration::from_secs(300);

/// What is posted: shaped like a PagerDuty v1 event, as P2's alerts were.
#[derive(Debug, Clone, Serialize)]
pub struct Alert {
    /// Identifies the incident; repeats of one key are merged by the receiver.
    pub incident_key: String,
    pub description: String,
    pub details: serde_json::Value,
    /// `low` or `high`.
    pub urgency: &'static str,
    pub event_type: &'static str,
}

/// Sends alerts.
pub struct Alerter {
    webhook: Option<String>,
    client: reqwest::Client,
    last_sent: Mutex<HashMap<String, Instant>>,
}

impl Alerter {
    /// Alerts go to `webhook`, or only to the log when it is `None`.
    pub fn new(webhook: Option<String>) -> Self {
        Alerter {
            webhook,
            client: reqwest::Client::builder()
                .timeout(Duration::from_secs(5))
                .build()
                .expect("a client with a timeout always builds"),
            last_sent: Mutex::new(HashMap::new()),
        }
    }

    /// Whether an alert about `incident_key` is to be sent now: not if the same incident was
    /// sent recently. It counts as sent from now on.
    pub fn due(&self, incident_key: &str) -> bool {
        let mut last_sent = self.last_sent.lock().expect("no panics while held");
        if let Some(at) = last_sent.get(incident_key) {
            if at.elapsed() < REPEAT_AFTER {
                return false;
            }
        }
        last_sent.insert(incident_key.to_owned(), Instant::now());
        true
    }

    /// Logs a low-urgency alert and posts it to the webhook, if there is one (see
    /// [`Alerter::due`] for leaving out repeats).
    pub async fn send_low(
        &self,
        incident_key: String,
        description: String,
        details: serde_json::Value,
    ) {
        tracing::warn!(incident = incident_key, %details, "alert: {description}");
        let Some(url) = &self.webhook else {
            return;
        };
        let alert = Alert {
            incident_key,
            description,
            details,
            urgency: "low",
            event_type: "trigger",
        };
        match self.client.post(url).json(&alert).send().await {
            Ok(response) if response.status().is_success() => {}
            Ok(response) => tracing::warn!(status = %response.status(), "alert webhook refused"),
            Err(e) => tracing::warn!(error = %e, "alert webhook unreachable"),
        }
    }
}
