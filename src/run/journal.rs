//! The probe journal: every probe's result (and every sanitizer rerun) appended as one JSON line and
//! flushed to disk as it completes, so a run killed at any point (SIGKILL, preemption, power loss) and
//! started again reuses what it already knows. Entries are keyed by commit, the target they were judged
//! against, and a fingerprint of the config, the GPU/driver and cudabisect's version; a torn last line is
//! ignored with a warning. Only facts about a commit are replayed: an outcome of the machine (an
//! infrastructure failure, a repro that could not start, objects missing from the clone) is run again, as
//! is a commit whose entries contradict each other. [`JournaledProbe`] puts it in front of any [`Probe`].

use std::collections::HashMap;
use std::fs::{File, OpenOptions};
use std::io::{BufRead, BufReader, Read, Seek, SeekFrom, Write};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};

use git2::Oid;
use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};

use crate::classify::Signature;
use crate::report::event::Reporter;

use super::probe::prober::{Probe, ProbeContext, ProbeOutcome, Sanitized};
use crate::report::record::ProbeRecord;

const VERSION: u32 = 1;

/// Lines a journal keeps: beyond this, opening it rewrites it with the newest lines only, so a clone that
/// runs every night for years does not grow it without bound.
const MAX_LINES: usize = 20_000;

/// One journal line.
#[derive(Debug, Serialize, Deserialize)]
struct Entry {
    v: u32,
    fingerprint: String,
    commit: String,
    /// The target the probe was judged against (`null` for the bad endpoint); absent for sanitizer runs.
    #[serde(default)]
    target: Option<String>,
    #[serde(default)]
    record: Option<ProbeRecord>,
    #[serde(default)]
    sanitized: Option<SanitizedEntry>,
}

#[derive(Clone, Debug, Serialize, Deserialize)]
struct SanitizedEntry {
    finding: Option<Signature>,
    summary: String,
    duration_s: f64,
}

/// Where a state directory keeps its journal.
pub fn journal_path(state_dir: &Path) -> PathBuf {
    state_dir.join("journal.jsonl")
}

/// The fingerprint entries must share to be reused: the config's meaning (its comments and layout
/// left out), the contents of the programs it names outside the repository (a repro script fixed
/// between runs is a new repro), the machine's GPU/driver line and cudabisect's version (a new
/// classifier may judge the same output differently).
pub fn fingerprint(config_text: &str, outside: &[PathBuf], environment: &str) -> String {
    let mut h = Sha256::new();
    h.update(config_meaning(config_text).as_bytes());
    h.update([0]);
    for path in outside {
        h.update(path.to_string_lossy().as_bytes());
        h.update([0]);
        if let Ok(bytes) = std::fs::read(path) {
            h.update(&bytes);
        }
        h.update([0]);
    }
    h.update(environment.as_bytes());
    h.update([0]);
    h.update(env!("CARGO_PKG_VERSION").as_bytes());
    hex16(&h.finalize())
}

fn hex16(digest: &[u8]) -> String {
    digest.iter().take(16).map(|b| format!("{b:02x}")).collect()
}

/// A config's meaning for a probe's verdict: its TOML parsed and written back in one canonical form, so a
/// comment, blank lines or the order of keys change nothing (the text itself when it does not parse),
/// without what never judges a probe: `[shrink]` and `[bundle]` (stages after the search), and whether
/// and how long triage runs (its sanitizer and environment stay: the search reruns probes under them).
pub fn config_meaning(text: &str) -> String {
    match text.parse::<toml::Table>() {
        Ok(mut table) => {
            table.remove("shrink");
            table.remove("bundle");
            if let Some(toml::Value::Table(triage)) = table.get_mut("triage") {
                triage.remove("enabled");
                triage.remove("timeout");
                if triage.is_empty() {
                    table.remove("triage");
                }
            }
            serde_json::to_string(&table).unwrap_or_else(|_| text.to_string())
        }
        Err(_) => text.to_string(),
    }
}

/// A short digest of a config's meaning (see [`config_meaning`]).
pub fn config_digest(text: &str) -> String {
    hex16(&Sha256::digest(config_meaning(text).as_bytes()))
}

