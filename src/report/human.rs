//! The human reporter: a progress bar on a terminal, plain timestamped lines otherwise (both on stderr),
//! and the summary on stdout.

use crate::report::record::short_sha;
use std::io::{IsTerminal, Write};
use std::time::{Duration, Instant};

use indicatif::{ProgressBar, ProgressStyle};

use super::event::{Event, Phase, Reporter};
use super::record::{ProbeRole, Report, RunResult, ShrinkReport};

/// Human output.
pub struct HumanReporter {
    bar: Option<ProgressBar>,
    started: Option<Instant>,
    progress: Box<dyn Write>,
    out: Box<dyn Write>,
    /// Each parallel worker's commit and phase, for the progress line.
    workers: std::collections::BTreeMap<usize, String>,
    /// What the run calls its two states.
    terms: crate::report::record::Terms,
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
            started: Some(Instant::now()),
            progress: Box::new(std::io::stderr()),
            out: Box::new(std::io::stdout()),
            workers: Default::default(),
            terms: Default::default(),
        }
    }

    /// A reporter writing progress lines (without timestamps, so output can be compared) and the summary
    /// to the given writers.
    pub fn to_writers(progress: Box<dyn Write>, out: Box<dyn Write>) -> Self {
        Self {
            bar: None,
            started: None,
            progress,
            out,
            workers: Default::default(),
            terms: Default::default(),
        }
    }

    fn line(&mut self, text: &str) {
        match (&self.bar, self.started) {
            (Some(bar), _) => bar.println(text),
            (None, Some(t)) => {
                let _ = writeln!(
                    self.progress,
                    "[{:>7.1}s] {text}",
                    t.elapsed().as_secs_f64()
                );
            }
            (None, None) => {
                let _ = writeln!(self.progress, "{text}");
            }
        }
    }

    /// Writes to stdout, ignoring a closed pipe (`cudabisect … | head` must not panic).
    fn print(&mut self, text: &str) {
        if let Some(bar) = self.bar.take() {
            bar.finish_and_clear();
        }
        let _ = self.out.write_all(text.as_bytes());
        let _ = self.out.flush();
    }
}

impl Default for HumanReporter {
    fn default() -> Self {
        Self::new()
    }
}

/// A probe's role in words. With other terms than good and bad (`--find-fix`'s broken and fixed, or
/// `--term-old`/`--term-new`) the ends are the old and the new end: "good endpoint → broken" would say
/// two things at once.
fn role_name(role: ProbeRole, terms: &crate::report::record::Terms) -> &'static str {
    let plain = *terms == crate::report::record::Terms::default();
    match role {
        ProbeRole::BadEndpoint if plain => "bad endpoint",
        ProbeRole::BadEndpoint => "new end",
        ProbeRole::GoodEndpoint if plain => "good endpoint",
        ProbeRole::GoodEndpoint => "old end",
        ProbeRole::MergeBase => "merge base",
        ProbeRole::EndpointSanitizer if plain => "bad endpoint under compute-sanitizer",
        ProbeRole::EndpointSanitizer => "end under compute-sanitizer",
        ProbeRole::Search => "probe",
        ProbeRole::Verify => "verify",
        ProbeRole::Head => "head",
    }
}

