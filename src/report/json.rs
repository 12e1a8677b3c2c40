//! The JSON Lines reporter: one `{"format_version", "type", "data"}` object per event on stdout.

use std::io::Write;

use serde::{Deserialize, Serialize};

use super::event::{Event, Reporter};
use super::record::FORMAT_VERSION;

/// One line of JSON output.
#[derive(Debug, Serialize, Deserialize)]
pub struct Envelope {
    /// The report format version.
    pub format_version: u32,
    /// The event, as `type` and `data`.
    #[serde(flatten)]
    pub event: Event,
}

/// JSON Lines to a writer (stdout by default).
pub struct JsonReporter {
    out: Box<dyn Write>,
}

impl JsonReporter {
    /// A reporter writing to stdout.
    pub fn new() -> Self {
        Self {
            out: Box::new(std::io::stdout()),
        }
    }

    /// A reporter writing to `out`.
    pub fn to_writer(out: Box<dyn Write>) -> Self {
        Self { out }
    }
}

impl Default for JsonReporter {
    fn default() -> Self {
        Self::new()
    }
}

impl Reporter for JsonReporter {
    fn event(&mut self, event: &Event) {
        let envelope = Envelope {
            format_version: FORMAT_VERSION,
            event: event.clone(),
        };
        if let Ok(line) = serde_json::to_string(&envelope) {
            // A closed pipe stops nothing: the run's result is on disk either way.
            let _ = writeln!(self.out, "{line}");
            let _ = self.out.flush();
        }
    }
}