/// The programs the build and repro commands name by a path outside `repo_root` (a script in the
/// user's home): their contents are part of what a verdict depends on.
pub fn outside_programs(config: &crate::config::Config, repo_root: &Path) -> Vec<PathBuf> {
    let commands =
        std::iter::once(&config.repro.command).chain(config.build.as_ref().map(|b| &b.command));
    let mut out = Vec::new();
    for c in commands {
        let words: Vec<String> = match c {
            crate::config::CommandLine::Argv(v) => v.clone(),
            crate::config::CommandLine::Shell(s) => {
                s.split_whitespace().map(str::to_string).collect()
            }
        };
        for w in words {
            let p = Path::new(&w);
            if p.is_absolute() && !p.starts_with(repo_root) && p.is_file() {
                out.push(p.to_path_buf());
            }
        }
    }
    out
}

fn target_key(target: Option<&Signature>, repeat: Option<u32>) -> String {
    let key = target
        .map(|t| serde_json::to_string(t).unwrap_or_default())
        .unwrap_or_else(|| "null".into());
    // Repeated runs of one commit (a flaky fault's search) are kept apart, each under its run number;
    // the first keeps the plain key, so an ordinary probe's entry serves as it.
    match repeat {
        Some(n) if n > 0 => format!("{key}#run{n}"),
        _ => key,
    }
}

/// The journal of one state directory.
pub struct Journal {
    path: PathBuf,
    fingerprint: String,
    probes: HashMap<(String, String), ProbeRecord>,
    sanitized: HashMap<String, SanitizedEntry>,
    /// The file does not end with a newline (a torn write): the next append starts a new line.
    torn: bool,
    /// Keys whose entries disagree (a hand edit, a journal merged from elsewhere): never reused.
    contradicted: std::collections::HashSet<(String, String)>,
    /// Entries of this fingerprint left to be run again: outcomes of the machine, not of the commit.
    not_facts: usize,
    /// An append already failed and was reported: the run says it once, not once per probe.
    write_failed: bool,
}

/// Whether a journaled outcome says something about the commit. The machine failing (no driver, a full
/// disk, a stuck scheduler queue), a repro that could not start and objects missing from this clone say
/// nothing about it, and are run again next time.
fn is_fact(record: &ProbeRecord) -> bool {
    use crate::classify::FaultClass;
    !matches!(
        record.signature.class,
        FaultClass::Infra | FaultClass::ExecFailure | FaultClass::MissingObject
    )
}

/// Whether a record is consistent with itself: a hand-flipped verdict (a `good` whose signature is the
/// target's fault, a record of another commit) is not reused.
fn is_consistent(commit: &str, record: &ProbeRecord) -> bool {
    use crate::bisect::Verdict;
    use crate::classify::FaultClass;
    record.commit == commit
        && match record.verdict {
            Verdict::Good => !record.matched_target && record.signature.class == FaultClass::None,
            Verdict::Bad => record.signature.class != FaultClass::None,
            Verdict::Skip => true,
        }
}

impl Journal {
    /// A journal that reuses nothing but still records this run (`start --fresh`).
    pub fn empty(path: &Path, fingerprint: &str) -> Journal {
        let torn = std::fs::read(path).is_ok_and(|b| b.last().is_some_and(|&c| c != b'\n'));
        Journal {
            path: path.to_path_buf(),
            fingerprint: fingerprint.to_string(),
            probes: HashMap::new(),
            sanitized: HashMap::new(),
            torn,
            contradicted: Default::default(),
            not_facts: 0,
            write_failed: false,
        }
    }

    /// A journal that reuses and records nothing (its file could not be used).
    pub fn off(fingerprint: &str) -> Journal {
        let mut j = Journal::empty(Path::new(""), fingerprint);
        j.torn = false;
        j
    }

    /// Reads `path` (absent: empty) and keeps the entries with this `fingerprint`. Lines that cannot be
    /// read (a write torn by a kill) are skipped; each one is described in the returned warnings.
    pub fn open(path: &Path, fingerprint: &str) -> std::io::Result<(Journal, Vec<String>)> {
        Self::open_capped(path, fingerprint, MAX_LINES)
    }

