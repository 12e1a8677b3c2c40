//! Answers that hold after a fixed host, a resume, a force-push, a shared cache or a flaky fault, and the
//! fix found as surely as the bug: each test a case of the reliability catalogue, run end to end with the
//! real binary on real git repositories built with the git command line.

use std::os::unix::fs::FileTypeExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use cudabisect::classify::FaultClass;
use cudabisect::report::event::Event;
use cudabisect::report::record::ProbeRecord;
use cudabisect::report::record::{ProbeRole, Report, Verdict};

/// A linear repository: commit i (from 1) has `version.txt` = i and `repro.sh` from `template`, in which
/// `@BAD@` is replaced; tag `v1` is commit 1, branch `main`.
struct Repo {
    _tmp: tempfile::TempDir,
    path: PathBuf,
    scratch: PathBuf,
}

fn git(dir: &Path, args: &[&str]) -> String {
    let out = Command::new("git")
        .current_dir(dir)
        .args(["-c", "user.name=T", "-c", "user.email=t@example.com"])
        .args(args)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "git {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).trim().to_string()
}

fn commit_version(dir: &Path, i: usize) {
    std::fs::write(dir.join("version.txt"), format!("{i}\n")).unwrap();
    git(dir, &["add", "-A"]);
    git(dir, &["commit", "-q", "-m", &format!("commit {i}")]);
}

fn linear(n: usize, bad: usize, template: &str, config: &str) -> Repo {
    linear_with(n, bad, &[], template, config)
}

/// [`linear`], with `files` (path, text) in every commit too.
fn linear_with(n: usize, bad: usize, files: &[(&str, &str)], template: &str, config: &str) -> Repo {
    let tmp = tempfile::tempdir().unwrap();
    let path = tmp.path().join("repo");
    let scratch = tmp.path().join("scratch");
    std::fs::create_dir_all(&path).unwrap();
    std::fs::create_dir_all(&scratch).unwrap();
    git(&path, &["init", "-q", "-b", "main", "."]);
    for (file, text) in files {
        let at = path.join(file);
        std::fs::create_dir_all(at.parent().unwrap()).unwrap();
        std::fs::write(at, text).unwrap();
    }
    let script = template
        .replace("@BAD@", &bad.to_string())
        .replace("@SCRATCH@", &scratch.display().to_string());
    let repro = path.join("repro.sh");
    std::fs::write(&repro, script).unwrap();
    std::fs::set_permissions(&repro, std::os::unix::fs::PermissionsExt::from_mode(0o755)).unwrap();
    for i in 1..=n {
        commit_version(&path, i);
        if i == 1 {
            git(&path, &["tag", "v1"]);
        }
    }
    std::fs::write(
        scratch.join("bisect.toml"),
        config.replace("@SCRATCH@", &scratch.display().to_string()),
    )
    .unwrap();
    Repo {
        _tmp: tmp,
        path,
        scratch,
    }
}

const FAULT: &str =
    "echo 'RuntimeError: CUDA error: an illegal memory access was encountered' >&2; exit 1";

fn default_repro() -> String {
    format!("#!/bin/sh\nV=$(cat version.txt)\nif [ \"$V\" -ge @BAD@ ]; then {FAULT}; fi\nexit 0\n")
}

const CONFIG: &str =
    "[repro]\ncommand = \"./repro.sh\"\ngrace-period = \"1s\"\n[triage]\nenabled = false\n";