impl Reporter for HumanReporter {
    fn event(&mut self, event: &Event) {
        match event {
            Event::RunStarted {
                candidates,
                run_dir,
                launch_blocking,
                terms,
            } => {
                self.terms = terms.clone();
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
                worker,
            } => {
                let phase = match phase {
                    Phase::Checkout => "checkout",
                    Phase::Build => "build",
                    Phase::Repro => "repro",
                };
                let left = match (role, remaining) {
                    // The nightly head is not a search: nothing is left of a range yet.
                    (ProbeRole::Head, _) => String::new(),
                    (_, 1) => "1 candidate left (~1 step) · ".to_string(),
                    _ => format!(
                        "{remaining} candidates left (~{estimated_steps} {}) · ",
                        if *estimated_steps == 1 { "step" } else { "steps" }
                    ),
                };
                let msg = format!(
                    "step {step} ({}) · {left}{} · {phase}",
                    role_name(*role, &self.terms),
                    short_sha(commit)
                );
                // With parallel workers every worker's commit and phase stay on the progress line.
                let msg = match worker {
                    Some(w) => {
                        self.workers.insert(
                            *w,
                            format!("w{w} {} {phase}", &commit[..8.min(commit.len())]),
                        );
                        let all: Vec<&str> = self.workers.values().map(String::as_str).collect();
                        if self.bar.is_some() {
                            format!("{remaining} candidates left · {}", all.join(" | "))
                        } else {
                            format!("[w{w}] {msg}")
                        }
                    }
                    None => msg,
                };
                match &self.bar {
                    Some(bar) => bar.set_message(msg),
                    None if phase == "build" || phase == "repro" => self.line(&msg),
                    None => {}
                }
            }
            Event::ProbeFinished { step, record } => {
                let mut text = format!(
                    "step {step}: {} {} → {} ({}, {:.1}s)",
                    role_name(record.role, &self.terms),
                    short_sha(&record.commit),
                    self.terms.word(record.verdict),
                    // A run that showed no failure is clean, in words; `none` is the class's name.
                    if record.signature.class == crate::classify::FaultClass::None {
                        "clean".to_string()
                    } else {
                        record.signature.short().to_lowercase()
                    },
                    record.duration_s
                );
                if let Some(reason) = &record.reason {
                    text.push_str(&format!(": skipped, {reason}"));
                }
                if record.reused {
                    text.push_str(" [reused from the journal]");
                }
                if let Some(job) = &record.job {
                    // Queue time apart from run time: it never counted toward the timeout.
                    text.push_str(&format!(
                        " [{} job {}{}, queued {:.1}s]",
                        job.scheduler,
                        job.id,
                        job.node
                            .as_deref()
                            .map(|n| format!(" on {n}"))
                            .unwrap_or_default(),
                        job.queue_s
                    ));
                }
                self.line(&text);
            }
            Event::ProbeAbandoned {
                step,
                commit,
                worker,
            } => self.line(&format!(
                "note: step {step}: stopped the probe of {} (worker {worker}): its answer no longer matters",
                short_sha(commit)
            )),
            Event::SanitizerRerun { step, commit } => self.line(&format!(
                "step {step}: {} under compute-sanitizer, to learn which kernel faulted",
                short_sha(commit)
            )),
            Event::FlakyDetected {
                faults,
                runs,
                confidence,
                max_runs,
                workers,
            } => self.line(&format!(
                "note: the bad end showed the fault on {faults} of {runs} runs: a flaky fault; searching for the most likely first bad commit (confidence {confidence}, at most {max_runs} runs, {workers} at once)"
            )),
            Event::FlakyAfterAll { culprit } => self.line(&format!(
                "note: the parent of {} shows the fault too: a flaky fault after all; searching for the most likely first bad commit with every run so far",
                short_sha(culprit)
            )),
            Event::GoodShowsOtherBug {
                what, signature, ..
            } => self.line(&format!(
                "note: {what} shows another bug ({signature}), not this one: it counts as good for this search"
            )),
            Event::ProbesAtOnce {
                gpu,
                probes,
                workers,
                reason,
            } => self.line(&format!(
                "note: {probes} of {workers} workers probe at once on GPU {gpu}: {reason}"
            )),
            Event::RememberedStackMisled {
                culprit,
                named,
                expected,
            } => self.line(&format!(
                "warning: the sanitizer names {named} at {}, where the search took a remembered fault stack for {expected}'s: the same lines launch more than one kernel. Searching again, every lookalike settled by the sanitizer itself",
                short_sha(culprit)
            )),
            Event::Resumed { reusable, retried } => {
                if *reusable > 0 {
                    self.line(&format!("note: resuming: {reusable} commit(s) of this range have journaled results from an earlier run with this config"));
                }
                if *retried > 0 {
                    self.line(&format!("note: {retried} journaled outcome(s) of the machine, not of a commit (infrastructure, a repro that could not start, missing objects) are not reused: those probes run again"));
                }
            }
            Event::ParallelAnswerDisagrees { why } => self.line(&format!(
                "warning: the parallel search's answer does not hold when run again apart from the search: {why}. The workers disturbed each other (a file, cache or port they all use): searching again one probe at a time. Give each worker what it writes (docs/guide/distributed.md) to search in parallel"
            )),
            Event::WorktreeNotRemoved { path, error } => self.line(&format!(
                "warning: the probe worktree was not removed: {path}: {error}"
            )),
            Event::StageBegan { stage } => match stage {
                crate::report::event::Stage::Triage => {
                    self.line("triage: rerunning the first bad commit under compute-sanitizer")
                }
                crate::report::event::Stage::ShrinkCapture => {
                    self.line("shrink: capturing the faulting training step from the repro command")
                }
                crate::report::event::Stage::NightlyHead { branch, commit } => self.line(
                    &format!("nightly: testing {branch} at {}", short_sha(commit)),
                ),
            },
            Event::EnvironmentProbe { tool } => {
                self.line(&format!("bundle: asking {tool} about the environment"))
            }
            Event::NightlyNewState {
                branch,
                others,
                state_dir,
            } => self.line(&format!(
                "note: a new state for {branch}: none yet for this repository, branch and judging config; {others} other state file(s) of this branch in {state_dir} (another config or repository)"
            )),
            Event::Warning { message } => self.line(&format!("warning: {message}")),
            Event::Planned { note } => self.line(&format!("note: {note}")),
            Event::BundleWritten { path, bytes } => {
                self.line(&format!("note: bundle: {path} ({})", human_bytes(*bytes)))
            }
            Event::TriageFinished { summary, .. } => self.line(&format!("triage: {summary}")),
            Event::ShrinkStarted { nodes } => self.line(&format!(
                "shrink: {nodes} nodes; locating the fault with a recorded run"
            )),
            Event::ShrinkUnderMemcheck { why } => self.line(&format!(
                "shrink: {why}; running it under compute-sanitizer's memcheck, which sees an overrun wherever it lands"
            )),
            Event::ShrinkLocated { node, signature } => self.line(&format!(
                "shrink: the fault is in node {node} ({signature})"
            )),
            Event::ShrinkCandidate {
                run,
                stage,
                nodes,
                reproduced,
            } => {
                let stage = match stage {
                    crate::shrink::Stage::Alone => "node alone",
                    crate::shrink::Stage::Window => "window",
                    crate::shrink::Stage::Ddmin | crate::shrink::Stage::Done => "delta",
                };
                let verdict = if *reproduced {
                    "reproduces"
                } else {
                    "does not"
                };
                let msg = format!(
                    "shrink: candidate {run} ({stage}): {nodes} node{} → {verdict}",
                    if *nodes == 1 { "" } else { "s" }
                );
                match &self.bar {
                    Some(bar) => bar.set_message(msg),
                    None => self.line(&msg),
                }
            }
            Event::ShrinkFinished { summary, .. } => self.line(&format!("shrink: {summary}")),
            Event::ShrinkDone { report } => self.print(&shrink_summary(report)),
            // `triage` and `bundle pack` print their own human result; these events are their JSON form.
            Event::TriageDone { .. } | Event::BundlePacked { .. } | Event::ConfigWritten { .. } => {}
            Event::Finished { report } => self.print(&summary(report)),
            Event::Nightly { record } => self.print(&format!(
                "Nightly: {}: {}\n",
                record.status.as_str(),
                record.message
            )),
        }
    }
}