    /// The warning for a failed append, the first time only (a full disk fails every probe's).
    fn append_failed(&mut self, e: &std::io::Error) -> Option<String> {
        if std::mem::replace(&mut self.write_failed, true) {
            return None;
        }
        Some(format!(
            "{}: the probe journal could not be written ({e}): this run's results are not kept for a resume",
            self.path.display()
        ))
    }

    /// Refuses a journal that is not a regular file (a FIFO would block, a device would be an endless
    /// line): reading or appending it is never attempted.
    pub fn check_regular(path: &Path) -> std::io::Result<()> {
        match std::fs::metadata(path) {
            Ok(m) if !m.is_file() => Err(std::io::Error::other(
                "not a regular file (remove it: cudabisect makes a new one)",
            )),
            _ => Ok(()),
        }
    }

    fn open_capped(
        path: &Path,
        fingerprint: &str,
        cap: usize,
    ) -> std::io::Result<(Journal, Vec<String>)> {
        let mut journal = Journal {
            path: path.to_path_buf(),
            fingerprint: fingerprint.to_string(),
            probes: HashMap::new(),
            sanitized: HashMap::new(),
            torn: false,
            contradicted: Default::default(),
            not_facts: 0,
            write_failed: false,
        };
        let mut warnings = Vec::new();
        Self::check_regular(path)?;
        let mut file = match File::open(path) {
            Ok(f) => f,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok((journal, warnings)),
            Err(e) => return Err(e),
        };
        if file.seek(SeekFrom::End(0))? > 0 {
            file.seek(SeekFrom::End(-1))?;
            let mut last = [0u8];
            file.read_exact(&mut last)?;
            journal.torn = last[0] != b'\n';
        }
        file.seek(SeekFrom::Start(0))?;
        let mut kept: Vec<Vec<u8>> = Vec::new();
        let (mut unreadable, mut first_unreadable, mut lines) = (0usize, None, 0usize);
        for (n, line) in BufReader::new(file).split(b'\n').enumerate() {
            let line = line?;
            if line.iter().all(u8::is_ascii_whitespace) {
                continue;
            }
            lines += 1;
            let parsed = serde_json::from_slice::<Entry>(&line);
            if parsed.is_ok() {
                kept.push(line);
            }
            match parsed {
                Ok(e) if e.v == VERSION && e.fingerprint == fingerprint => journal.take(e),
                Ok(_) => {}
                Err(err) => {
                    unreadable += 1;
                    first_unreadable.get_or_insert((n + 1, err.to_string()));
                }
            }
        }
        for key in &journal.contradicted {
            journal.probes.remove(key);
        }
        warnings.extend(journal.read_warnings(unreadable, first_unreadable));
        // Unreadable lines are dropped when the file is rewritten: they would otherwise be warned about
        // on every later run. Lines count toward the cap whether readable or not.
        if lines > cap || unreadable > 0 {
            // The newest lines, atomically in place of the old file (the caller holds the state lock).
            let mut text = Vec::new();
            for line in &kept[kept.len().saturating_sub(cap)..] {
                text.extend_from_slice(line);
                text.push(b'\n');
            }
            crate::atomic_file::write_atomic(path, &text)?;
            journal.torn = false;
        }
        Ok((journal, warnings))
    }

    /// Takes in one entry of this run's fingerprint: a probe's record (a contradiction, or a record that
    /// is not a fact, is noted and never replayed), or a commit's sanitizer finding.
    fn take(&mut self, e: Entry) {
        if let Some(r) = e.record {
            let key = (e.commit, e.target.unwrap_or_else(|| "null".into()));
            if !is_consistent(&key.0, &r) {
                self.contradicted.insert(key);
            } else if !is_fact(&r) {
                self.not_facts += 1;
                self.probes.remove(&key);
            } else if let Some(old) = self.probes.get(&key) {
                if old.verdict != r.verdict || old.matched_target != r.matched_target {
                    self.contradicted.insert(key);
                }
            } else {
                self.probes.insert(key, r);
            }
        } else if let Some(s) = e.sanitized {
            self.sanitized.insert(e.commit, s);
        }
    }