fn run(repo: &Repo, args: &[&str]) -> (i32, String, String) {
    let out: Output = Command::new(crate::common::bin())
        .args(args)
        .arg("-C")
        .arg(&repo.path)
        .output()
        .unwrap();
    (
        out.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

/// A run's report, when it wrote one (read as the crate's own type: one that does not read as it fails
/// the test).
type Ran = Option<Report>;

/// The report a run wrote.
fn rep(ran: &Ran) -> &Report {
    ran.as_ref().expect("a report")
}

/// `start` with the scratch config and a report; exit status, report, stderr.
fn start(repo: &Repo, args: &[&str]) -> (i32, Ran, String) {
    let config = repo.scratch.join("bisect.toml");
    let report = repo.scratch.join("report.json");
    let _ = std::fs::remove_file(&report);
    let mut all = vec!["start", "--config", config.to_str().unwrap()];
    all.extend_from_slice(args);
    all.extend_from_slice(&["--report", report.to_str().unwrap()]);
    let (code, _, err) = run(repo, &all);
    let report = std::fs::read_to_string(&report)
        .ok()
        .map(|t| serde_json::from_str(&t).expect("a report"));
    (code, report, err)
}

fn subject_of(repo: &Repo, commit: &str) -> String {
    git(&repo.path, &["log", "-1", "--format=%s", commit])
}

fn first_bad_subject(repo: &Repo, report: &Ran) -> String {
    let first_bad = report.as_ref().and_then(|r| r.first_bad.as_ref());
    subject_of(repo, first_bad.map_or("HEAD", |f| f.commit.as_str()))
}

#[test]
fn an_infrastructure_failure_is_not_replayed_once_the_host_is_fixed() {
    // Commits 10-30 meet a broken driver while the flag file exists.
    let template = format!(
        "#!/bin/sh\nV=$(cat version.txt)\nif [ -f @SCRATCH@/broken ] && [ \"$V\" -ge 10 ] && [ \"$V\" -le 30 ]; then echo 'RuntimeError: CUDA driver version is insufficient for CUDA runtime version' >&2; exit 1; fi\nif [ \"$V\" -ge @BAD@ ]; then {FAULT}; fi\nexit 0\n"
    );
    let repo = linear(40, 23, &template, CONFIG);
    std::fs::write(repo.scratch.join("broken"), "").unwrap();
    let (code, _, err) = start(&repo, &["v1..main"]);
    assert_eq!(code, 8, "{err}");
    std::fs::remove_file(repo.scratch.join("broken")).unwrap();
    let (code, report, err) = start(&repo, &["v1..main"]);
    assert_eq!(code, 0, "{err}");
    assert_eq!(first_bad_subject(&repo, &report), "commit 23");
    assert!(
        err.contains("are not reused: those probes run again"),
        "{err}"
    );
    // What the first run learned about commits the host did not fail on is reused.
    assert!(err.contains("[reused from the journal]"), "{err}");
}

#[test]
fn a_journal_that_is_a_fifo_is_never_opened_and_the_run_goes_on_from_scratch() {
    // J13d: opening a FIFO for reading waits for a writer that never comes. Bounded by `timeout`, so a
    // run that opens it fails here instead of hanging the suite.
    let repo = linear(40, 23, &default_repro(), CONFIG);
    let state = repo.path.join(".git/cudabisect");
    std::fs::create_dir_all(&state).unwrap();
    let fifo = state.join("journal.jsonl");
    assert!(Command::new("mkfifo")
        .arg(&fifo)
        .status()
        .unwrap()
        .success());
    let config = repo.scratch.join("bisect.toml");
    let out = Command::new("timeout")
        .args(["-k", "5", "120"])
        .arg(crate::common::bin())
        .args([
            "start",
            "--config",
            config.to_str().unwrap(),
            "v1..main",
            "-C",
        ])
        .arg(&repo.path)
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    let text = String::from_utf8_lossy(&out.stdout);
    assert_eq!(out.status.code(), Some(0), "{err}");
    assert!(text.contains("First bad commit"), "{text}");
    assert_eq!(
        err.matches("not a regular file").count(),
        1,
        "one warning: {err}"
    );
    assert!(
        std::fs::symlink_metadata(&fifo)
            .unwrap()
            .file_type()
            .is_fifo(),
        "the FIFO is left as it was"
    );
}

#[test]
fn a_rerun_keeps_the_logs_of_every_probe_it_reports_in_its_bundle() {
    let repo = linear(40, 23, &default_repro(), CONFIG);
    let logs = |report: &Ran| -> usize {
        let bundle = PathBuf::from(rep(report).bundle.as_deref().expect("a bundle"));
        std::fs::read_dir(bundle.join("logs/probes"))
            .map(|d| d.count())
            .unwrap_or(0)
    };
    let (code, first, err) = start(&repo, &["v1..main"]);
    assert_eq!(code, 0, "{err}");
    let before = logs(&first);
    assert!(before > 0);
    let (code, second, err) = start(&repo, &["v1..main"]);
    assert_eq!(code, 0, "{err}");
    assert!(
        rep(&second).probes.iter().all(|p| p.reused),
        "every probe reused"
    );
    assert_eq!(
        logs(&second),
        before,
        "the reused probes' logs travel with the rerun"
    );
    for p in &rep(&second).probes {
        let Some(log) = &p.log else {
            continue;
        };
        assert!(
            log.starts_with(&rep(&second).run_dir),
            "{log} is outside this run's directory"
        );
    }
}

#[test]
fn workers_sharing_a_scratch_file_never_name_a_wrong_commit() {
    // Every run writes its version to one file outside the worktree and reads it back after a pause:
    // correct one at a time, wrong when two workers overlap.
    let template = format!(
        "#!/bin/sh\nV=$(cat version.txt)\necho $V > @SCRATCH@/shared.txt\necho \"$CUDABISECT_WORKER $TMPDIR\" >> @SCRATCH@/tmpdirs.txt\nsleep 0.$(( $(od -An -N1 -tu1 /dev/urandom) % 3 + 1 ))\nV2=$(cat @SCRATCH@/shared.txt)\nif [ \"$V2\" -ge @BAD@ ]; then {FAULT}; fi\nexit 0\n"
    );
    let repo = linear(40, 23, &template, CONFIG);
    let (code, report, err) = start(&repo, &["v1..main", "--jobs", "3"]);
    assert_eq!(code, 0, "{err}");
    assert_eq!(first_bad_subject(&repo, &report), "commit 23", "{err}");
    // Each worker had a temporary directory of its own.
    let seen = std::fs::read_to_string(repo.scratch.join("tmpdirs.txt")).unwrap();
    let mut by_worker = std::collections::BTreeMap::new();
    for line in seen.lines() {
        if let Some((w, t)) = line.split_once(' ') {
            if !w.is_empty() {
                by_worker
                    .entry(w.to_string())
                    .or_insert_with(std::collections::BTreeSet::new)
                    .insert(t.to_string());
            }
        }
    }
    let dirs: std::collections::BTreeSet<_> = by_worker.values().flatten().collect();
    assert!(by_worker.len() >= 2, "{seen}");
    assert_eq!(dirs.len(), by_worker.len(), "one TMPDIR per worker: {seen}");
}

#[test]
fn a_written_confidence_alone_never_gives_a_silent_wrong_answer_on_a_flaky_fault() {
    // Bad commits fault on about half their runs (a hash of the commit and its run number).
    let template = format!(
        "#!/bin/sh\nV=$(cat version.txt)\nif [ \"$V\" -ge @BAD@ ]; then\n  f=@SCRATCH@/count-$V; n=$(cat $f 2>/dev/null || echo 0); echo $((n+1)) > $f\n  h=$(printf '%s-%s' $V $n | cksum | cut -d' ' -f1)\n  if [ $((h % 2)) -eq 0 ]; then {FAULT}; fi\nfi\nexit 0\n"
    );
    let config = format!("{CONFIG}[search]\nconfidence = 0.99\n");
    let repo = linear(30, 17, &template, &config);
    let (code, report, err) = start(&repo, &["v1..main", "--no-shrink"]);
    match code {
        0 => {
            assert_eq!(first_bad_subject(&repo, &report), "commit 17", "{err}");
            let reached = rep(&report).confidence.expect("the confidence reached");
            assert!(reached >= 0.99, "{reached}");
        }
        3 | 4 => {} // the bad end never faulted, or the budget ran out: said, not a wrong commit
        other => panic!("exit {other}: {err}"),
    }
}

#[test]
fn a_confidence_with_too_few_endpoint_runs_is_refused_with_what_to_change() {
    let config = format!("{CONFIG}[search]\nconfidence = 0.99\nendpoint-runs = 1\n");
    let repo = linear(5, 3, &default_repro(), &config);
    let (code, _, err) = start(&repo, &["v1..main"]);
    assert_eq!(code, 2, "{err}");
    assert!(err.contains("remove endpoint-runs"), "{err}");
}

fn replay(repo: &Repo, log: &str) -> String {
    let clone = repo.scratch.join("clone");
    let _ = std::fs::remove_dir_all(&clone);
    git(
        &repo.scratch,
        &["clone", "-q", repo.path.to_str().unwrap(), "clone"],
    );
    let file = repo.scratch.join("bisect.log");
    std::fs::write(&file, log).unwrap();
    let out = Command::new("git")
        .current_dir(&clone)
        .args(["bisect", "replay", file.to_str().unwrap()])
        .output()
        .unwrap();
    String::from_utf8_lossy(&out.stdout).into_owned() + &String::from_utf8_lossy(&out.stderr)
}

#[test]
fn find_fix_on_a_linear_history_names_the_fix_and_replays_in_git() {
    // The fault shows from commit 5 up to commit 19; commit 20 fixes it.
    let template =
        format!("#!/bin/sh\nV=$(cat version.txt)\nif [ \"$V\" -ge 5 ] && [ \"$V\" -lt @BAD@ ]; then {FAULT}; fi\nexit 0\n");
    let repo = linear(30, 20, &template, CONFIG);
    let old = git(&repo.path, &["rev-parse", "main~24"]);
    let (code, report, err) = start(&repo, &["--find-fix", &format!("{old}..main")]);
    assert_eq!(code, 0, "{err}");
    assert_eq!(first_bad_subject(&repo, &report), "commit 20");
    assert_eq!(rep(&report).terms.new, "fixed");
    assert!(rep(&report).message.starts_with("first fixed commit"));
    // The progress names the ends in the run's own terms: never "good endpoint → broken".
    assert!(
        err.contains(": old end ") && err.contains(": new end ") && !err.contains("endpoint"),
        "{err}"
    );
    // The fix verified alone: it runs clean, its parent still faults.
    let verify: Vec<_> = rep(&report)
        .probes
        .iter()
        .filter(|p| p.role == ProbeRole::Verify)
        .collect();
    assert_eq!(verify.len(), 2, "{report:#?}");
    assert_eq!(verify[1].signature.class, FaultClass::IllegalAddress);
    let (_, log, _) = run(&repo, &["log", "--format", "git"]);
    assert!(
        log.contains("'--term-old=broken' '--term-new=fixed'"),
        "{log}"
    );
    let replayed = replay(&repo, &log);
    let fix = rep(&report).first_bad.as_ref().unwrap().commit.as_str();
    assert!(
        replayed.contains(&format!("{fix} is the first fixed commit")),
        "{replayed}"
    );
    // A NEW end that still faults is refused with what --find-fix needs.
    let (code, report, err) = start(&repo, &["--find-fix", &format!("{old}..main~15")]);
    assert_eq!(code, 3, "{err}");
    let message = rep(&report).message.as_str();
    assert!(message.contains("not gone at new commit"), "{message}");
    // Refusals speak the run's terms (FF04): a reversed range of a fix search names broken and fixed.
    let (code, _, err) = start(&repo, &["--find-fix", &format!("main..{old}")]);
    assert_eq!(code, 2, "{err}");
    assert!(
        err.contains("fixed commit") && err.contains("broken commit"),
        "{err}"
    );
    assert!(
        !err.contains("bad commit") && !err.contains("good commit"),
        "{err}"
    );
    // A flaky search for a fix would read every run the other way round: refused before anything runs.
    let runs = repo.path.join(".git/cudabisect/runs");
    let before = std::fs::read_dir(&runs).map_or(0, |d| d.count());
    for flaky in [
        "[search]\nconfidence = 0.95\n",
        "[search]\nendpoint-runs = 3\n",
    ] {
        std::fs::write(repo.scratch.join("bisect.toml"), format!("{CONFIG}{flaky}")).unwrap();
        let (code, report, err) = start(&repo, &["--find-fix", &format!("{old}..main")]);
        assert_eq!(code, 2, "{err}");
        assert!(
            err.contains("--find-fix needs a fault that shows on every run"),
            "{err}"
        );
        assert_eq!(err.lines().count(), 1, "{err}");
        assert!(report.is_none(), "{report:#?}");
    }
    assert_eq!(std::fs::read_dir(&runs).map_or(0, |d| d.count()), before);
}

/// main: 1..=8, then side branches merged one by one; the fix lands on the side branch `fix`.
fn merge_heavy(template: &str) -> Repo {
    let repo = linear(8, 0, template, CONFIG);
    let p = &repo.path;
    for (k, name) in ["a", "b", "fix", "c"].iter().enumerate() {
        git(p, &["checkout", "-q", "-b", name, "main"]);
        std::fs::write(p.join(format!("{name}.txt")), "side\n").unwrap();
        if *name == "fix" {
            std::fs::write(p.join("fixed.txt"), "yes\n").unwrap();
        }
        git(p, &["add", "-A"]);
        git(p, &["commit", "-q", "-m", &format!("side {name}")]);
        git(p, &["checkout", "-q", "main"]);
        commit_version(p, 9 + k);
        git(
            p,
            &[
                "merge",
                "-q",
                "--no-ff",
                "-m",
                &format!("merge {name}"),
                name,
            ],
        );
    }
    repo
}

#[test]
fn find_fix_with_several_workers_runs_the_old_end_once_in_the_first_round() {
    // Each run notes its commit's version; the fault shows from 5 up to 19, and 20 fixes it.
    let template = format!(
        "#!/bin/sh\nV=$(cat version.txt)\necho $V >> @SCRATCH@/runs.log\nif [ \"$V\" -ge 5 ] && [ \"$V\" -lt @BAD@ ]; then {FAULT}; fi\nexit 0\n"
    );
    let repo = linear(30, 20, &template, CONFIG);
    let old = git(&repo.path, &["rev-parse", "main~24"]);
    let config = repo.scratch.join("bisect.toml");
    let range = format!("{old}..main");
    let (code, out, err) = run(
        &repo,
        &[
            "start",
            "--config",
            config.to_str().unwrap(),
            "--find-fix",
            &range,
            "--jobs",
            "3",
            "--message-format",
            "json",
        ],
    );
    assert_eq!(code, 0, "{err}");
    let events = crate::common::events(&out);
    let Some(Event::Finished { report }) = events.last() else {
        panic!("{out}")
    };
    assert_eq!(report.first_bad.as_ref().unwrap().subject, "commit 20");
    // Every probe, the OLD end's first, has a number of its own.
    crate::common::one_probe_per_step(&events).unwrap_or_else(|e| panic!("{e}\n{err}"));
    // The OLD end (commit 6) ran once: it opened the first round, its fault the one every probe is
    // measured by, the NEW end checked beside it.
    let runs = std::fs::read_to_string(repo.scratch.join("runs.log")).unwrap();
    assert_eq!(
        runs.lines().filter(|v| v.trim() == "6").count(),
        1,
        "{runs}\n{err}"
    );
}

#[test]
fn find_fix_on_a_merge_heavy_history_names_the_side_commit_and_replays_in_git() {
    let template = format!(
        "#!/bin/sh\nV=$(cat version.txt)\nif [ ! -f fixed.txt ] && [ \"$V\" -ge 3 ]; then {FAULT}; fi\nexit 0\n"
    );
    let repo = merge_heavy(&template);
    // Commit 3 is the first that faults.
    let broken = git(
        &repo.path,
        &["log", "--format=%H", "--grep=^commit 3$", "main"],
    );
    let (code, report, err) = start(&repo, &["--find-fix", &format!("{broken}..main")]);
    assert_eq!(code, 0, "{err}");
    assert_eq!(first_bad_subject(&repo, &report), "side fix");
    let notes = rep(&report).notes.join("\n");
    assert!(notes.contains("side branch"), "{notes}");
    let (_, log, _) = run(&repo, &["log", "--format", "git"]);
    let fix = rep(&report).first_bad.as_ref().unwrap().commit.as_str();
    assert!(
        replay(&repo, &log).contains(&format!("{fix} is the first fixed commit")),
        "{log}"
    );
    // Along first parents the fix is the merge that brought it.
    let (code, report, err) = start(
        &repo,
        &["--find-fix", &format!("{broken}..main"), "--first-parent"],
    );
    assert_eq!(code, 0, "{err}");
    assert_eq!(first_bad_subject(&repo, &report), "merge fix");
    let (_, log, _) = run(&repo, &["log", "--format", "git"]);
    assert!(log.contains("'--first-parent'"), "{log}");
    let fix = rep(&report).first_bad.as_ref().unwrap().commit.as_str();
    assert!(
        replay(&repo, &log).contains(&format!("{fix} is the first fixed commit")),
        "{log}"
    );
}

#[test]
fn a_first_parent_bug_search_replays_in_git_to_the_same_merge() {
    // The bug arrives with the side branch `c`: its side commit adds the file that faults.
    let template = format!("#!/bin/sh\nif [ -f c.txt ]; then {FAULT}; fi\nexit 0\n");
    let repo = merge_heavy(&template);
    let (code, report, err) = start(&repo, &["v1..main", "--first-parent"]);
    assert_eq!(code, 0, "{err}");
    assert_eq!(first_bad_subject(&repo, &report), "merge c");
    let (_, log, _) = run(&repo, &["log", "--format", "git"]);
    let culprit = rep(&report).first_bad.as_ref().unwrap().commit.as_str();
    let replayed = replay(&repo, &log);
    assert!(
        replayed.contains(&format!("{culprit} is the first bad commit")),
        "{log}\n{replayed}"
    );
}

#[test]
fn a_lock_that_cannot_be_made_is_a_usage_error_not_another_run() {
    let repo = linear(5, 3, &default_repro(), CONFIG);
    std::fs::create_dir_all(repo.path.join(".git/cudabisect.lock")).unwrap();
    let (code, _, err) = start(&repo, &["v1..main"]);
    assert_eq!(code, 2, "{err}");
    assert!(!err.contains("another cudabisect run"), "{err}");
}

/// A force-push and gc: `back` commits dropped for good, then commits `versions` whose repro faults from
/// version 4 on.
fn force_push(repo: &Repo, back: usize, versions: std::ops::Range<usize>) {
    git(
        &repo.path,
        &["reset", "-q", "--hard", &format!("HEAD~{back}")],
    );
    git(&repo.path, &["update-ref", "-d", "ORIG_HEAD"]);
    git(&repo.path, &["reflog", "expire", "--expire=now", "--all"]);
    git(&repo.path, &["gc", "-q", "--prune=now"]);
    std::fs::write(
        repo.path.join("repro.sh"),
        default_repro().replace("@BAD@", "4"),
    )
    .unwrap();
    for i in versions {
        commit_version(&repo.path, i);
    }
}

fn nightly(repo: &Repo, config: &Path, extra: &[&str]) -> (i32, Vec<Event>, String) {
    let state = repo.scratch.join("state");
    let mut args = vec![
        "nightly",
        "--config",
        config.to_str().unwrap(),
        "--state",
        state.to_str().unwrap(),
        "--message-format",
        "json",
        // The codes this test reads, whatever CI the suite runs under.
        "--exit-codes",
        "detailed",
    ];
    args.extend_from_slice(extra);
    let (code, out, err) = run(repo, &args);
    assert!(
        out.lines().all(|l| l.starts_with('{')),
        "not JSON Lines: {out}"
    );
    (code, crate::common::events(&out), err)
}

fn night_status(events: &[Event]) -> String {
    events
        .iter()
        .find_map(|e| match e {
            Event::Nightly { record } => Some(record.status.as_str().to_string()),
            _ => None,
        })
        .unwrap_or_default()
}

#[test]
fn nightly_keeps_its_state_across_a_config_comment_and_survives_a_force_push() {
    let repo = linear(6, 100, &default_repro(), CONFIG);
    let config = repo.scratch.join("bisect.toml");
    let (code, events, err) = nightly(&repo, &config, &[]);
    assert_eq!(
        (code, night_status(&events).as_str()),
        (10, "baseline"),
        "{err}"
    );
    // The head's probe is finished like any probe, as what it is: the head.
    let head: Vec<&ProbeRecord> = events
        .iter()
        .filter_map(|e| match e {
            Event::ProbeFinished { record, .. } => Some(&**record),
            _ => None,
        })
        .collect();
    assert_eq!(head.len(), 1, "{events:?}");
    assert_eq!(head[0].role, ProbeRole::Head);
    assert_eq!(head[0].verdict, Verdict::Good);
    // A comment in the config judges nothing: the same state, a clean night.
    let text = std::fs::read_to_string(&config).unwrap();
    std::fs::write(&config, format!("# tuned for the new runner\n{text}")).unwrap();
    let (code, events, err) = nightly(&repo, &config, &[]);
    assert_eq!(
        (code, night_status(&events).as_str()),
        (0, "clean"),
        "{err}"
    );
    // History rewritten: the last good commit is gone, and the new head faults.
    force_push(&repo, 4, 3..6);
    let (code, events, err) = nightly(&repo, &config, &[]);
    assert_eq!(
        (code, night_status(&events).as_str()),
        (4, "inconclusive"),
        "{err}"
    );
    assert!(
        err.contains("no longer exists")
            || events
                .iter()
                .any(|e| format!("{e:?}").contains("no longer exists")),
        "{err}"
    );
    // Told where to start, it bisects; the next night knows the regression.
    let since = git(&repo.path, &["rev-parse", "v1"]);
    let (code, events, err) = nightly(&repo, &config, &["--since", &since]);
    assert_eq!(
        (code, night_status(&events).as_str()),
        (12, "regression"),
        "{err}"
    );
    let (code, events, err) = nightly(&repo, &config, &[]);
    assert_eq!(
        (code, night_status(&events).as_str()),
        (13, "still_failing"),
        "{err}"
    );
    // Rewritten again, under the open regression: its first bad commit is gone, so it is not reported as
    // still failing with a commit that no longer exists; the fault is bisected afresh.
    force_push(&repo, 3, 13..15);
    let (code, events, err) = nightly(&repo, &config, &[]);
    let said = format!("{err}{events:?}");
    assert_eq!(
        (code, night_status(&events).as_str()),
        (4, "inconclusive"),
        "{said}"
    );
    assert!(
        said.contains("open regression's first bad commit"),
        "{said}"
    );
    let (code, events, err) = nightly(&repo, &config, &["--since", &since]);
    assert_eq!(
        (code, night_status(&events).as_str()),
        (12, "regression"),
        "{err}"
    );
}

const PY_REPRO: &str = "import json, os, sys, time\nv = int(open('version.txt').read())\nopen(os.path.join(os.environ['SCRATCH'], f'pid-{v}'), 'w').write(str(os.getpid()))\nif v >= @BAD@ and os.environ.get('HANG'):\n    time.sleep(600)\nif v >= @BAD@:\n    print('RuntimeError: CUDA error: an illegal memory access was encountered', file=sys.stderr)\n    sys.exit(1)\nprint(json.dumps({'ok': v}))\n";

fn python_repo(extra: &str) -> Repo {
    let config = format!(
        "[repro]\ncommand = \"python3 repro.sh\"\ngrace-period = \"1s\"\ntimeout = \"3s\"\nenv = {{ SCRATCH = \"@SCRATCH@\"{extra} }}\n[triage]\nenabled = false\n"
    );
    // `linear` writes the template to `repro.sh`; here it is Python, run as `python3 repro.sh`.
    linear(40, 23, PY_REPRO, &config)
}

#[test]
fn warm_probes_give_the_answers_of_cold_ones_and_say_how_each_ran() {
    let repo = python_repo("");
    let (code, warm, err) = start(&repo, &["v1..main", "--fresh"]);
    assert_eq!(code, 0, "{err}");
    assert_eq!(first_bad_subject(&repo, &warm), "commit 23");
    let runners: Vec<String> = rep(&warm)
        .probes
        .iter()
        .map(|p| p.runner.clone().unwrap_or_default())
        .collect();
    assert!(runners.iter().all(|r| r == "warm"), "{runners:?}");
    // Three workers: the two that wait while the bad end runs alone start their warm interpreters then
    // (each from its own worktree at the bad end), and every probe of the first round runs in them.
    let (code, three, err) = start(&repo, &["v1..main", "--fresh", "--jobs", "3"]);
    assert_eq!(code, 0, "{err}");
    assert_eq!(first_bad_subject(&repo, &three), "commit 23");
    for p in &rep(&three).probes {
        assert_eq!(p.runner.as_deref(), Some("warm"), "{p:?}");
    }
    let warm_dir = Path::new(&rep(&three).run_dir).join("warm");
    for w in 1..=3 {
        assert!(
            warm_dir.join(format!("server-{w}.log")).is_file(),
            "worker {w} started no warm interpreter"
        );
    }
    let config = repo.scratch.join("bisect.toml");
    let text = std::fs::read_to_string(&config).unwrap();
    std::fs::write(
        &config,
        text.replace("[repro]\n", "[repro]\nwarm = false\n"),
    )
    .unwrap();
    let (code, cold, err) = start(&repo, &["v1..main", "--fresh"]);
    assert_eq!(code, 0, "{err}");
    let verdicts = |r: &Ran| -> Vec<(String, Verdict)> {
        rep(r)
            .probes
            .iter()
            .map(|p| (p.commit.clone(), p.verdict))
            .collect()
    };
    assert_eq!(
        verdicts(&warm),
        verdicts(&cold),
        "the same probes, the same verdicts"
    );
    assert!(rep(&cold).probes[0].runner.is_none());
}

#[test]
fn with_several_workers_each_serves_all_its_probes_from_one_warm_interpreter() {
    // Each run notes its worker and the process it was forked from. A worker sharing its GPU gives every
    // run a rendezvous port of its own; that must not start a new warm interpreter (seconds of imports)
    // for each probe.
    let repro = PY_REPRO.replace(
        "import json, os, sys, time\n",
        "import json, os, sys, time\nopen(os.path.join(os.environ['SCRATCH'], 'parents'), 'a').write(f\"{os.environ['CUDABISECT_WORKER']} {os.getppid()}\\n\")\n",
    );
    let config = "[repro]\ncommand = \"python3 repro.sh\"\ngrace-period = \"1s\"\ntimeout = \"10s\"\nenv = { SCRATCH = \"@SCRATCH@\" }\n[search]\ndevices = [0, 0, 0]\n[triage]\nenabled = false\n";
    let repo = linear(60, 41, &repro, config);
    // The probes alone: the shrink's capture would run the repro at the culprit again.
    let (code, ran, err) = start(
        &repo,
        &["v1..main", "--fresh", "--jobs", "3", "--no-shrink"],
    );
    assert_eq!(code, 0, "{err}");
    assert_eq!(first_bad_subject(&repo, &ran), "commit 41");
    for p in &rep(&ran).probes {
        assert_eq!(p.runner.as_deref(), Some("warm"), "{p:?}");
    }
    let noted = std::fs::read_to_string(repo.scratch.join("parents")).unwrap();
    // The cross-check, last: the answer and its parent run again, side by side on two workers.
    let verify: Vec<(String, Verdict)> = rep(&ran)
        .probes
        .iter()
        .filter(|p| p.role == ProbeRole::Verify)
        .map(|p| (subject_of(&repo, &p.commit), p.verdict))
        .collect();
    assert_eq!(
        verify,
        [
            ("commit 41".to_string(), Verdict::Bad),
            ("commit 40".to_string(), Verdict::Good)
        ]
    );
    let last_two: std::collections::BTreeSet<&str> = noted
        .lines()
        .rev()
        .take(2)
        .filter_map(|l| l.split(' ').next())
        .collect();
    assert_eq!(
        last_two.len(),
        2,
        "the cross-check ran on one worker: {noted}"
    );
    let mut servers: std::collections::BTreeMap<&str, std::collections::BTreeSet<&str>> =
        Default::default();
    for line in noted.lines() {
        let (worker, parent) = line.split_once(' ').unwrap();
        servers.entry(worker).or_default().insert(parent);
    }
    assert_eq!(servers.len(), 3, "{noted}");
    for (worker, parents) in &servers {
        assert_eq!(
            parents.len(),
            1,
            "worker {worker}'s runs came from {parents:?}"
        );
    }
    let all: std::collections::BTreeSet<_> = servers.values().flatten().collect();
    assert_eq!(all.len(), 3, "one warm interpreter per worker: {noted}");
}

#[test]
fn what_a_good_run_imports_beyond_a_faulting_one_is_preloaded_for_every_run_after_it() {
    // The bad end runs first and faults before the training step's later imports (here a submodule,
    // `xml.dom.minidom`, as an optimizer step imports `torch._dynamo`); the good end imports it. Every
    // run after the good end finds it already imported: its worker's warm interpreter learned it from
    // that run, not only from the first.
    let repro = PY_REPRO.replace(
        "print(json.dumps({'ok': v}))\n",
        "import xml.dom.minidom\nprint(json.dumps({'ok': v}))\n",
    ).replace(
        "import json, os, sys, time\n",
        "import json, os, sys, time\nopen(os.path.join(os.environ['SCRATCH'], 'seen'), 'a').write(f\"{'xml.dom.minidom' in sys.modules}\\n\")\n",
    );
    let config = "[repro]\ncommand = \"python3 repro.sh\"\ngrace-period = \"1s\"\ntimeout = \"10s\"\nenv = { SCRATCH = \"@SCRATCH@\" }\n[triage]\nenabled = false\n";
    let repo = linear(40, 23, &repro, config);
    let (code, ran, err) = start(
        &repo,
        &["v1..main", "--fresh", "--jobs", "1", "--no-shrink"],
    );
    assert_eq!(code, 0, "{err}");
    assert_eq!(first_bad_subject(&repo, &ran), "commit 23");
    let roles: Vec<ProbeRole> = rep(&ran).probes.iter().map(|p| p.role).collect();
    assert_eq!(
        roles[..2],
        [ProbeRole::BadEndpoint, ProbeRole::GoodEndpoint]
    );
    for p in &rep(&ran).probes {
        assert_eq!(p.runner.as_deref(), Some("warm"), "{p:?}");
    }
    let seen = std::fs::read_to_string(repo.scratch.join("seen")).unwrap();
    let seen: Vec<&str> = seen.lines().collect();
    assert_eq!(seen.len(), roles.len(), "{seen:?}");
    // The bad end and the good end import it themselves; every later run, bad or good, is served it.
    assert_eq!(seen[..2], ["False", "False"], "{seen:?}");
    assert!(seen[2..].iter().all(|s| *s == "True"), "{seen:?}");
}

/// A Python build step: it writes `built.txt` (the commit's version), which the repro refuses to run
/// without, so an answer is only right when every probe built its own commit; and it notes whether its
/// parent is a warm interpreter, as the process table says, not as the record does.
const PY_BUILD: &str = "import os\nv = open('version.txt').read()\nopen('built.txt', 'w').write(v)\nparent = open(f'/proc/{os.getppid()}/cmdline', 'rb').read()\nopen(os.path.join('@SCRATCH@', 'build-parents'), 'a').write('warm\\n' if b'warm_probe' in parent else 'cold\\n')\n";

#[test]
fn a_python_build_runs_in_a_warm_interpreter_of_its_own_and_gives_the_answers_of_a_cold_one() {
    let config = "[repro]\ncommand = \"python3 repro.sh\"\ngrace-period = \"1s\"\ntimeout = \"3s\"\nenv = { SCRATCH = \"@SCRATCH@\" }\n[build]\ncommand = \"python3 @SCRATCH@/build.py\"\n[triage]\nenabled = false\n";
    let repro = PY_REPRO.replace(
        "v = int(open('version.txt').read())\n",
        "v = int(open('version.txt').read())\nassert open('built.txt').read() == open('version.txt').read(), 'not built'\n",
    );
    let repo = linear(40, 23, &repro, config);
    let scratch = repo.scratch.display().to_string();
    std::fs::write(
        repo.scratch.join("build.py"),
        PY_BUILD.replace("@SCRATCH@", &scratch),
    )
    .unwrap();
    // One worker: the probes, and so the verdicts compared below, do not depend on which of two
    // parallel probes the search stopped first.
    let (code, warm, err) = start(&repo, &["v1..main", "--fresh", "--jobs", "1"]);
    assert_eq!(code, 0, "{err}");
    assert_eq!(first_bad_subject(&repo, &warm), "commit 23");
    for p in &rep(&warm).probes {
        assert_eq!(p.build_runner.as_deref(), Some("warm"), "{p:?}");
        assert_eq!(p.runner.as_deref(), Some("warm"), "{p:?}");
    }
    // Each build was a child of a warm interpreter, as the process table says.
    let parents = repo.scratch.join("build-parents");
    let said = std::fs::read_to_string(&parents).unwrap();
    assert!(said.lines().count() >= rep(&warm).probes.len());
    assert!(said.lines().all(|l| l == "warm"), "{said}");
    std::fs::remove_file(&parents).unwrap();
    let warm_dir = Path::new(&rep(&warm).run_dir).join("warm");
    assert!(warm_dir.join("build-server-1.log").is_file());
    assert!(warm_dir.join("server-1.log").is_file());
    let config_path = repo.scratch.join("bisect.toml");
    let text = std::fs::read_to_string(&config_path).unwrap();
    std::fs::write(
        &config_path,
        text.replace("[build]\n", "[build]\nwarm = false\n"),
    )
    .unwrap();
    let (code, cold, err) = start(&repo, &["v1..main", "--fresh", "--jobs", "1"]);
    assert_eq!(code, 0, "{err}");
    let verdicts = |r: &Ran| -> Vec<(String, Verdict)> {
        let mut v: Vec<_> = rep(r)
            .probes
            .iter()
            .map(|p| (p.commit.clone(), p.verdict))
            .collect();
        v.sort_by(|a, b| a.0.cmp(&b.0));
        v
    };
    assert_eq!(verdicts(&warm), verdicts(&cold));
    for p in &rep(&cold).probes {
        assert_eq!(p.build_runner, None, "{p:?}");
    }
    let said = std::fs::read_to_string(&parents).unwrap();
    assert!(said.lines().all(|l| l == "cold"), "{said}");
}

/// A training script outside the repository that imports the project through a relative PYTHONPATH
/// (`src`, `.`), as many jobs are set up: a fresh `python` in the worktree finds the worktree's package
/// there, and so must a warm probe, whose interpreter started elsewhere.
#[test]
fn a_warm_probe_finds_the_worktrees_package_through_a_relative_pythonpath() {
    let train = "import sys\nimport verpkg\nif verpkg.V >= 17:\n    print('RuntimeError: CUDA error: an illegal memory access was encountered', file=sys.stderr)\n    sys.exit(1)\n";
    let package = "V = int(open('version.txt').read())\n";
    for (pythonpath, at) in [
        ("src", "src/verpkg/__init__.py"),
        (".", "verpkg/__init__.py"),
    ] {
        let config = format!("[repro]\ncommand = \"python3 @SCRATCH@/train.py\"\ngrace-period = \"1s\"\ntimeout = \"5s\"\nenv = {{ PYTHONPATH = \"{pythonpath}\" }}\n[triage]\nenabled = false\n");
        let repo = linear_with(24, 17, &[(at, package)], "#!/bin/sh\nexit 0\n", &config);
        std::fs::write(repo.scratch.join("train.py"), train).unwrap();
        let (code, report, err) = start(&repo, &["v1..main", "--fresh"]);
        assert_eq!(code, 0, "PYTHONPATH={pythonpath}: {err}");
        assert_eq!(first_bad_subject(&repo, &report), "commit 17", "{err}");
        for p in &rep(&report).probes {
            assert_eq!(p.runner.as_deref(), Some("warm"), "{p:?}");
        }
    }
}

#[test]
fn a_good_end_failing_in_code_of_the_users_checkout_is_refused_naming_the_installed_copy() {
    // The project installed for development (`pip install -e .`): the environment's site-packages holds
    // a path entry to the checkout's `src`, which Python searches before any worktree, so every probe ran
    // the checkout's code and the good end "faulted". The refusal says which file and what to do.
    let train = "import verpkg\nverpkg.step()\n";
    let package = "import os\nHERE = os.path.dirname(os.path.abspath(__file__))\nV = int(open(os.path.join(HERE, '..', '..', 'version.txt')).read())\ndef step():\n    if V >= 17:\n        raise RuntimeError('CUDA error: an illegal memory access was encountered')\n";
    let config = |env: &str| {
        format!("[repro]\ncommand = \"@SCRATCH@/venv/bin/python3 @SCRATCH@/train.py\"\ntimeout = \"30s\"\n{env}[triage]\nenabled = false\n")
    };
    let repo = linear_with(
        24,
        17,
        &[("src/verpkg/__init__.py", package)],
        "#!/bin/sh\nexit 0\n",
        &config(""),
    );
    std::fs::write(repo.scratch.join("train.py"), train).unwrap();
    let venv = repo.scratch.join("venv");
    let made = Command::new("python3")
        .args(["-m", "venv", "--without-pip", "--system-site-packages"])
        .arg(&venv)
        .status()
        .unwrap();
    assert!(made.success());
    let lib = std::fs::read_dir(venv.join("lib"))
        .unwrap()
        .next()
        .unwrap()
        .unwrap()
        .path();
    std::fs::write(
        lib.join("site-packages/__editable__.verpkg-0.1.pth"),
        format!("{}\n", repo.path.join("src").display()),
    )
    .unwrap();
    let (code, report, err) = start(&repo, &["v1..main", "--fresh"]);
    assert_eq!(code, 3, "{err}");
    let message = &rep(&report).message;
    let file = repo.path.join("src/verpkg/__init__.py");
    assert!(
        message.contains(&format!("your checkout's ({})", file.display()))
            && message.contains("pip install -e")
            && message.contains("PYTHONPATH"),
        "{message}"
    );
    // With the worktree's source first, as the refusal says, the same environment finds the culprit.
    std::fs::write(
        repo.scratch.join("bisect.toml"),
        config("env = { PYTHONPATH = \"src\" }\n")
            .replace("@SCRATCH@", &repo.scratch.display().to_string()),
    )
    .unwrap();
    let (code, report, err) = start(&repo, &["v1..main", "--fresh"]);
    assert_eq!(code, 0, "{err}");
    assert_eq!(first_bad_subject(&repo, &report), "commit 17", "{err}");
}

/// A Python repro that, the first time it runs at a bad commit in a warm interpreter's child, kills that
/// interpreter (as the machine's OOM killer might) before it can say anything.
const PY_REPRO_KILLING_ITS_SERVER: &str = "import os, sys, time\nv = int(open('version.txt').read())\nmark = os.path.join(os.environ['SCRATCH'], 'killed')\nwith open(f'/proc/{os.getppid()}/cmdline', 'rb') as f:\n    parent = f.read()\nif v >= @BAD@ and b'warm_probe.py' in parent and not os.path.exists(mark):\n    open(mark, 'w').close()\n    os.kill(os.getppid(), 9)\n    time.sleep(5)\nif v >= @BAD@:\n    print('RuntimeError: CUDA error: an illegal memory access was encountered', file=sys.stderr)\n    sys.exit(1)\n";

#[test]
fn a_probe_whose_warm_interpreter_died_under_it_is_run_again_not_judged() {
    let config = "[repro]\ncommand = \"python3 repro.sh\"\ngrace-period = \"1s\"\ntimeout = \"20s\"\nenv = { SCRATCH = \"@SCRATCH@\" }\n[triage]\nenabled = false\n";
    let repo = linear(24, 13, PY_REPRO_KILLING_ITS_SERVER, config);
    let (code, report, err) = start(&repo, &["v1..main", "--fresh"]);
    assert_eq!(code, 0, "{err}");
    assert!(
        repo.scratch.join("killed").exists(),
        "no run killed its server"
    );
    assert_eq!(first_bad_subject(&repo, &report), "commit 13");
    // The bad end's run was lost with its interpreter; its second run, in another, is the one judged.
    let bad_end = rep(&report)
        .probes
        .iter()
        .find(|p| p.role == ProbeRole::BadEndpoint)
        .expect("the bad end's probe");
    assert_eq!(
        (bad_end.attempts, bad_end.runner.as_deref()),
        (2, Some("warm")),
        "{bad_end:?}"
    );
    assert_eq!(
        rep(&report).target.as_ref().unwrap().class,
        FaultClass::IllegalAddress
    );
}

#[test]
fn a_warm_repro_that_hangs_is_a_hang_and_leaves_no_process_behind() {
    let repo = python_repo(", HANG = \"1\"");
    let (code, report, err) = start(&repo, &["v1..main", "--fresh"]);
    assert_eq!(code, 0, "{err}");
    assert_eq!(first_bad_subject(&repo, &report), "commit 23");
    assert_eq!(
        rep(&report).target.as_ref().unwrap().class,
        FaultClass::Hang
    );
    for entry in std::fs::read_dir(&repo.scratch).unwrap() {
        let path = entry.unwrap().path();
        let name = path.file_name().unwrap().to_string_lossy().into_owned();
        if let Some(v) = name.strip_prefix("pid-") {
            let pid = std::fs::read_to_string(&path).unwrap();
            let status =
                std::fs::read_to_string(format!("/proc/{}/status", pid.trim())).unwrap_or_default();
            assert!(
                status.is_empty() || status.contains("zombie"),
                "the run of commit {v} (pid {pid}) outlived its probe"
            );
        }
    }
}

/// A stand-in for Triton's launch path (the real one needs a GPU): `@triton.jit` functions launched with
/// `kernel[grid](…)` through `triton/runtime/jit.py`, where a bad kernel raises Triton's CUDA error.
fn fake_triton(site: &Path) {
    let jit = site.join("triton/runtime");
    std::fs::create_dir_all(&jit).unwrap();
    std::fs::write(
        site.join("triton/__init__.py"),
        "from triton.runtime.jit import jit\n",
    )
    .unwrap();
    std::fs::write(jit.join("__init__.py"), "").unwrap();
    std::fs::write(
        jit.join("jit.py"),
        "class JITFunction:\n    def __init__(self, fn):\n        self.fn = fn\n\n    def __getitem__(self, grid):\n        return lambda *a, **k: self.run(*a, grid=grid, **k)\n\n    def run(self, *args, grid=None, **kwargs):\n        if self.fn(*args):\n            raise RuntimeError('Triton Error [CUDA]: an illegal memory access was encountered')\n\n\ndef jit(fn):\n    return JITFunction(fn)\n",
    )
    .unwrap();
}

#[test]
fn warm_probes_name_the_triton_kernel_that_faulted_so_a_lookalike_bug_needs_no_sanitizer() {
    // Two Triton bugs of one class through one launch wrapper: `bias` at commits 18..=21, where the first
    // probes land, and `embed` (the target) from 24. No compute-sanitizer here: only the kernels named at launch tell them apart.
    let script = "import sys, triton\nv = int(open('version.txt').read())\n\n@triton.jit\ndef bias(x):\n    return 18 <= v <= 21\n\n@triton.jit\ndef embed(x):\n    return v >= @BAD@\n\ndef run(kernel):\n    kernel[(1,)](0)\n\nrun(bias)\nrun(embed)\nprint('ok')\n";
    let config = "[repro]\ncommand = \"python3 repro.sh\"\nenv = { PYTHONPATH = \"@SCRATCH@/site-packages\" }\n[triage]\nenabled = false\n";
    let repo = linear(40, 24, script, config);
    fake_triton(&repo.scratch.join("site-packages"));
    let (code, report, err) = start(&repo, &["v1..main", "--fresh"]);
    assert_eq!(code, 0, "{err}");
    assert_eq!(first_bad_subject(&repo, &report), "commit 24", "{err}");
    let target = rep(&report).target.as_ref().unwrap();
    assert_eq!(target.kernel.as_deref(), Some("embed"), "{target:#?}");
    let mut lookalikes = 0;
    for p in &rep(&report).probes {
        let v: usize = subject_of(&repo, &p.commit)
            .trim_start_matches("commit ")
            .parse()
            .unwrap();
        if (18..=21).contains(&v) {
            lookalikes += 1;
            assert_eq!(p.verdict, Verdict::Skip, "commit {v}: {p:#?}");
            assert_eq!(p.signature.kernel.as_deref(), Some("bias"));
        }
        assert!(p.sanitizer.is_none(), "no sanitizer run: {p:#?}");
    }
    assert!(lookalikes > 0, "the other bug was never met: {report:#?}");
}

#[test]
fn a_library_that_starts_cuda_at_import_is_left_out_of_the_preload_and_probes_stay_warm() {
    // A stand-in torch whose CUDA state a library flips at import, as real kernel libraries do when they
    // query the device (`torch.cuda.get_device_capability()`) at import (the real one needs a GPU).
    let script = "import sys, torch, devlib\nv = int(open('version.txt').read())\nif v >= @BAD@:\n    print('RuntimeError: CUDA error: an illegal memory access was encountered', file=sys.stderr)\n    sys.exit(1)\nprint('ok', torch.cuda.is_initialized())\n";
    let config = "[repro]\ncommand = \"python3 repro.sh\"\nenv = { PYTHONPATH = \"@SCRATCH@/site-packages\" }\n[triage]\nenabled = false\n";
    let repo = linear(40, 24, script, config);
    let site = repo.scratch.join("site-packages");
    std::fs::create_dir_all(site.join("torch")).unwrap();
    std::fs::create_dir_all(site.join("devlib")).unwrap();
    std::fs::write(
        site.join("torch/__init__.py"),
        "class cuda:\n    started = False\n\n    @staticmethod\n    def is_initialized():\n        return cuda.started\n",
    )
    .unwrap();
    std::fs::write(
        site.join("devlib/__init__.py"),
        "import torch\n\ntorch.cuda.started = True  # the device queried at import\n",
    )
    .unwrap();
    let (code, report, err) = start(&repo, &["v1..main", "--fresh"]);
    assert_eq!(code, 0, "{err}");
    assert_eq!(first_bad_subject(&repo, &report), "commit 24", "{err}");
    let runners: Vec<String> = rep(&report)
        .probes
        .iter()
        .map(|p| p.runner.clone().unwrap_or_default())
        .collect();
    // Every probe ran warm: the server preloads torch, and each child imports devlib itself.
    assert!(runners.iter().all(|r| r == "warm"), "{runners:?}\n{err}");
}

#[test]
fn executor_workdir_is_resolved_once_and_refused_when_it_cannot_keep_worktrees_out_of_the_checkout()
{
    let repo = linear(8, 5, &default_repro(), CONFIG);
    let scratch = repo.scratch.clone();
    std::fs::write(scratch.join("a-file"), "x").unwrap();
    let status = || git(&repo.path, &["status", "--porcelain", "--ignored"]);
    let worktrees = || git(&repo.path, &["worktree", "list", "--porcelain"]);
    let (before, listed) = (status(), worktrees());
    let file = scratch.join("a-file").display().to_string();
    for (workdir, why) in [
        ("relwd", "is inside the repository's working tree"),
        (".", "is inside the repository's working tree"),
        (".git", "is inside the repository's working tree"),
        (file.as_str(), "is not a directory"),
    ] {
        std::fs::write(
            scratch.join("bisect.toml"),
            format!("{CONFIG}[executor]\nworkdir = \"{workdir}\"\n"),
        )
        .unwrap();
        let (code, _, err) = start(&repo, &["v1..main", "--no-shrink"]);
        assert_eq!(code, 2, "{workdir}: {err}");
        assert!(err.contains(why), "{workdir}: {err}");
        assert_eq!(err.lines().count(), 1, "{err}");
        assert!(!repo.path.join("relwd").exists());
        assert_eq!(status(), before, "{workdir}: the checkout changed");
        assert_eq!(
            worktrees(),
            listed,
            "{workdir}: a worktree was left registered"
        );
    }
    // A relative path is taken from the repository root, `~` from HOME; both hold the worktrees.
    let home = tempfile::tempdir().unwrap();
    for (workdir, lands) in [
        (
            "../wd-rel".to_string(),
            repo.path.parent().unwrap().join("wd-rel"),
        ),
        ("~/wd-home".to_string(), home.path().join("wd-home")),
    ] {
        std::fs::write(
            scratch.join("bisect.toml"),
            format!("{CONFIG}[executor]\nworkdir = \"{workdir}\"\n"),
        )
        .unwrap();
        let config = scratch.join("bisect.toml");
        let out = Command::new(crate::common::bin())
            .args(["start", "v1..main", "--no-shrink", "--fresh", "--config"])
            .arg(&config)
            .arg("-C")
            .arg(&repo.path)
            .env("HOME", home.path())
            .current_dir(&scratch)
            .output()
            .unwrap();
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(0), "{workdir}: {err}");
        assert!(lands.is_dir(), "{workdir}: nothing at {}", lands.display());
        assert!(!scratch.join("wd-rel").exists() && !scratch.join("~").exists());
        assert_eq!(status(), before, "{workdir}: the checkout changed");
        assert_eq!(
            worktrees(),
            listed,
            "{workdir}: a worktree was left registered"
        );
    }
}

#[test]
fn a_repro_whose_interpreter_is_missing_is_the_machines_failure_not_the_commits() {
    // `python` missing from PATH: the shell exits 127. No commit is judged on it.
    let repo = linear(
        8,
        5,
        "#!/bin/sh\nexec python-missing-from-path train.py\n",
        CONFIG,
    );
    let (code, report, err) = start(&repo, &["v1..main", "--no-shrink"]);
    assert_eq!(code, 8, "{err}");
    let text = format!("{err}{}", serde_json::to_string(&report).unwrap());
    assert!(text.contains("could not start"), "{text}");
    assert!(!text.contains("does not pass"), "{text}");
    assert!(rep(&report).first_bad.is_none(), "{report:#?}");
}

/// The user's Python environment as pip sees it, and whether `mylib` imports from it.
fn python_env() -> (String, bool) {
    let list = Command::new("python3")
        .args(["-m", "pip", "list", "--format=freeze"])
        .output()
        .unwrap();
    let imports = Command::new("python3")
        .args(["-c", "import mylib"])
        .current_dir(std::env::temp_dir())
        .output()
        .unwrap()
        .status
        .success();
    (String::from_utf8_lossy(&list.stdout).into_owned(), imports)
}

/// A Python project's history at `path`: `files`, and `mylib/__init__.py` saying `VALUE = i` at commit i
/// (1..=`commits`, "commit i"); the first is tagged v1.
fn mylib_history(path: &Path, commits: u32, files: &[(&str, &str)]) {
    std::fs::create_dir_all(path.join("mylib")).unwrap();
    git(path, &["init", "-q", "-b", "main", "."]);
    for (name, text) in files {
        std::fs::write(path.join(name), text).unwrap();
    }
    for i in 1..=commits {
        std::fs::write(path.join("mylib/__init__.py"), format!("VALUE = {i}\n")).unwrap();
        git(path, &["add", "-A"]);
        git(path, &["commit", "-q", "-m", &format!("commit {i}")]);
        if i == 1 {
            git(path, &["tag", "v1"]);
        }
    }
}

#[test]
fn a_pip_install_build_goes_into_a_virtual_environment_per_worktree_not_the_users() {
    let tmp = tempfile::tempdir().unwrap();
    let path = tmp.path().join("repo");
    mylib_history(
        &path,
        10,
        &[
            (
                "pyproject.toml",
                "[build-system]\nrequires = [\"setuptools\"]\nbuild-backend = \"setuptools.build_meta\"\n\n[project]\nname = \"mylib-cudabisect-venv-test\"\nversion = \"0.1\"\n\n[tool.setuptools]\npackages = [\"mylib\"]\n",
            ),
            // The repro checks it runs its own worktree's package, as an import of the installed name.
            (
                "repro.py",
                "import os, mylib\nhere = os.path.realpath(os.environ['CUDABISECT_WORKTREE'])\nassert os.path.realpath(mylib.__file__).startswith(here), (mylib.__file__, here)\nif mylib.VALUE >= 6:\n    raise RuntimeError('CUDA error: an illegal memory access was encountered')\n",
            ),
        ],
    );
    let config = tmp.path().join("bisect.toml");
    std::fs::write(
        &config,
        "[build]\ncommand = \"pip install -e . --no-deps --no-build-isolation -q\"\ntimeout = \"5m\"\n\n[repro]\ncommand = \"python3 repro.py\"\n\n[triage]\nenabled = false\n",
    )
    .unwrap();
    let before = python_env();
    assert!(!before.1, "mylib is importable before the run");
    let out = Command::new(crate::common::bin())
        .args([
            "start",
            "v1..main",
            "--no-shrink",
            "--jobs",
            "2",
            "--config",
        ])
        .arg(&config)
        .arg("-C")
        .arg(&path)
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(0), "{stdout}\n{stderr}");
    assert!(stdout.contains("commit 6"), "{stdout}");
    assert!(
        !stderr.contains("another bug") && !stderr.contains("disturbed each other"),
        "{stderr}"
    );
    assert_eq!(
        python_env(),
        before,
        "the user's Python environment changed"
    );
}