/// Text from a repository (a subject, a file name) made safe for a terminal: control characters (escape
/// sequences that would clear the screen or set the title, carriage returns) shown as `\x1b`-style
/// escapes, and a very long line cut, as git quotes such names.
pub fn printable(text: &str) -> String {
    const MAX: usize = 500;
    let mut out = String::new();
    for (n, c) in text.chars().enumerate() {
        if n == MAX {
            out.push('…');
            break;
        }
        if c.is_control() {
            out.extend(c.escape_default());
        } else {
            out.push(c);
        }
    }
    out
}

/// The human summary printed at the end of a run.
pub fn summary(report: &Report) -> String {
    let mut out = String::new();
    match (report.result, &report.first_bad) {
        (RunResult::Found, Some(info)) => {
            let first = if report.find_fix {
                format!(
                    "First {} commit (the fault is gone from here on)",
                    report.terms.new
                )
            } else {
                format!("First {} commit", report.terms.new)
            };
            let mut first = first;
            if let Some(c) = first.get_mut(0..1) {
                c.make_ascii_uppercase();
            }
            out.push_str(&format!("{first}: {}\n", info.commit));
            out.push_str(&format!(
                "    {}\n    Author: {}\n    Date:   {}\n",
                printable(&info.subject),
                printable(&info.author),
                info.date
            ));
            for f in &info.files_changed {
                out.push_str(&format!("    {}\n", printable(f)));
            }
        }
        (RunResult::Ambiguous, _) => {
            out.push_str(&format!("{}:\n", report.message));
            for c in &report.candidates {
                out.push_str(&format!("    {} {}\n", c.commit, printable(&c.subject)));
            }
        }
        _ => out.push_str(&format!("{}\n", printable(&report.message))),
    }
    if report.interrupted && report.result != RunResult::Inconclusive {
        out.push_str("Interrupted: the stages after the search did not finish\n");
    }
    if let Some(target) = &report.target {
        out.push_str(&format!("Fault: {} — {}\n", target.short(), target.summary));
    }
    if let (Some(c), None) = (report.confidence, &report.flaky) {
        out.push_str(&format!(
            "Confidence: {c:.3} (the fault showed on every run of the bad end, and the culprit's parent ran clean as often)\n"
        ));
    }
    if let Some(f) = &report.flaky {
        out.push_str(&format!(
            "Flaky: the fault shows on about {:.0}% of runs of a bad commit; {} is the first bad commit with probability {:.3} ({} the {} asked, {} runs)\n",
            f.p * 100.0,
            short_sha(&f.culprit),
            f.posterior,
            if f.reached { "reaching" } else { "short of" },
            f.confidence,
            f.runs
        ));
        let others: Vec<String> = f
            .runners_up
            .iter()
            .map(|(c, v)| format!("{} {v:.3}", short_sha(c)))
            .collect();
        if !others.is_empty() {
            out.push_str(&format!("Runners-up: {}\n", others.join(", ")));
        }
        if let Some(v) = &f.verification {
            out.push_str(&format!(
                "Verified: the culprit faulted on {}/{} runs, its parent {} on {}/{} (P(culprit's rate is higher) = {:.3})\n",
                v.culprit_rate.0,
                v.culprit_rate.1,
                short_sha(&v.parent),
                v.parent_rate.0,
                v.parent_rate.1,
                v.separation
            ));
        }
    }
    // One line per distinct other bug, however many commits showed it.
    let mut seen: Vec<(String, usize, &str)> = Vec::new();
    for other in &report.other_bugs {
        let short = other.signature.short();
        match seen.iter_mut().find(|(s, ..)| *s == short) {
            Some(entry) => entry.1 += 1,
            None => seen.push((short, 1, &other.commit)),
        }
    }
    for (short, count, first) in seen {
        out.push_str(&format!(
            "Another bug on the way: {short}, not the target ({count} commit{}, first {})\n",
            if count == 1 { "" } else { "s" },
            short_sha(first)
        ));
    }
    if let Some(triage) = &report.triage {
        out.push_str(&format!("Triage: {}\n", triage.summary));
    }
    if let Some(shrink) = &report.shrink {
        out.push_str(&format!("Shrink: {}\n", shrink.summary));
        out.push_str(&path_lines(shrink));
        out.push_str(&subgraph_lines(shrink));
        if let Some(p) = &shrink.parent_check {
            out.push_str(&format!("Minimal subgraph at the parent: {p}\n"));
        }
        match (&report.bundle, &shrink.reproduce) {
            (Some(b), _) if shrink.minimal_model.is_some() => out.push_str(&format!(
                "Reproduce: {}\n",
                std::path::Path::new(b).join("reproduce.sh").display()
            )),
            (_, Some(line)) => out.push_str(&format!("Reproduce: {line}\n")),
            _ => {}
        }
    }
    if let Some(b) = &report.bundle {
        out.push_str(&format!("Bundle: {b}\n"));
    }
    let searched = report
        .probes
        .iter()
        .filter(|p| p.role == ProbeRole::Search)
        .count();
    let reused = report.probes.iter().filter(|p| p.reused).count();
    let reused = if reused > 0 {
        format!(", {reused} reused from the journal of an earlier run")
    } else {
        String::new()
    };
    out.push_str(&format!(
        "Probes: {} ({searched} in the search{reused})\n",
        report.probes.len()
    ));
    out
}