    /// What reading the file found wrong, in words: unreadable lines (how many, and the first), and
    /// contradicting probes.
    fn read_warnings(
        &self,
        unreadable: usize,
        first_unreadable: Option<(usize, String)>,
    ) -> Vec<String> {
        let path = self.path.display();
        let mut warnings = Vec::new();
        if let Some((line, err)) = first_unreadable {
            warnings.push(if unreadable == 1 {
                format!("{path}: line {line} cannot be read and is ignored ({err})")
            } else {
                format!(
                    "{path}: {unreadable} lines cannot be read and are ignored (the first, line {line}: {err})"
                )
            });
        }
        if !self.contradicted.is_empty() {
            warnings.push(format!(
                "{path}: {} journaled probe(s) contradict each other or themselves and are run again",
                self.contradicted.len()
            ));
        }
        warnings
    }

    /// How many reusable entries it holds.
    pub fn len(&self) -> usize {
        self.probes.len() + self.sanitized.len()
    }

    /// True when nothing can be reused.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Journaled outcomes of the machine (not the commit) that this run tries again.
    pub fn retried(&self) -> usize {
        self.not_facts
    }

    /// How many journaled probes are of commits in `commits`: what this run can actually reuse.
    pub fn reusable_among(&self, commits: &std::collections::HashSet<String>) -> usize {
        self.probes
            .keys()
            .filter(|(c, _)| commits.contains(c))
            .map(|(c, _)| c)
            .collect::<std::collections::HashSet<_>>()
            .len()
    }

    fn probe(
        &self,
        oid: Oid,
        target: Option<&Signature>,
        repeat: Option<u32>,
    ) -> Option<ProbeRecord> {
        let commit = oid.to_string();
        if let Some(record) = self
            .probes
            .get(&(commit.clone(), target_key(target, repeat)))
        {
            return Some(record.clone());
        }
        if repeat.is_some_and(|n| n > 0) {
            return None;
        }
        // A run that showed no failure at all is clean whatever fault is the target: the nightly head's
        // record (judged against none) is the next night's good end, a probe judged against an older
        // target serves a search for a newer one. A failure is judged against its own target only.
        self.probes
            .iter()
            .filter(|((c, key), _)| *c == commit && !key.contains("#run"))
            .map(|(_, record)| record)
            .find(|r| r.signature.class == crate::classify::FaultClass::None)
            .cloned()
    }

    fn append(&mut self, entry: &Entry) -> std::io::Result<()> {
        if self.path.as_os_str().is_empty() {
            return Ok(());
        }
        let mut line = serde_json::to_vec(entry).map_err(std::io::Error::other)?;
        line.push(b'\n');
        if self.torn {
            line.insert(0, b'\n');
        }
        let mut f = OpenOptions::new()
            .create(true)
            .append(true)
            .open(&self.path)?;
        // One write of the whole line, then to disk: a kill leaves at most this line torn.
        f.write_all(&line)?;
        f.sync_data()?;
        self.torn = false;
        Ok(())
    }
}

/// A [`Probe`] that answers from the journal when it can (the record says `reused`) and journals every
/// probe and sanitizer run that completes. An interrupted probe is never journaled. Parallel workers
/// share one journal: each line is appended whole under the lock.
pub struct JournaledProbe<'a> {
    /// The prober that does the work.
    pub inner: &'a mut dyn Probe,
    /// The journal.
    pub journal: &'a std::sync::Mutex<Journal>,
    /// Journal write failures, as warnings (a failing disk costs resumability, never the run).
    pub warnings: Vec<String>,
    /// Ctrl-C or SIGTERM: what a stopped run returns is not journaled.
    pub cancel: &'a AtomicBool,
    /// This run's log directory: a reused probe's logs are copied there, so the run (and its bundle)
    /// holds the evidence of every probe it reports, whatever happens to the earlier run's directory.
    pub log_dir: Option<PathBuf>,
}