/// A user who runs cudabisect from their own virtual environment: the worktree's environment is layered
/// over theirs (what only their environment has stays importable), not over the base interpreter's.
#[test]
fn a_worktree_environment_sees_the_packages_of_the_users_own_virtual_environment() {
    let tmp = tempfile::tempdir().unwrap();
    let user_env = tmp.path().join("user-env");
    let made = Command::new("python3")
        .args(["-m", "venv", "--system-site-packages", "--without-pip"])
        .arg(&user_env)
        .status()
        .unwrap();
    assert!(made.success());
    let purelib = Command::new(user_env.join("bin/python3"))
        .args([
            "-c",
            "import sysconfig; print(sysconfig.get_paths()['purelib'])",
        ])
        .output()
        .unwrap();
    let purelib = std::path::PathBuf::from(String::from_utf8_lossy(&purelib.stdout).trim());
    std::fs::write(purelib.join("only_in_the_users_env.py"), "LIMIT = 6\n").unwrap();
    let path = tmp.path().join("repo");
    mylib_history(
        &path,
        8,
        &[(
            "repro.py",
            "import mylib, only_in_the_users_env\nif mylib.VALUE >= only_in_the_users_env.LIMIT:\n    raise RuntimeError('CUDA error: an illegal memory access was encountered')\n",
        )],
    );
    let config = tmp.path().join("bisect.toml");
    std::fs::write(
        &config,
        // Any build with `venv = true` gets the worktree's environment; this one needs nothing installed
        // (no setuptools in the user's environment is assumed).
        "[build]\ncommand = \"true\"\nvenv = true\n\n[repro]\ncommand = \"python3 repro.py\"\n\n[triage]\nenabled = false\n",
    )
    .unwrap();
    let path_var = format!(
        "{}:{}",
        user_env.join("bin").display(),
        std::env::var("PATH").unwrap_or_default()
    );
    let out = Command::new(crate::common::bin())
        .args([
            "start",
            "v1..main",
            "--no-shrink",
            "--jobs",
            "1",
            "--config",
        ])
        .arg(&config)
        .arg("-C")
        .arg(&path)
        .env("PATH", path_var)
        .env("VIRTUAL_ENV", &user_env)
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(0), "{stdout}\n{stderr}");
    assert!(stdout.contains("commit 6"), "{stdout}");
    // The repro ran in the worktree's environment, not the user's.
    let venvs = std::fs::read_dir(path.join(".git/cudabisect"))
        .unwrap()
        .flatten()
        .filter(|e| e.file_name().to_string_lossy().ends_with(".venv"))
        .count();
    assert!(venvs >= 1, "no worktree environment was made");
}

