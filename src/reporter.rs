//! Renders events: a progress bar on a terminal, plain lines otherwise (both on stderr, result on stdout),
//! or JSON Lines on stdout for machines.

use std::io::{IsTerminal, Write};
use std::time::{Duration, Instant};

use indicatif::{ProgressBar, ProgressStyle};

use crate::events::{Event, Phase, Reporter};
use crate::report::{ProbeRole, Report, RunResult, FORMAT_VERSION};

/// Human output.
pub struct HumanReporter {
    bar: Option<ProgressBar>,
    started: Instant,
}

impl HumanReporter {
    /// A reporter with a progress bar when stderr is a terminal.
    pub fn new() -> Self {
        let bar = std::io::stderr().is_terminal().then(|| {
            let bar = ProgressBar::new_spinner();
            let style = ProgressStyle::with_template("{spinner} [{elapsed_precise}] {msg}")
                .unwrap_or_else(|_| ProgressStyle::default_spinner());
            bar.set_style(style);
            bar.enable_steady_tick(Duration::from_millis(120));
            bar
        });
        Self {
            bar,
            started: Instant::now(),
        }
    }

    fn line(&self, text: &str) {
        match &self.bar {
            Some(bar) => bar.println(text),
            None => eprintln!("[{:>7.1}s] {text}", self.started.elapsed().as_secs_f64()),
        }
    }
}

impl Default for HumanReporter {
    fn default() -> Self {
        Self::new()
    }
}

fn role_name(role: ProbeRole) -> &'static str {
    match role {
        ProbeRole::BadEndpoint => "bad endpoint",
        ProbeRole::GoodEndpoint => "good endpoint",
        ProbeRole::Search => "probe",
    }
}

impl Reporter for HumanReporter {
    fn event(&mut self, event: &Event) {
        match event {
            Event::RunStarted {
                candidates,
                run_dir,
                launch_blocking,
            } => {
                self.line(&format!("{candidates} commits in range; logs in {run_dir}"));
                if !launch_blocking {
                    self.line("warning: CUDA_LAUNCH_BLOCKING is off (launch-blocking = false): faults may surface late");
                }
            }
            Event::PhaseStarted {
                step,
                commit,
                role,
                phase,
                remaining,
                estimated_steps,
            } => {
                let phase = match phase {
                    Phase::Checkout => "checkout",
                    Phase::Build => "build",
                    Phase::Repro => "repro",
                    Phase::Triage => "triage",
                };
                let msg = format!(
                    "step {step} ({}) · {remaining} candidates left (~{estimated_steps} steps) · {} · {phase}",
                    role_name(*role),
                    &commit[..12.min(commit.len())]
                );
                match &self.bar {
                    Some(bar) => bar.set_message(msg),
                    None if phase == "build" || phase == "repro" => self.line(&msg),
                    None => {}
                }
            }
            Event::ProbeFinished { step, record } => {
                let mut text = format!(
                    "step {step}: {} {} → {:?} ({}, {:.1}s)",
                    role_name(record.role),
                    &record.commit[..12.min(record.commit.len())],
                    record.verdict,
                    record.signature.short(),
                    record.duration_s
                )
                .to_lowercase();
                if let Some(reason) = &record.reason {
                    text.push_str(&format!(": skipped, {reason}"));
                }
                self.line(&text);
            }
            Event::Warning { message } => self.line(&format!("warning: {message}")),
            Event::TriageFinished { summary } => self.line(&format!("triage: {summary}")),
            Event::Finished { report } => {
                if let Some(bar) = self.bar.take() {
                    bar.finish_and_clear();
                }
                print!("{}", summary(report));
                let _ = std::io::stdout().flush();
            }
        }
    }
}

/// The human summary printed at the end of a run.
pub fn summary(report: &Report) -> String {
    let mut out = String::new();
    match (report.result, &report.first_bad) {
        (RunResult::Found, Some(info)) => {
            out.push_str(&format!("First bad commit: {}\n", info.commit));
            out.push_str(&format!(
                "    {}\n    Author: {}\n    Date:   {}\n",
                info.subject, info.author, info.date
            ));
            for f in &info.files_changed {
                out.push_str(&format!("    {f}\n"));
            }
        }
        (RunResult::Ambiguous, _) => {
            out.push_str(&format!("{}:\n", report.message));
            for c in &report.candidates {
                out.push_str(&format!("    {} {}\n", c.commit, c.subject));
            }
        }
        _ => out.push_str(&format!("{}\n", report.message)),
    }
    if let Some(target) = &report.target {
        out.push_str(&format!("Fault: {} — {}\n", target.short(), target.summary));
    }
    if let Some(summary) = report
        .triage
        .as_ref()
        .and_then(|t| t.get("summary"))
        .and_then(|s| s.as_str())
    {
        out.push_str(&format!("Triage: {summary}\n"));
    }
    let searched = report
        .probes
        .iter()
        .filter(|p| p.role == ProbeRole::Search)
        .count();
    out.push_str(&format!(
        "Probes: {} ({searched} in the search)\n",
        report.probes.len()
    ));
    out
}

/// JSON Lines on stdout: one object per event, with the format version.
pub struct JsonReporter;

impl Reporter for JsonReporter {
    fn event(&mut self, event: &Event) {
        let mut value = serde_json::to_value(event).unwrap_or_default();
        if let Some(obj) = value.as_object_mut() {
            obj.insert("format_version".into(), FORMAT_VERSION.into());
        }
        let mut stdout = std::io::stdout().lock();
        let _ = writeln!(stdout, "{value}");
        let _ = stdout.flush();
    }
}