/// The minimal subgraph, one node a line, and how much was cut.
/// Which way gave the minimal repro, and why the ways before it did not: shown only when more than
/// one way was tried.
fn path_lines(r: &ShrinkReport) -> String {
    if r.paths.len() < 2 {
        return String::new();
    }
    r.way_lines().iter().map(|l| format!("{l}\n")).collect()
}

fn subgraph_lines(r: &ShrinkReport) -> String {
    let mut out = String::new();
    if !r.kept.is_empty() {
        out.push_str(&format!(
            "Minimal subgraph ({} of {} nodes):\n",
            r.nodes_after, r.nodes_before
        ));
        for n in &r.kept {
            let ins: Vec<String> = n.inputs.iter().map(tensor_text).collect();
            let outs: Vec<String> = n.outputs.iter().map(tensor_text).collect();
            out.push_str(&format!(
                "    {} {}({}) -> {}\n",
                n.id,
                n.op,
                ins.join(", "),
                outs.join(", ")
            ));
        }
        out.push_str(&format!(
            "Cut: {} node{}\n",
            r.removed.len(),
            if r.removed.len() == 1 { "" } else { "s" }
        ));
    }
    out
}

/// The human summary of a shrink: what was kept, what was cut, how to reproduce it.
pub fn shrink_summary(r: &ShrinkReport) -> String {
    let mut out = format!("Shrink: {}\n", r.summary);
    out.push_str(&path_lines(r));
    out.push_str(&subgraph_lines(r));
    if let Some(g) = &r.graph {
        out.push_str(&format!(
            "How the model was split into nodes: {}\n",
            graph_words(g)
        ));
    }
    if let Some(c) = &r.confirmation {
        out.push_str(&format!("Reproduced: {}/{} runs\n", c.reproduced, c.runs));
    }
    if let Some(p) = &r.parent_check {
        out.push_str(&format!("At the parent: {p}\n"));
    }
    if let Some(m) = &r.minimal_model {
        out.push_str(&format!("Minimal model: {m}\n"));
    }
    if let Some(e) = &r.extract_error {
        out.push_str(&format!("No standalone model: {e}\n"));
    }
    if let Some(line) = &r.reproduce {
        out.push_str(&format!("Reproduce: {line}\n"));
    }
    out.push_str(&format!(
        "Harness runs: {}, {:.1}s\n",
        r.harness_runs, r.duration_s
    ));
    out
}