#[test]
fn what_cannot_work_is_refused_up_front_with_a_line_that_names_the_real_problem() {
    let repo = linear(8, 5, &default_repro(), CONFIG);
    let config = repo.scratch.join("bisect.toml");
    std::fs::write(repo.path.join("myrepro.sh"), "#!/bin/sh\nexit 0\n").unwrap();
    std::fs::write(repo.path.join("train_step.py"), "print(1)\n").unwrap();
    let refused = |text: &str, says: &str| {
        std::fs::write(&config, text).unwrap();
        let (code, report, err) = start(&repo, &["v1..main", "--no-shrink"]);
        assert_eq!(code, 2, "{text}: {err}");
        assert_eq!(err.lines().count(), 1, "{err}");
        assert!(err.contains(says), "{text}: {err}");
        assert!(report.is_none(), "{report:#?}");
    };
    // Scripts left untracked in the checkout: the commits do not have them (C27, C28).
    let untracked = "it is in your checkout but not in the commit";
    refused("[repro]\ncommand = \"./myrepro.sh\"\n", untracked);
    refused(
        "[repro]\ncommand = \"python3 train_step.py --steps 2\"\n",
        untracked,
    );
    refused(
        "[repro]\ncommand = [\"python3\", \"train_step.py\"]\n",
        untracked,
    );
    // A sub-second limit is a typo (C07); a repro key is named by its own section (CT04a).
    refused(
        "[build]\ncommand = \"true\"\ntimeout = \"1ns\"\n[repro]\ncommand = \"./repro.sh\"\n",
        "would stop every command before it started",
    );
    std::fs::write(&config, "[repro]\ncommand = \"./repro.sh\"\ngpus = 0\n").unwrap();
    let (_, _, err) = start(&repo, &["v1..main", "--no-shrink"]);
    assert!(err.contains(": [repro] gpus must be at least 1"), "{err}");
    assert!(!err.contains("[search] [repro]"), "{err}");
    // The state directory a file (L04): named as what it is, not as the lock.
    std::fs::write(&config, CONFIG).unwrap();
    let state = repo.path.join(".git/cudabisect");
    let _ = std::fs::remove_dir_all(&state);
    std::fs::write(&state, "x").unwrap();
    let (code, _, err) = start(&repo, &["v1..main", "--no-shrink"]);
    assert_eq!(code, 2, "{err}");
    assert!(err.contains("cudabisect is not a directory"), "{err}");
    assert!(!err.contains("lock"), "{err}");
    std::fs::remove_file(&state).unwrap();
    // The checkout's own repro by its absolute path runs that copy at every commit (C26): said.
    let own = repo.path.join("repro.sh");
    std::fs::write(&config, CONFIG.replace("./repro.sh", own.to_str().unwrap())).unwrap();
    let (code, _, err) = start(&repo, &["v1..main", "--no-shrink"]);
    assert_eq!(code, 0, "{err}");
    assert!(err.contains("your checkout's own copy"), "{err}");
    // `demo --dir` an empty file (M02).
    let file = repo.scratch.join("empty");
    std::fs::write(&file, "").unwrap();
    let out = Command::new(crate::common::bin())
        .args(["demo", "--dir"])
        .arg(&file)
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{err}");
    assert!(err.contains("exists and is not a directory"), "{err}");
}