/// Copies a reused probe's log (with its per-rank siblings) into `log_dir`; the new path, or the old one
/// when it cannot be copied.
fn adopt_log(old: &str, log_dir: &Path) -> String {
    let from = Path::new(old);
    let (Some(dir), Some(name)) = (from.parent(), from.file_name()) else {
        return old.to_string();
    };
    if dir == log_dir {
        return old.to_string();
    }
    let to = log_dir.join(name);
    if std::fs::copy(from, &to).is_err() {
        return old.to_string();
    }
    // `NNN-sha-repro.log` has `NNN-sha-repro.rank<R>.log` beside it for a distributed run.
    let stem = name.to_string_lossy();
    let prefix = format!("{}.rank", stem.trim_end_matches(".log"));
    if let Ok(entries) = std::fs::read_dir(dir) {
        for e in entries.flatten() {
            let n = e.file_name();
            if n.to_string_lossy().starts_with(&prefix) {
                let _ = std::fs::copy(e.path(), log_dir.join(&n));
            }
        }
    }
    to.display().to_string()
}

impl Probe for JournaledProbe<'_> {
    fn probe(
        &mut self,
        oid: Oid,
        ctx: &ProbeContext,
        target: Option<&Signature>,
        reporter: &mut dyn Reporter,
    ) -> ProbeOutcome {
        let reused = self.lock().probe(oid, target, ctx.repeat);
        if let Some(mut record) = reused {
            record.reused = true;
            record.role = ctx.role;
            if let Some(dir) = &self.log_dir {
                record.log = record.log.as_deref().map(|l| adopt_log(l, dir));
                record.build_log = record.build_log.as_deref().map(|l| adopt_log(l, dir));
            }
            // The judge may read the output (a regex policy): it is the reused probe's log.
            let output = record
                .log
                .as_deref()
                .and_then(|l| std::fs::read_to_string(l).ok())
                .unwrap_or_default();
            return ProbeOutcome {
                record,
                interrupted: false,
                output,
            };
        }
        let out = self.inner.probe(oid, ctx, target, reporter);
        // A run the crowd on its GPU may have spoiled is run again alone: never a fact to replay.
        if !out.interrupted
            && !self.cancel.load(Ordering::SeqCst)
            && !ctx.crowded_out(out.record.signature.class)
        {
            let mut journal = self.lock();
            let entry = Entry {
                v: VERSION,
                fingerprint: journal.fingerprint.clone(),
                commit: oid.to_string(),
                target: Some(target_key(target, ctx.repeat)),
                record: Some(out.record.clone()),
                sanitized: None,
            };
            if let Err(e) = journal.append(&entry) {
                let warning = journal.append_failed(&e);
                drop(journal);
                self.warnings.extend(warning);
            }
        }
        out
    }

    fn sanitize(
        &mut self,
        oid: Oid,
        ctx: &ProbeContext,
        reporter: &mut dyn Reporter,
    ) -> Option<Sanitized> {
        if let Some(s) = self.lock().sanitized.get(&oid.to_string()) {
            return Some(Sanitized {
                finding: s.finding.clone(),
                summary: s.summary.clone(),
                duration_s: s.duration_s,
                interrupted: false,
            });
        }
        let s = self.inner.sanitize(oid, ctx, reporter)?;
        if s.interrupted || self.cancel.load(Ordering::SeqCst) {
            return Some(s);
        }
        let kept = SanitizedEntry {
            finding: s.finding.clone(),
            summary: s.summary.clone(),
            duration_s: s.duration_s,
        };
        let mut journal = self.lock();
        let entry = Entry {
            v: VERSION,
            fingerprint: journal.fingerprint.clone(),
            commit: oid.to_string(),
            target: None,
            record: None,
            sanitized: Some(kept.clone()),
        };
        let written = journal.append(&entry);
        journal.sanitized.insert(oid.to_string(), kept);
        let warning = written.err().and_then(|e| journal.append_failed(&e));
        drop(journal);
        self.warnings.extend(warning);
        Some(s)
    }

    fn shared_gpu(&self) -> Option<String> {
        self.inner.shared_gpu()
    }
}