/// A size as people read it: `812.0 KiB`, `31.4 MiB`.
pub fn human_bytes(bytes: u64) -> String {
    if bytes >= 1 << 20 {
        format!("{:.1} MiB", bytes as f64 / f64::from(1u32 << 20))
    } else {
        format!("{:.1} KiB", bytes as f64 / 1024.0)
    }
}

/// A harness's account of how it split the model, in a PyTorch engineer's words: `fx` is torch.fx's
/// trace, `hooks` a recorded run through module hooks (the harness's own words stay in the JSON).
pub fn graph_words(graph: &str) -> String {
    graph
        .split("; ")
        .map(|part| {
            let part = part
                .replace(": hooks", " (a recorded run through module hooks)")
                .replace(": fx", " (torch.fx)");
            if part == "fx" {
                "traced with torch.fx".to_string()
            } else {
                part
            }
        })
        .collect::<Vec<_>>()
        .join("; ")
}

/// A tensor as the minimal subgraph names it: `x0[64, 128]`, or `x0 (shape unknown)` when its shape was
/// never recorded (the node that makes it is the one that failed).
fn tensor_text(t: &crate::protocol::types::GraphTensor) -> String {
    match &t.shape {
        Some(dims) => format!("{}{dims:?}", t.name),
        None => format!("{} (shape unknown)", t.name),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn text_from_a_repository_cannot_drive_the_terminal() {
        let hostile = "fix\x1b]0;owned\x07\x1b[2J\rdone";
        let shown = printable(hostile);
        assert!(!shown.chars().any(char::is_control), "{shown:?}");
        assert!(shown.starts_with("fix\\u{1b}]0;owned"), "{shown}");
        assert_eq!(printable(&"x".repeat(10_000)).chars().count(), 501);
    }

    #[test]
    fn the_split_reads_in_pytorch_words() {
        assert_eq!(
            graph_words("fx; kept whole, their forward cannot be traced: body; the training step: forward, loss, backward; descended along the fault: body: hooks -> body__encoder: fx"),
            "traced with torch.fx; kept whole, their forward cannot be traced: body; the training step: forward, loss, backward; descended along the fault: body (a recorded run through module hooks) -> body__encoder (torch.fx)"
        );
        assert_eq!(graph_words("jaxpr"), "jaxpr");
    }

    #[test]
    fn a_tensor_without_a_recorded_shape_says_so() {
        let mut t = crate::protocol::types::GraphTensor {
            name: "table".into(),
            shape: None,
            dtype: None,
            producer: None,
        };
        assert_eq!(super::tensor_text(&t), "table (shape unknown)");
        t.shape = Some(vec![2, 4]);
        assert_eq!(super::tensor_text(&t), "table[2, 4]");
    }
}