#[test]
fn a_repro_that_writes_into_the_users_checkout_or_tags_is_noticed_and_said() {
    // D06: the repro reaches the user's repository through `../..` and the shared refs.
    let template = format!(
        "#!/bin/sh\necho probe >> \"$CUDABISECT_WORKTREE/../../../notes.txt\"\ngit -C \"$CUDABISECT_WORKTREE/../../..\" tag -f \"probe-$(cat version.txt)\" >/dev/null 2>&1\nV=$(cat version.txt)\nif [ \"$V\" -ge @BAD@ ]; then {FAULT}; fi\nexit 0\n"
    );
    let repo = linear(8, 5, &template, CONFIG);
    std::fs::write(repo.path.join("notes.txt"), "mine\n").unwrap();
    let (code, report, err) = start(&repo, &["v1..main", "--no-shrink"]);
    assert_eq!(code, 0, "{err}");
    assert!(
        err.contains("your repository changed during this run"),
        "{err}"
    );
    assert!(err.contains("refs/tags/probe-"), "{err}");
    assert!(err.contains("notes.txt"), "{err}");
    assert!(
        rep(&report)
            .notes
            .iter()
            .any(|n| n.contains("refs/tags/probe-")),
        "{report:#?}"
    );
    // A run whose repro stays in its worktree says nothing of the kind.
    let clean = linear(8, 5, &default_repro(), CONFIG);
    std::fs::write(clean.path.join("untracked.txt"), "mine\n").unwrap();
    let (code, _, err) = start(&clean, &["v1..main", "--no-shrink"]);
    assert_eq!(code, 0, "{err}");
    assert!(!err.contains("your repository changed"), "{err}");
}
