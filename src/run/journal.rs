//! The probe journal: every probe's result (and every sanitizer rerun) appended as one JSON line and
//! flushed to disk as it completes, so a run killed at any point (SIGKILL, preemption, power loss) and
//! started again reuses what it already knows. Entries are keyed by commit, the target they were judged
//! against, and a fingerprint of the config, the GPU/driver and cudabisect's version; a torn last line is
//! ignored with a warning. [`JournaledProbe`] puts it in front of any [`Probe`].

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

use super::probe::{Probe, ProbeContext, ProbeOutcome, Sanitized};
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

/// The fingerprint entries must share to be reused: the config text, the machine's GPU/driver line and
/// cudabisect's version (a new classifier may judge the same output differently).
pub fn fingerprint(config_text: &str, environment: &str) -> String {
    let mut h = Sha256::new();
    h.update(config_text.as_bytes());
    h.update([0]);
    h.update(environment.as_bytes());
    h.update([0]);
    h.update(env!("CARGO_PKG_VERSION").as_bytes());
    h.finalize()
        .iter()
        .take(16)
        .map(|b| format!("{b:02x}"))
        .collect()
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
        }
    }

    /// Reads `path` (absent: empty) and keeps the entries with this `fingerprint`. Lines that cannot be
    /// read (a write torn by a kill) are skipped; each one is described in the returned warnings.
    pub fn open(path: &Path, fingerprint: &str) -> std::io::Result<(Journal, Vec<String>)> {
        Self::open_capped(path, fingerprint, MAX_LINES)
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
        };
        let mut warnings = Vec::new();
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
        for (n, line) in BufReader::new(file).split(b'\n').enumerate() {
            let line = line?;
            if line.iter().all(u8::is_ascii_whitespace) {
                continue;
            }
            let parsed = serde_json::from_slice::<Entry>(&line);
            if parsed.is_ok() {
                kept.push(line);
            }
            match parsed {
                Ok(e) if e.v == VERSION && e.fingerprint == fingerprint => {
                    if let Some(r) = e.record {
                        journal
                            .probes
                            .insert((e.commit, e.target.unwrap_or_else(|| "null".into())), r);
                    } else if let Some(s) = e.sanitized {
                        journal.sanitized.insert(e.commit, s);
                    }
                }
                Ok(_) => {}
                Err(err) => warnings.push(format!(
                    "{}: line {} cannot be read and is ignored ({err})",
                    path.display(),
                    n + 1
                )),
            }
        }
        if kept.len() > cap {
            // The newest lines, atomically in place of the old file (the caller holds the state lock).
            let mut text = Vec::new();
            for line in &kept[kept.len() - cap..] {
                text.extend_from_slice(line);
                text.push(b'\n');
            }
            crate::atomic_file::write_atomic(path, &text)?;
            journal.torn = false;
        }
        Ok((journal, warnings))
    }

    /// How many reusable entries it holds.
    pub fn len(&self) -> usize {
        self.probes.len() + self.sanitized.len()
    }

    /// True when nothing can be reused.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    fn probe(
        &self,
        oid: Oid,
        target: Option<&Signature>,
        repeat: Option<u32>,
    ) -> Option<ProbeRecord> {
        self.probes
            .get(&(oid.to_string(), target_key(target, repeat)))
            .cloned()
    }

    fn append(&mut self, entry: &Entry) -> std::io::Result<()> {
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
            return ProbeOutcome {
                record,
                interrupted: false,
            };
        }
        let out = self.inner.probe(oid, ctx, target, reporter);
        if !out.interrupted && !self.cancel.load(Ordering::SeqCst) {
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
                drop(journal);
                self.warnings.push(format!("the probe journal: {e}"));
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
            });
        }
        let s = self.inner.sanitize(oid, ctx, reporter)?;
        if self.cancel.load(Ordering::SeqCst) {
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
        drop(journal);
        if let Err(e) = written {
            self.warnings.push(format!("the probe journal: {e}"));
        }
        Some(s)
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
                },
                interrupted: false,
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
        let (runs, reused, warnings) = probe_twice(&path, "c");
        assert_eq!((runs, reused, warnings.len()), (0, true, 1));
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