impl JournaledProbe<'_> {
    fn lock(&self) -> std::sync::MutexGuard<'_, Journal> {
        // A worker that panicked holding the lock left whole lines behind: the journal is still good.
        self.journal
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_stages_after_the_search_do_not_change_what_a_probe_means() {
        let plain = "[repro]\ncommand = \"python train.py\"\n";
        let staged = format!(
            "{plain}\n[shrink]\nconfirm = 2\n\n[bundle]\ninclude-binary = true\n\n[triage]\nenabled = false\ntimeout = \"2h\"\n"
        );
        assert_eq!(config_meaning(plain), config_meaning(&staged));
        // The sanitizer the search reruns probes under does.
        let sanitized = format!("{plain}\n[triage]\nsanitizer = \"/opt/cs\"\n");
        assert_ne!(config_meaning(plain), config_meaning(&sanitized));
        let repro = plain.replace("train.py", "other.py");
        assert_ne!(config_meaning(plain), config_meaning(&repro));
    }
    use crate::bisect::Verdict;
    use crate::classify::FaultClass;
    use crate::report::event::Event;
    use crate::report::record::ProbeRole;

    struct Quiet;
    impl Reporter for Quiet {
        fn event(&mut self, _: &Event) {}
    }

    /// Counts real probes; every commit is clean.
    struct Counting(usize);
    impl Probe for Counting {
        fn probe(
            &mut self,
            oid: Oid,
            ctx: &ProbeContext,
            _: Option<&Signature>,
            _: &mut dyn Reporter,
        ) -> ProbeOutcome {
            self.0 += 1;
            ProbeOutcome {
                record: ProbeRecord {
                    commit: oid.to_string(),
                    role: ctx.role,
                    verdict: Verdict::Good,
                    signature: Signature::new(FaultClass::None, "exited 0"),
                    matched_target: false,
                    reason: None,
                    exit_code: Some(0),
                    signal: None,
                    duration_s: 1.0,
                    build_log: None,
                    log: None,
                    sanitizer: None,
                    attempts: 1,
                    reused: false,
                    job: None,
                    runner: None,
                    build_runner: None,
                },
                interrupted: false,
                output: String::new(),
            }
        }
        fn sanitize(
            &mut self,
            _: Oid,
            _: &ProbeContext,
            _: &mut dyn Reporter,
        ) -> Option<Sanitized> {
            None
        }
    }

    fn ctx() -> ProbeContext {
        ProbeContext {
            step: 1,
            role: ProbeRole::Search,
            remaining: 4,
            estimated_steps: 2,
            worker: None,
            repeat: None,
            crowded: false,
        }
    }

    fn probe_twice(path: &Path, fp: &str) -> (usize, bool, Vec<String>) {
        let oid = Oid::from_str("1111111111111111111111111111111111111111").expect("oid");
        let cancel = AtomicBool::new(false);
        let mut inner = Counting(0);
        let (journal, warnings) = Journal::open(path, fp).expect("open");
        let journal = std::sync::Mutex::new(journal);
        let mut j = JournaledProbe {
            inner: &mut inner,
            journal: &journal,
            warnings: Vec::new(),
            cancel: &cancel,
            log_dir: None,
        };
        let first = j.probe(oid, &ctx(), None, &mut Quiet);
        drop(j);
        (inner.0, first.record.reused, warnings)
    }

    #[test]
    fn a_probe_is_reused_only_with_the_same_fingerprint_and_a_torn_line_is_skipped() {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("journal.jsonl");
        assert_eq!(probe_twice(&path, "a"), (1, false, vec![]));
        assert_eq!(probe_twice(&path, "a"), (0, true, vec![]), "journaled");
        assert_eq!(probe_twice(&path, "b").0, 1, "another config or machine");
        // A kill in the middle of a write leaves half a line: it is skipped with a warning, and the next
        // entry still lands on a line of its own.
        let mut f = OpenOptions::new().append(true).open(&path).expect("open");
        f.write_all(br#"{"v":1,"fingerprint":"c","commit":"22"#)
            .expect("write");
        drop(f);
        let (runs, reused, warnings) = probe_twice(&path, "c");
        assert_eq!((runs, reused), (1, false));
        assert_eq!(warnings.len(), 1, "{warnings:?}");
        assert!(warnings[0].contains("cannot be read"), "{warnings:?}");
        // The unreadable line was dropped when the file was rewritten: no warning on every later run.
        let (runs, reused, warnings) = probe_twice(&path, "c");
        assert_eq!((runs, reused, warnings.len()), (0, true, 0));
    }

    fn entry_line(commit: &str, verdict: &str, class: &str, matched: bool) -> String {
        format!(
            r#"{{"v":1,"fingerprint":"f","commit":"{commit}","target":"null","record":{{"commit":"{commit}","role":"search","verdict":"{verdict}","signature":{{"class":"{class}","summary":"x"}},"matched_target":{matched},"reason":null,"exit_code":1,"signal":null,"duration_s":1.0,"build_log":null,"log":null,"attempts":1}}}}"#
        )
    }

    #[test]
    fn outcomes_of_the_machine_and_contradictions_are_not_reused_and_garbage_is_pruned() {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("journal.jsonl");
        let (a, b, c, d) = (
            "a".repeat(40),
            "b".repeat(40),
            "c".repeat(40),
            "d".repeat(40),
        );
        let mut text = String::new();
        text += &(entry_line(&a, "skip", "infra", false) + "\n");
        text += &(entry_line(&b, "bad", "illegal_address", true) + "\n");
        text += &(entry_line(&b, "good", "none", false) + "\n");
        // A hand-flipped verdict: `good`, but its signature is the target's fault.
        text += &(entry_line(&c, "good", "illegal_address", true) + "\n");
        text += &(entry_line(&d, "bad", "illegal_address", true) + "\n");
        for _ in 0..1000 {
            text += "garbage\n";
        }
        std::fs::write(&path, &text).expect("write");
        let (journal, warnings) = Journal::open(&path, "f").expect("open");
        assert_eq!(
            journal.retried(),
            1,
            "the infrastructure outcome is run again"
        );
        assert_eq!(
            journal.len(),
            1,
            "only d is a fact: {:?}",
            journal.probes.keys()
        );
        assert_eq!(warnings.len(), 2, "{warnings:?}");
        assert!(
            warnings[0].contains("1000 lines cannot be read"),
            "{warnings:?}"
        );
        assert!(
            warnings[1].contains("2 journaled probe(s) contradict"),
            "{warnings:?}"
        );
        let after = std::fs::read_to_string(&path).expect("read");
        assert_eq!(after.lines().count(), 5, "garbage pruned, entries kept");
    }

    #[test]
    fn a_journal_that_is_not_a_regular_file_is_refused_before_it_is_read() {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("journal.jsonl");
        std::fs::create_dir(&path).expect("mkdir");
        assert!(Journal::open(&path, "f").is_err());
        let link = dir.path().join("j2");
        std::os::unix::fs::symlink("/dev/zero", &link).expect("symlink");
        let err = Journal::open(&link, "f").err().expect("refused");
        assert!(err.to_string().contains("not a regular file"), "{err}");
    }

    #[test]
    fn a_comment_or_key_order_in_the_config_keeps_the_fingerprint_a_value_does_not() {
        let a = "[repro]\ncommand = \"./r.sh\"\ntimeout = \"5s\"\n";
        let b = "# a comment\n[repro]\ntimeout = \"5s\"   # why\ncommand = \"./r.sh\"\n";
        let c = "[repro]\ncommand = \"./r.sh\"\ntimeout = \"6s\"\n";
        assert_eq!(fingerprint(a, &[], "gpu"), fingerprint(b, &[], "gpu"));
        assert_ne!(fingerprint(a, &[], "gpu"), fingerprint(c, &[], "gpu"));
        let dir = tempfile::tempdir().expect("tempdir");
        let script = dir.path().join("r.sh");
        std::fs::write(&script, "exit 1").expect("write");
        let before = fingerprint(a, std::slice::from_ref(&script), "gpu");
        std::fs::write(&script, "exit 0").expect("write");
        assert_ne!(
            before,
            fingerprint(a, &[script], "gpu"),
            "a fixed script is a new repro"
        );
    }

    #[test]
    fn a_long_journal_keeps_its_newest_lines() {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("journal.jsonl");
        for fp in ["a", "b", "c", "d", "e", "f"] {
            probe_twice(&path, fp);
        }
        let (journal, _) = Journal::open_capped(&path, "f", 3).expect("open");
        assert_eq!(journal.len(), 1, "the newest entry is still there");
        let text = std::fs::read_to_string(&path).expect("read");
        assert_eq!(text.lines().count(), 3);
        assert!(text.lines().all(|l| !l.contains("\"fingerprint\":\"a\"")));
        assert!(text.ends_with('\n'));
    }
}
