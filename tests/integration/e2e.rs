//! End-to-end tests: real git repositories built with git2, the real binary, and a scripted fake repro that
//! prints recorded GPU failure logs (fault, clean, crash by signal, hang, build break, infra then fault).

use std::path::{Path, PathBuf};
use std::process::Command;

use crate::common::repo_builder::{put, Files, RepoBuilder};
use cudabisect::classify::FaultClass;
use cudabisect::report::environment::Environment;
use cudabisect::report::event::{Event, Stage};
use cudabisect::report::json::Envelope;
use cudabisect::report::record::{
    ProbeRecord, ProbeRole, Report, RunResult, SanitizerTool, TriageStatus, Verdict,
};
use git2::Oid;
use serde_json::Value;

const REPRO: &str = include_str!("fakes/e2e_repro.sh");

const BUILD: &str = "#!/bin/sh\nif grep -q broken build.txt; then echo 'error: expected ;' >&2; exit 2; fi\necho built\n";

fn fixtures() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("fixtures/logs")
}

fn config(extra: &str) -> String {
    format!(
        "[build]\ncommand = [\"./build.sh\"]\ntimeout = \"30s\"\n\n[repro]\ncommand = [\"./repro.sh\"]\ntimeout = \"60s\"\ngrace-period = \"200ms\"\nenv = {{ FIXTURES = \"{}\" }}\n\n[triage]\nenabled = false\n{extra}",
        fixtures().display()
    )
}

/// A config whose repro times out after 2 s, for tests whose hangs must end quickly (the committed
/// bisect.toml gives clean probes a generous 60 s, so a loaded machine never turns them into hangs).
fn short_timeout_config(repo: &TestRepo) -> String {
    let path = repo.path.parent().unwrap().join("short.toml");
    std::fs::write(
        &path,
        config("").replace("timeout = \"60s\"\ngrace", "timeout = \"2s\"\ngrace"),
    )
    .unwrap();
    path.display().to_string()
}

fn files(mode: &str, builds: bool, i: usize) -> Files {
    let mut f = Files::new();
    put(&mut f, "repro.sh", REPRO, true);
    put(&mut f, "build.sh", BUILD, true);
    put(&mut f, "mode.txt", mode, false);
    put(
        &mut f,
        "build.txt",
        if builds { "ok" } else { "broken" },
        false,
    );
    put(&mut f, "src.txt", format!("revision {i}\n"), false);
    put(&mut f, "bisect.toml", config(""), false);
    f
}

/// A repository under a temp dir with one commit per mode; returns the builder dir and commit ids.
struct TestRepo {
    _tmp: tempfile::TempDir,
    path: PathBuf,
    commits: Vec<Oid>,
}

fn linear(modes: &[(&str, bool)]) -> TestRepo {
    let tmp = tempfile::tempdir().unwrap();
    let path = tmp.path().join("repo");
    let mut b = RepoBuilder::init(&path).unwrap();
    let mut commits = Vec::new();
    for (i, (mode, builds)) in modes.iter().enumerate() {
        let parents: Vec<Oid> = commits.last().copied().into_iter().collect();
        commits.push(
            b.commit(&parents, &files(mode, *builds, i), &format!("commit {i}"))
                .unwrap(),
        );
    }
    b.set_branch("main", *commits.last().unwrap()).unwrap();
    b.checkout_main().unwrap();
    TestRepo {
        _tmp: tmp,
        path,
        commits,
    }
}

/// `n` commits that build; those from `first_bad` on fault.
fn faulting_from(n: usize, first_bad: usize) -> TestRepo {
    linear(&modes(n, |i| {
        if i >= first_bad {
            ("fault", true)
        } else {
            ("clean", true)
        }
    }))
}

fn modes(n: usize, f: impl Fn(usize) -> (&'static str, bool)) -> Vec<(&'static str, bool)> {
    (0..n).map(f).collect()
}

struct Run {
    code: i32,
    stdout: String,
    stderr: String,
    report: Option<Report>,
}

fn cudabisect(dir: &Path, args: &[&str]) -> Run {
    let (out, report) =
        crate::common::start_with_report(dir, args, &dir.parent().unwrap().join("report.json"));
    Run {
        code: out.status.code().unwrap_or(-1),
        stdout: String::from_utf8_lossy(&out.stdout).into(),
        stderr: String::from_utf8_lossy(&out.stderr).into(),
        report,
    }
}

/// `start <first commit>..main --config CONFIG EXTRA…` on `repo`.
fn start_with_config(repo: &TestRepo, config: impl AsRef<Path>, extra: &[&str]) -> Run {
    let range = format!("{}..main", repo.commits[0]);
    let config = config.as_ref().display().to_string();
    let mut args = vec![range.as_str(), "--config", config.as_str()];
    args.extend_from_slice(extra);
    cudabisect(&repo.path, &args)
}

/// The record of the probe of `commit`, which the caller expects.
fn probe_of(report: &Report, commit: Oid) -> &ProbeRecord {
    report
        .probes
        .iter()
        .find(|p| p.commit == commit.to_string())
        .unwrap_or_else(|| panic!("{commit} was not probed: {report:#?}"))
}

fn first_bad(run: &Run) -> String {
    let report = run
        .report
        .as_ref()
        .unwrap_or_else(|| panic!("no report: {}", run.stderr));
    crate::common::first_bad(report).unwrap_or_else(|| panic!("no first_bad: {report:#?}"))
}

fn search_probes(run: &Run) -> usize {
    run.report
        .as_ref()
        .unwrap()
        .probes
        .iter()
        .filter(|p| p.role == ProbeRole::Search)
        .count()
}

/// Everything about the user's checkout that must survive a run, byte for byte.
fn snapshot(path: &Path) -> Vec<(String, Vec<u8>)> {
    let mut out = Vec::new();
    let git = path.join(".git");
    for name in [
        "HEAD",
        "index",
        "refs/heads/main",
        "logs/refs/stash",
        "refs/stash",
    ] {
        out.push((
            name.to_string(),
            std::fs::read(git.join(name)).unwrap_or_default(),
        ));
    }
    // Every file and directory of the working tree, recursively, ignored ones included; and every ref,
    // log and config file of the git directory except cudabisect's own state directory.
    fn walk(root: &Path, dir: &Path, skip: &[&Path], out: &mut Vec<(String, Vec<u8>)>) {
        let mut entries: Vec<_> = std::fs::read_dir(dir)
            .unwrap()
            .map(|e| e.unwrap())
            .collect();
        entries.sort_by_key(|e| e.file_name());
        for entry in entries {
            let p = entry.path();
            if skip.iter().any(|s| p.starts_with(s)) {
                continue;
            }
            let rel = p.strip_prefix(root).unwrap().display().to_string();
            let kind = entry.file_type().unwrap();
            if kind.is_dir() {
                out.push((format!("{rel}/"), Vec::new()));
                walk(root, &p, skip, out);
            } else if kind.is_file() {
                out.push((rel, std::fs::read(&p).unwrap()));
            }
        }
    }
    // The objects may gain nothing either, but packs and loose objects are not compared byte for byte:
    // git itself may repack. Worktree bookkeeping (`.git/worktrees`) must be gone after the run.
    walk(
        path,
        path,
        &[&git.join("cudabisect"), &git.join("objects")],
        &mut out,
    );
    out.sort();
    let repo = git2::Repository::open(path).unwrap();
    let branches: Vec<String> = repo
        .branches(None)
        .unwrap()
        .map(|b| b.unwrap().0.name().unwrap().unwrap().to_string())
        .collect();
    out.push(("branches".into(), branches.join(",").into_bytes()));
    out
}

#[test]
fn linear_history_finds_the_culprit_and_leaves_the_checkout_alone() {
    let repo = faulting_from(40, 23);
    // A dirty checkout: a modified tracked file, an untracked file, an ignored-looking file, and a stash.
    std::fs::write(repo.path.join("src.txt"), "local edit\n").unwrap();
    {
        let mut r = git2::Repository::open(&repo.path).unwrap();
        let sig = git2::Signature::now("u", "u@x").unwrap();
        r.stash_save(&sig, "wip", None).unwrap();
    }
    std::fs::write(repo.path.join("src.txt"), "another local edit\n").unwrap();
    std::fs::write(repo.path.join("untracked.txt"), "mine\n").unwrap();
    let before = snapshot(&repo.path);
    let good = repo.commits[0].to_string();
    let run = cudabisect(&repo.path, &[&format!("{good}..main")]);
    assert_eq!(run.code, 0, "{}", run.stderr);
    assert_eq!(first_bad(&run), repo.commits[23].to_string());
    assert!(run
        .stdout
        .contains(&format!("First bad commit: {}", repo.commits[23])));
    assert!(
        search_probes(&run) <= 6 + 1,
        "39 candidates need at most ⌈log2 39⌉+1 probes"
    );
    let report = run.report.unwrap();
    assert_eq!(report.format_version, 1);
    assert_eq!(report.result, RunResult::Found);
    assert_eq!(report.first_bad.as_ref().unwrap().subject, "commit 23");
    assert_eq!(
        report.target.as_ref().map(|t| t.class),
        Some(FaultClass::IllegalAddress)
    );
    assert!(report.launch_blocking);
    // The wire format itself: a probe's keys are written even when empty (a typed read would take a
    // missing optional key for null).
    let raw: Value = serde_json::from_str(
        &std::fs::read_to_string(repo.path.parent().unwrap().join("report.json")).unwrap(),
    )
    .unwrap();
    let probe = &raw["probes"][0];
    for key in [
        "commit",
        "verdict",
        "signature",
        "exit_code",
        "signal",
        "duration_s",
        "log",
    ] {
        assert!(probe.get(key).is_some(), "probe lacks {key}");
    }
    let probe = &report.probes[0];
    assert_eq!(probe.exit_code, Some(42));
    assert!(Path::new(probe.log.as_deref().unwrap()).is_file());
    assert_eq!(snapshot(&repo.path), before, "the user's checkout changed");
    let r = git2::Repository::open(&repo.path).unwrap();
    assert!(
        r.worktrees().unwrap().is_empty(),
        "a worktree was left registered"
    );
}

#[test]
fn merge_history_finds_a_culprit_on_a_side_branch() {
    let tmp = tempfile::tempdir().unwrap();
    let path = tmp.path().join("repo");
    let mut b = RepoBuilder::init(&path).unwrap();
    let mut head = b.commit(&[], &files("clean", true, 0), "root").unwrap();
    let root = head;
    let mut culprit = None;
    let mut bad_now = false;
    for round in 0..6 {
        let mut side = head;
        for j in 0..4 {
            let planted = round == 3 && j == 2;
            let mode = if bad_now || planted || culprit.is_some() {
                "fault"
            } else {
                "clean"
            };
            side = b
                .commit(
                    &[side],
                    &files(mode, true, round * 10 + j),
                    &format!("side {round}.{j}"),
                )
                .unwrap();
            if planted {
                culprit = Some(side);
            }
        }
        for j in 0..3 {
            let mode = if bad_now { "fault" } else { "clean" };
            head = b
                .commit(
                    &[head],
                    &files(mode, true, round * 10 + 5 + j),
                    &format!("main {round}.{j}"),
                )
                .unwrap();
        }
        bad_now |= culprit.is_some();
        let mode = if bad_now { "fault" } else { "clean" };
        head = b
            .commit(
                &[head, side],
                &files(mode, true, round * 10 + 9),
                &format!("merge {round}"),
            )
            .unwrap();
    }
    b.set_branch("main", head).unwrap();
    b.checkout_main().unwrap();
    let run = cudabisect(&path, &[&format!("{root}..main")]);
    assert_eq!(run.code, 0, "{}", run.stderr);
    assert_eq!(first_bad(&run), culprit.unwrap().to_string());
}

#[test]
fn build_breaks_other_bugs_crashes_and_hangs_are_skipped_not_blamed() {
    // Culprit 30. Before it: a run of broken builds, an unrelated OOM, a segfault, a hang and an abort.
    let repo = linear(&modes(48, |i| match i {
        10..=14 => ("clean", false),
        16..=19 => ("oom", true),
        21 => ("segv", true),
        24 => ("hang", true),
        27 => ("abort", true),
        28 => ("mismatch", true),
        30.. => ("fault", true),
        _ => ("clean", true),
    }));
    let short = short_timeout_config(&repo);
    let run = start_with_config(&repo, &short, &[]);
    assert_eq!(run.code, 0, "{}\n{}", run.stderr, run.stdout);
    assert_eq!(first_bad(&run), repo.commits[30].to_string());
    let report = run.report.unwrap();
    for p in &report.probes {
        let expected = match p.signature.class {
            FaultClass::None => Verdict::Good,
            FaultClass::IllegalAddress => Verdict::Bad,
            _ => Verdict::Skip,
        };
        assert_eq!(p.verdict, expected, "{p:#?}");
        if expected == Verdict::Skip {
            assert!(p.reason.is_some());
        }
    }
}

#[test]
fn crashes_hangs_and_build_breaks_report_their_own_outcomes() {
    // Every non-endpoint commit misbehaves; the search must skip them all and end ambiguous.
    let repo = linear(&[
        ("clean", true),
        ("segv", true),
        ("hang", true),
        ("clean", false),
        ("oom", true),
        ("fault", true),
    ]);
    let short = short_timeout_config(&repo);
    let run = start_with_config(&repo, &short, &[]);
    assert_eq!(run.code, 4, "{}", run.stderr);
    let report = run.report.unwrap();
    assert_eq!(report.result, RunResult::Ambiguous);
    let outcomes: std::collections::BTreeMap<String, (FaultClass, Option<i32>)> = report
        .probes
        .iter()
        .map(|p| (p.commit.clone(), (p.signature.class, p.signal)))
        .collect();
    assert_eq!(
        outcomes[&repo.commits[1].to_string()],
        (FaultClass::Signal, Some(11))
    );
    assert_eq!(outcomes[&repo.commits[2].to_string()].0, FaultClass::Hang);
    assert_eq!(
        outcomes[&repo.commits[3].to_string()].0,
        FaultClass::BuildFailure
    );
    assert_eq!(
        outcomes[&repo.commits[4].to_string()].0,
        FaultClass::OutOfMemory
    );
    assert_eq!(report.candidates.len(), 5);
}

#[test]
fn infrastructure_failures_are_retried_and_env_contract_holds() {
    let repo = linear(&modes(12, |i| match i {
        0..=5 => ("clean", true),
        6 => ("infra-then-fault", true),
        _ => ("fault", true),
    }));
    let run = cudabisect(&repo.path, &[&format!("{}..main", repo.commits[0])]);
    assert_eq!(run.code, 0, "{}", run.stderr);
    assert_eq!(first_bad(&run), repo.commits[6].to_string());
    let report = run.report.unwrap();
    let probe = probe_of(&report, repo.commits[6]);
    assert_eq!(probe.attempts, 2);

    let repo = linear(&[("clean", true), ("env", true), ("fault", true)]);
    let run = cudabisect(
        &repo.path,
        &[&format!("{}..main", repo.commits[0]), "--keep-worktree"],
    );
    let report = run.report.unwrap();
    let probe = probe_of(&report, repo.commits[1]);
    let log = std::fs::read_to_string(probe.log.as_deref().unwrap()).unwrap();
    assert!(log.contains("CUDA_LAUNCH_BLOCKING=1"), "{log}");
    assert!(
        log.contains(&format!("CUDABISECT_COMMIT={}", repo.commits[1])),
        "{log}"
    );
    assert!(log.contains("CUDABISECT_WORKTREE=/"), "{log}");
    let r = git2::Repository::open(&repo.path).unwrap();
    assert_eq!(r.worktrees().unwrap().len(), 1, "--keep-worktree keeps it");
}

#[test]
fn flaky_faults_are_caught_with_repro_attempts() {
    let repo = linear(&modes(12, |i| {
        (if i < 6 { "clean" } else { "flaky" }, true)
    }));
    let range = format!("{}..main", repo.commits[0]);
    // One run per probe: the flaky bad end looks clean, so nothing can be bisected.
    let run = cudabisect(&repo.path, &[&range]);
    assert_eq!(run.code, 3, "{}", run.stdout);
    // Three runs per probe before calling it clean: the fault is caught and the culprit found.
    let cfg = repo.path.parent().unwrap().join("flaky.toml");
    std::fs::write(
        &cfg,
        config("").replace("[repro]\n", "[repro]\nattempts = 3\n"),
    )
    .unwrap();
    let run = cudabisect(&repo.path, &[&range, "--config", cfg.to_str().unwrap()]);
    assert_eq!(run.code, 0, "{}", run.stderr);
    assert_eq!(first_bad(&run), repo.commits[6].to_string());
    let report = run.report.unwrap();
    for p in &report.probes {
        let want = if p.verdict == Verdict::Bad { 2 } else { 3 };
        assert_eq!(p.attempts, want, "{p:#?}");
    }
}

#[test]
fn invalid_endpoints_stop_with_code_3() {
    let repo = linear(&[("clean", true), ("clean", true), ("clean", true)]);
    let run = cudabisect(&repo.path, &[&format!("{}..main", repo.commits[0])]);
    assert_eq!(run.code, 3);
    assert!(run.stdout.contains("does not reproduce"), "{}", run.stdout);
    assert_eq!(run.report.unwrap().result, RunResult::EndpointsInvalid);

    let repo = linear(&[("fault", true), ("fault", true), ("fault", true)]);
    let run = cudabisect(&repo.path, &[&format!("{}..main", repo.commits[0])]);
    assert_eq!(run.code, 3);
    assert!(run.stdout.contains("does not pass"), "{}", run.stdout);
}

#[test]
fn several_good_commits_narrow_the_range() {
    let repo = faulting_from(30, 20);
    let run = cudabisect(
        &repo.path,
        &[
            &format!("{}..main", repo.commits[0]),
            "--good",
            &repo.commits[15].to_string(),
        ],
    );
    assert_eq!(run.code, 0, "{}", run.stderr);
    assert_eq!(first_bad(&run), repo.commits[20].to_string());
    let report = run.report.unwrap();
    assert_eq!(report.range_size, 14);
    // c0 is an ancestor of c15: implied good, not built and run again.
    let good_probes: Vec<&str> = report
        .probes
        .iter()
        .filter(|p| p.role == ProbeRole::GoodEndpoint)
        .map(|p| p.commit.as_str())
        .collect();
    assert_eq!(good_probes, [repo.commits[15].to_string()]);
    assert!(
        report.notes[0].contains("implied by good commit"),
        "{report:#?}"
    );
}

#[test]
fn bad_input_gets_one_line_code_2_and_writes_nothing() {
    let repo = linear(&[("clean", true), ("clean", true), ("fault", true)]);
    let good = repo.commits[0].to_string();
    let bad = repo.commits[2].to_string();
    let no_repo = tempfile::tempdir().unwrap();
    let missing_config = repo.path.parent().unwrap().join("nope.toml");
    let bad_command = repo.path.parent().unwrap().join("badcmd.toml");
    std::fs::write(
        &bad_command,
        "[repro]\ncommand = [\"./no-such-script.sh\"]\n",
    )
    .unwrap();
    let typo = repo.path.parent().unwrap().join("typo.toml");
    std::fs::write(&typo, "[repro]\ncomand = \"x\"\n").unwrap();
    let not_on_path = repo.path.parent().unwrap().join("nopath.toml");
    std::fs::write(
        &not_on_path,
        "[repro]\ncommand = [\"cudabisect-no-such-program\"]\n",
    )
    .unwrap();
    let missing_model = repo.path.parent().unwrap().join("nomodel.toml");
    std::fs::write(
        &missing_model,
        config("\n[shrink]\nmodel = \"models/model.toml\"\n"),
    )
    .unwrap();
    let cases: Vec<(Vec<String>, PathBuf, &str)> = vec![
        (
            vec![
                format!("{good}..main"),
                "--config".into(),
                missing_model.display().to_string(),
            ],
            repo.path.clone(),
            "[shrink] model `models/model.toml` does not exist at the bad commit",
        ),
        (
            vec![format!("{good}..nosuchrev")],
            repo.path.clone(),
            "unknown revision `nosuchrev`",
        ),
        (
            vec![format!("{bad}..{good}")],
            repo.path.clone(),
            "is the range reversed?",
        ),
        (
            vec![format!("{good}..{good}")],
            repo.path.clone(),
            "same commit",
        ),
        (vec!["main".into()], repo.path.clone(), "expected GOOD..BAD"),
        (
            vec![format!("{good}..main")],
            no_repo.path().to_path_buf(),
            "is not a git repository",
        ),
        (
            vec![
                format!("{good}..main"),
                "--config".into(),
                missing_config.display().to_string(),
            ],
            repo.path.clone(),
            "cannot read config",
        ),
        (
            vec![
                format!("{good}..main"),
                "--config".into(),
                bad_command.display().to_string(),
            ],
            repo.path.clone(),
            "does not exist at the bad commit",
        ),
        (
            vec![
                format!("{good}..main"),
                "--config".into(),
                typo.display().to_string(),
            ],
            repo.path.clone(),
            "typo.toml:2:1: unknown field `comand`",
        ),
        (
            vec![
                format!("{good}..main"),
                "--config".into(),
                not_on_path.display().to_string(),
            ],
            repo.path.clone(),
            "is not on PATH",
        ),
    ];
    for (args, dir, expected) in cases {
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        let out = Command::new(env!("CARGO_BIN_EXE_cudabisect"))
            .arg("start")
            .args(&args)
            .arg("-C")
            .arg(&dir)
            .output()
            .unwrap();
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{args:?}: {stderr}");
        assert!(stderr.contains(expected), "{args:?}: {stderr}");
        assert_eq!(stderr.trim().lines().count(), 1, "{args:?}: {stderr}");
        assert!(out.stdout.is_empty());
        assert!(
            !repo.path.join(".git/cudabisect").exists(),
            "{args:?} wrote state"
        );
    }
}

#[test]
fn json_lines_stream_has_versioned_events() {
    let repo = faulting_from(8, 5);
    let out = Command::new(env!("CARGO_BIN_EXE_cudabisect"))
        .args([
            "start",
            &format!("{}..main", repo.commits[0]),
            "--message-format",
            "json",
            "-C",
        ])
        .arg(&repo.path)
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(0));
    // Every line is one typed event in its envelope.
    let events: Vec<Envelope> = String::from_utf8_lossy(&out.stdout)
        .lines()
        .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("{e}: {l}")))
        .collect();
    assert!(events.iter().all(|e| e.format_version == 1));
    assert!(matches!(
        events[0].event,
        Event::RunStarted { candidates: 7, .. }
    ));
    let finished: Vec<&Report> = events
        .iter()
        .filter_map(|e| match &e.event {
            Event::Finished { report } => Some(report.as_ref()),
            _ => None,
        })
        .collect();
    assert_eq!(finished.len(), 1, "one finished event");
    assert!(matches!(
        events.last().unwrap().event,
        Event::Finished { .. }
    ));
    let report = finished[0];
    assert_eq!(report.result, RunResult::Found);
    assert_eq!(
        report.first_bad.as_ref().unwrap().commit,
        repo.commits[5].to_string()
    );
    let probes = events
        .iter()
        .filter(|e| matches!(e.event, Event::ProbeFinished { .. }))
        .count();
    assert_eq!(probes, report.probes.len());
    // The bundle is announced with its size, before the end: the same directory the report names.
    let written: Vec<(&String, u64)> = events
        .iter()
        .filter_map(|e| match &e.event {
            Event::BundleWritten { path, bytes } => Some((path, *bytes)),
            _ => None,
        })
        .collect();
    assert_eq!(written.len(), 1, "one bundle_written event");
    assert_eq!(Some(written[0].0), report.bundle.as_ref());
    let on_disk = cudabisect::report::bundle::dir_bytes(std::path::Path::new(written[0].0));
    assert!(
        written[0].1 > 0 && written[0].1 <= on_disk,
        "{} of {on_disk}",
        written[0].1
    );
}

/// A stand-in for compute-sanitizer that replays a recorded H200 report for the tool it is asked for:
/// memcheck finds nothing, racecheck reports the recorded race. Exercises the escalation end to end.
const FAKE_SANITIZER: &str = include_str!("fakes/e2e_fake_sanitizer.sh");

#[test]
fn start_triages_the_first_bad_commit_and_escalates_past_memcheck() {
    let repo = faulting_from(6, 3);
    let dir = repo.path.parent().unwrap();
    let fake = dir.join("compute-sanitizer");
    std::fs::write(&fake, FAKE_SANITIZER).unwrap();
    std::fs::set_permissions(&fake, std::os::unix::fs::PermissionsExt::from_mode(0o755)).unwrap();
    let calls = dir.join("calls.txt");
    let config_path = dir.join("triage.toml");
    // FIXTURES, which the stand-in reads its recorded report from, is set by `[repro] env` alone: the
    // sanitized run is of the repro, in the repro's environment with `[triage] env` over it.
    let text = config("").replace("[triage]\nenabled = false\n", "")
        + &format!(
            "[triage]\nsanitizer = \"{}\"\nenv = {{ FAKE_SANITIZER_CALLS = \"{}\" }}\n",
            fake.display(),
            calls.display(),
        );
    std::fs::write(&config_path, text).unwrap();
    let run = start_with_config(&repo, &config_path, &[]);
    assert_eq!(run.code, 0, "{}", run.stderr);
    let report = run.report.unwrap();
    let triage = report.triage.as_ref().expect("triage ran");
    assert_eq!(triage.status, TriageStatus::Found, "{triage:#?}");
    assert_eq!(
        triage.tools_run,
        [SanitizerTool::Memcheck, SanitizerTool::Racecheck]
    );
    let found = triage.signature.as_ref().expect("a signature");
    assert_eq!(found.class, FaultClass::Race);
    assert_eq!(found.kernel.as_deref(), Some("shared_race"));
    assert!(
        run.stdout
            .contains("Triage: racecheck: Race in shared_race"),
        "{}",
        run.stdout
    );
    let calls = std::fs::read_to_string(calls).unwrap();
    assert!(
        calls.starts_with("memcheck ") && calls.contains("repro.sh"),
        "{calls}"
    );
    // `--message-format json` is JSON Lines on triage, log and bundle pack as on start: every stdout line
    // one envelope, the last carrying the result.
    let json_lines = |args: &[&str]| -> Vec<Event> {
        let out = Command::new(env!("CARGO_BIN_EXE_cudabisect"))
            .args(args)
            .arg("--message-format")
            .arg("json")
            .output()
            .unwrap();
        let text = String::from_utf8_lossy(&out.stdout).into_owned();
        assert!(
            !text.trim().is_empty(),
            "{args:?}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        assert!(text.lines().all(|l| l.starts_with('{')), "{args:?}: {text}");
        crate::common::events(&text)
    };
    let repo_dir = repo.path.display().to_string();
    let config = config_path.display().to_string();
    let lines = json_lines(&["triage", "-C", &repo_dir, "--config", &config]);
    let last = lines.last().unwrap();
    assert!(
        matches!(last, Event::TriageDone { result } if result.status == TriageStatus::Found),
        "{last:?}"
    );
    let lines = json_lines(&["log", "-C", &repo_dir]);
    assert_eq!(lines.len(), 1);
    let Event::Finished { report: logged } = &lines[0] else {
        panic!("{:?}", lines[0])
    };
    assert_eq!(
        crate::common::first_bad(logged),
        crate::common::first_bad(&report)
    );
    let bundle = report.bundle.clone().unwrap();
    let lines = json_lines(&["bundle", "pack", &bundle]);
    assert_eq!(lines.len(), 1);
    assert!(
        matches!(lines[0], Event::BundlePacked { bytes, .. } if bytes > 0),
        "{:?}",
        lines[0]
    );
}

#[test]
fn triage_without_compute_sanitizer_says_what_is_missing() {
    // A configured path that is not there: the same answer on every machine, with or without CUDA.
    let tmp = tempfile::tempdir().unwrap();
    git2::Repository::init(tmp.path()).unwrap();
    let config = tmp.path().join("bisect.toml");
    std::fs::write(
        &config,
        "[repro]\ncommand = [\"true\"]\n[triage]\nsanitizer = \"/nonexistent/compute-sanitizer\"\n",
    )
    .unwrap();
    let out = Command::new(env!("CARGO_BIN_EXE_cudabisect"))
        .args(["triage", "-C"])
        .arg(tmp.path())
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(6), "{stderr}");
    assert!(
        stderr.contains("[triage] sanitizer = \"/nonexistent/compute-sanitizer\" is not a file"),
        "{stderr}"
    );
    assert_eq!(stderr.trim().lines().count(), 1, "{stderr}");
}

/// True while `pid` runs (a zombie waiting for its reaper is not running).
use cudabisect::exec::process::is_alive as alive;

/// Waits (bounded) until `ready`, looking again whenever a fake writes a file into `pids`, then sends
/// Ctrl-C to `child` and checks that it exits 130, the code for an interrupted run.
fn interrupt_when(child: std::process::Child, pids: &Path, ready: impl Fn() -> bool, never: &str) {
    crate::common::wait_for_files(pids, std::time::Duration::from_secs(60), never, ready);
    // SAFETY: signals our own child.
    unsafe { libc::kill(child.id() as i32, libc::SIGINT) };
    let out = child.wait_with_output().unwrap();
    assert_eq!(
        out.status.code(),
        Some(130),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
}

#[test]
fn ctrl_c_stops_the_process_group_and_cleans_up() {
    let repo = linear(&[("clean", true), ("hang-long", true)]);
    let dir = repo.path.parent().unwrap();
    let pids = dir.join("pids");
    std::fs::create_dir_all(&pids).unwrap();
    let config_path = dir.join("slow.toml");
    std::fs::write(
        &config_path,
        config("").replace(
            "env = {",
            &format!("env = {{ PID_DIR = \"{}\", ", pids.display()),
        ),
    )
    .unwrap();
    let child = Command::new(env!("CARGO_BIN_EXE_cudabisect"))
        .args(["start", &format!("{}..main", repo.commits[0]), "--config"])
        .arg(&config_path)
        .arg("-C")
        .arg(&repo.path)
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    // Wait until the repro (the bad endpoint's, which hangs) has started both its processes.
    let read_pid = |name: &str| -> Option<i32> {
        std::fs::read_to_string(pids.join(name))
            .ok()
            .and_then(|t| t.trim().parse().ok())
    };
    interrupt_when(
        child,
        &pids,
        || read_pid("bg.pid").is_some() && read_pid("main.pid").is_some(),
        "the repro never started",
    );
    let r = git2::Repository::open(&repo.path).unwrap();
    assert!(
        r.worktrees().unwrap().is_empty(),
        "the worktree was left registered"
    );
    for name in ["bg.pid", "main.pid"] {
        let pid = read_pid(name).unwrap();
        assert!(!alive(pid), "{name} {pid} of the repro survived");
    }
}

#[test]
fn a_second_run_in_the_same_clone_is_refused_while_the_first_holds_the_lock() {
    let repo = faulting_from(6, 3);
    // The lock lives beside the state directory, so removing that directory does not let a second
    // run in.
    let lock_path = repo.path.join(".git/cudabisect.lock");
    let lock = std::fs::OpenOptions::new()
        .create(true)
        .truncate(false)
        .write(true)
        .open(&lock_path)
        .unwrap();
    lock.try_lock().unwrap();
    let host = std::fs::read_to_string("/proc/sys/kernel/hostname").unwrap();
    std::fs::write(
        &lock_path,
        format!("pid 1 on host {}: cudabisect start a..b\n", host.trim()),
    )
    .unwrap();
    let run = cudabisect(&repo.path, &[&format!("{}..main", repo.commits[0])]);
    assert_eq!(run.code, 7, "{}", run.stderr);
    assert!(
        run.stderr.contains("another cudabisect run holds"),
        "{}",
        run.stderr
    );
    assert!(run.stderr.contains("start a..b"), "{}", run.stderr);
    assert_eq!(run.stderr.trim().lines().count(), 1, "{}", run.stderr);
    drop(lock);
    // Its holder gone, the owner line names a pid that is not cudabisect: the lock is taken over.
    let run = cudabisect(&repo.path, &[&format!("{}..main", repo.commits[0])]);
    assert_eq!(run.code, 0, "{}", run.stderr);
    assert_eq!(first_bad(&run), repo.commits[3].to_string());
}

#[test]
fn a_user_branch_named_like_an_old_temporary_branch_is_left_alone() {
    let repo = faulting_from(6, 3);
    let r = git2::Repository::open(&repo.path).unwrap();
    let c = r.find_commit(repo.commits[1]).unwrap();
    r.branch("cudabisect-probe-tmp", &c, false).unwrap();
    let before = snapshot(&repo.path);
    let run = cudabisect(&repo.path, &[&format!("{}..main", repo.commits[0])]);
    assert_eq!(run.code, 0, "{}", run.stderr);
    assert_eq!(snapshot(&repo.path), before);
}

/// GOOD on a release branch that is not an ancestor of BAD: its merge base is tested first, as git does.
#[test]
fn a_good_commit_on_another_branch_is_bisected_from_the_merge_base() {
    let tmp = tempfile::tempdir().unwrap();
    let path = tmp.path().join("repo");
    let mut b = RepoBuilder::init(&path).unwrap();
    let mut main = vec![b.commit(&[], &files("clean", true, 0), "base").unwrap()];
    for i in 1..12 {
        let mode = if i >= 7 { "fault" } else { "clean" };
        let next = b
            .commit(
                &[*main.last().unwrap()],
                &files(mode, true, i),
                &format!("main {i}"),
            )
            .unwrap();
        main.push(next);
    }
    // The release branch forks at main 3 and stays clean.
    let mut release = main[3];
    for i in 0..3 {
        release = b
            .commit(
                &[release],
                &files("clean", true, 100 + i),
                &format!("release {i}"),
            )
            .unwrap();
    }
    b.set_branch("main", *main.last().unwrap()).unwrap();
    b.set_branch("release", release).unwrap();
    b.checkout_main().unwrap();
    let run = cudabisect(&path, &["release..main"]);
    assert_eq!(run.code, 0, "{}\n{}", run.stderr, run.stdout);
    assert_eq!(first_bad(&run), main[7].to_string());
    let report = run.report.as_ref().unwrap();
    let roles: Vec<ProbeRole> = report.probes.iter().map(|p| p.role).collect();
    assert!(roles.contains(&ProbeRole::MergeBase), "{roles:?}");
    assert!(report.notes[0].contains("merge base"), "{report:#?}");

    // A merge base that shows the bug: the bug was fixed on the good commit's branch.
    let tmp2 = tempfile::tempdir().unwrap();
    let path2 = tmp2.path().join("repo");
    let mut b = RepoBuilder::init(&path2).unwrap();
    let base = b
        .commit(&[], &files("fault", true, 0), "base (faulty)")
        .unwrap();
    let fixed = b
        .commit(&[base], &files("clean", true, 1), "fix on release")
        .unwrap();
    let bad = b.commit(&[base], &files("fault", true, 2), "main").unwrap();
    b.set_branch("main", bad).unwrap();
    b.set_branch("release", fixed).unwrap();
    b.checkout_main().unwrap();
    let run = cudabisect(&path2, &["release..main"]);
    assert_eq!(run.code, 3, "{}\n{}", run.stderr, run.stdout);
    assert!(
        run.stdout
            .contains("is bad: the bug was fixed between it and the good commit"),
        "{}",
        run.stdout
    );
}

#[test]
fn a_pathspec_probes_only_the_commits_that_touch_it() {
    // src.txt changes in every commit, mode.txt only where the fault starts (commit 11).
    let repo = faulting_from(20, 11);
    let report = repo.path.parent().unwrap().join("pathspec.json");
    let out = Command::new(env!("CARGO_BIN_EXE_cudabisect"))
        .args(["start", &format!("{}..main", repo.commits[0]), "-C"])
        .arg(&repo.path)
        .arg("--report")
        .arg(&report)
        .args(["--", "mode.txt"])
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(0), "{stderr}");
    let report: Report = serde_json::from_str(&std::fs::read_to_string(&report).unwrap()).unwrap();
    assert_eq!(
        crate::common::first_bad(&report),
        Some(repo.commits[11].to_string())
    );
    assert_eq!(
        report.range_size, 2,
        "only commit 11 and the bad endpoint: {report:#?}"
    );
    // With --first-parent on a linear history, the whole range again.
    let run = cudabisect(
        &repo.path,
        &[&format!("{}..main", repo.commits[0]), "--first-parent"],
    );
    assert_eq!(run.code, 0, "{}", run.stderr);
    assert_eq!(first_bad(&run), repo.commits[11].to_string());
    assert_eq!(run.report.as_ref().unwrap().range_size, 19);
}

#[test]
fn a_commit_whose_objects_are_missing_is_a_skip_of_its_own_kind() {
    let repo = faulting_from(6, 4);
    // The first probe of c0..c5 is c2 (it halves c1..c5 best, earliest first); take its tree out of the
    // object store.
    let r = git2::Repository::open(&repo.path).unwrap();
    let tree = r
        .find_commit(repo.commits[2])
        .unwrap()
        .tree_id()
        .to_string();
    std::fs::remove_file(
        repo.path
            .join(".git/objects")
            .join(&tree[..2])
            .join(&tree[2..]),
    )
    .unwrap();
    let run = cudabisect(&repo.path, &[&format!("{}..main", repo.commits[0])]);
    let report = run
        .report
        .as_ref()
        .unwrap_or_else(|| panic!("{}", run.stderr));
    let probe = probe_of(report, repo.commits[2]);
    assert_eq!(
        probe.signature.class,
        FaultClass::MissingObject,
        "{probe:#?}"
    );
    assert_eq!(probe.verdict, Verdict::Skip);
    assert_eq!(first_bad(&run), repo.commits[4].to_string());
}

fn git_in(global: &Path, dir: &Path, args: &[&str]) -> String {
    let out = Command::new("git")
        .env("GIT_CONFIG_GLOBAL", global)
        .args(["-c", "user.name=T", "-c", "user.email=t@x"])
        .arg("-C")
        .arg(dir)
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

/// A submodule whose URL is HTTPS: the probe checks it out with the user's git config (here a URL rewrite
/// to a local copy in the user's global config, as a mirror or credential helper would be set up), at
/// every probed commit's pointer.
#[test]
fn https_submodules_check_out_with_the_users_git_config() {
    let tmp = tempfile::tempdir().unwrap();
    let sub = tmp.path().join("sub");
    let url = "https://git.example.invalid/team/sub.git";
    let global = tmp.path().join("gitconfig");
    std::fs::write(
        &global,
        format!(
            "[url \"{}\"]\n\tinsteadOf = {url}\n[protocol \"file\"]\n\tallow = always\n",
            sub.display()
        ),
    )
    .unwrap();
    let g = |dir: &Path, args: &[&str]| git_in(&global, dir, args);
    std::fs::create_dir_all(&sub).unwrap();
    g(&sub, &["init", "-q", "-b", "main"]);
    let mut sub_commits = Vec::new();
    for v in ["1", "2"] {
        std::fs::write(sub.join("value.txt"), v).unwrap();
        g(&sub, &["add", "value.txt"]);
        g(&sub, &["commit", "-q", "-m", v]);
        sub_commits.push(g(&sub, &["rev-parse", "HEAD"]));
    }
    let main = tmp.path().join("main");
    std::fs::create_dir_all(&main).unwrap();
    g(&main, &["init", "-q", "-b", "main"]);
    std::fs::write(
        main.join("repro.sh"),
        "#!/bin/sh\nif grep -q 2 sub/value.txt; then echo 'RuntimeError: CUDA error: an illegal memory access was encountered'; exit 1; fi\necho ok\n",
    )
    .unwrap();
    std::fs::set_permissions(
        main.join("repro.sh"),
        std::os::unix::fs::PermissionsExt::from_mode(0o755),
    )
    .unwrap();
    std::fs::write(
        main.join("bisect.toml"),
        "[repro]\ncommand = [\"./repro.sh\"]\n[triage]\nenabled = false\n",
    )
    .unwrap();
    g(&main, &["submodule", "add", "-q", url, "sub"]);
    g(&main.join("sub"), &["checkout", "-q", &sub_commits[0]]);
    g(&main, &["add", "-A"]);
    g(&main, &["commit", "-q", "-m", "c0"]);
    g(&main, &["tag", "v1"]);
    for (i, pointer) in [0, 0, 1, 1, 1].iter().enumerate() {
        std::fs::write(main.join("notes.txt"), format!("{i}")).unwrap();
        g(
            &main.join("sub"),
            &["checkout", "-q", &sub_commits[*pointer]],
        );
        g(&main, &["add", "-A"]);
        g(&main, &["commit", "-q", "-m", &format!("c{}", i + 1)]);
    }
    let culprit = g(&main, &["rev-parse", "HEAD~2"]);
    let before = snapshot(&main);
    let report = tmp.path().join("report.json");
    let out = Command::new(env!("CARGO_BIN_EXE_cudabisect"))
        .env("GIT_CONFIG_GLOBAL", &global)
        .args(["start", "v1..main", "-C"])
        .arg(&main)
        .arg("--report")
        .arg(&report)
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(0), "{stderr}");
    let report: Report = serde_json::from_str(&std::fs::read_to_string(&report).unwrap()).unwrap();
    assert_eq!(
        crate::common::first_bad(&report).as_deref(),
        Some(culprit.as_str())
    );
    let skipped: Vec<&ProbeRecord> = report
        .probes
        .iter()
        .filter(|p| p.verdict == Verdict::Skip)
        .collect();
    assert!(skipped.is_empty(), "{skipped:?}");
    assert_eq!(snapshot(&main), before);
}

/// `git replace --graft` rewrites history for every git command; the range is the one git sees.
#[test]
fn replace_refs_shape_the_range_as_they_do_for_git() {
    let repo = faulting_from(10, 6);
    let global = repo.path.parent().unwrap().join("gitconfig");
    std::fs::write(&global, "").unwrap();
    // c5's parent becomes c2: c3 and c4 leave the history.
    git_in(
        &global,
        &repo.path,
        &[
            "replace",
            "--graft",
            &repo.commits[5].to_string(),
            &repo.commits[2].to_string(),
        ],
    );
    let run = cudabisect(&repo.path, &[&format!("{}..main", repo.commits[0])]);
    assert_eq!(run.code, 0, "{}", run.stderr);
    assert_eq!(first_bad(&run), repo.commits[6].to_string());
    let report = run.report.as_ref().unwrap();
    assert_eq!(report.range_size, 7, "c1 c2 c5 c6 c7 c8 c9: {report:#?}");
    let probed: Vec<&str> = report.probes.iter().map(|p| p.commit.as_str()).collect();
    for gone in [3, 4] {
        assert!(!probed.contains(&repo.commits[gone].to_string().as_str()));
    }
}

/// Replaces what changes from run to run (shas, times, temp paths, dates) with placeholders.
fn redact(text: &str, repo: &Path) -> String {
    let text = text.replace(&repo.display().to_string(), "<repo>");
    let rules = [
        (r"[0-9a-f]{40}", "<sha>"),
        (r"\b[0-9a-f]{12}\b", "<short>"),
        (r"\[\s*[0-9]+\.[0-9]s\]", "[<t>]"),
        (r"[0-9]+\.[0-9]+s\b", "<d>s"),
        (r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\dZ", "<date>"),
        (r"runs/[0-9]+-[0-9]+", "runs/<id>"),
        (r"\([0-9]+\.[0-9] (KiB|MiB)\)", "(<size>)"),
    ];
    rules.iter().fold(text, |t, (re, to)| {
        regex::Regex::new(re)
            .unwrap()
            .replace_all(&t, *to)
            .into_owned()
    })
}

#[test]
fn human_output_reads_the_same_run_after_run() {
    let repo = linear(&modes(12, |i| match i {
        4 => ("mismatch", true),
        6 => ("clean", false),
        i if i >= 8 => ("fault", true),
        _ => ("clean", true),
    }));
    let out = Command::new(env!("CARGO_BIN_EXE_cudabisect"))
        .args(["start", &format!("{}..main", repo.commits[0]), "-C"])
        .arg(&repo.path)
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(0));
    let stdout = redact(&String::from_utf8_lossy(&out.stdout), &repo.path);
    let stderr = redact(&String::from_utf8_lossy(&out.stderr), &repo.path);
    insta::assert_snapshot!("human_summary", stdout);
    insta::assert_snapshot!("human_progress", stderr);
}

/// git's criss-cross shape: GOOD and BAD on two branches that merged each other, so they have two merge
/// bases; both are tested before the search.
#[test]
fn two_merge_bases_are_both_tested_first() {
    let tmp = tempfile::tempdir().unwrap();
    let path = tmp.path().join("repo");
    let mut b = RepoBuilder::init(&path).unwrap();
    let root = b.commit(&[], &files("clean", true, 0), "root").unwrap();
    let a1 = b.commit(&[root], &files("clean", true, 1), "a1").unwrap();
    let b1 = b.commit(&[root], &files("clean", true, 2), "b1").unwrap();
    // Each branch merges the other's first commit: a1 and b1 are both merge bases of the tips.
    let a2 = b
        .commit(&[a1, b1], &files("clean", true, 3), "a2 (merge b1)")
        .unwrap();
    let b2 = b
        .commit(&[b1, a1], &files("clean", true, 4), "b2 (merge a1)")
        .unwrap();
    let b3 = b
        .commit(&[b2], &files("fault", true, 5), "b3 (the bug)")
        .unwrap();
    let b4 = b.commit(&[b3], &files("fault", true, 6), "b4").unwrap();
    b.set_branch("main", b4).unwrap();
    b.set_branch("release", a2).unwrap();
    b.checkout_main().unwrap();
    let run = cudabisect(&path, &["release..main"]);
    assert_eq!(run.code, 0, "{}\n{}", run.stderr, run.stdout);
    assert_eq!(first_bad(&run), b3.to_string());
    let report = run.report.as_ref().unwrap();
    let mut bases: Vec<String> = report
        .probes
        .iter()
        .filter(|p| p.role == ProbeRole::MergeBase)
        .map(|p| p.commit.clone())
        .collect();
    bases.sort();
    let mut want = vec![a1.to_string(), b1.to_string()];
    want.sort();
    assert_eq!(bases, want);
}

/// A failure after the search (here the probe worktree locked by the user, so it cannot be removed) is a
/// warning: the result is printed and written all the same.
#[test]
fn a_cleanup_failure_after_the_search_never_loses_the_result() {
    let repo = faulting_from(8, 5);
    let range = format!("{}..main", repo.commits[0]);
    let run = cudabisect(&repo.path, &[&range, "--keep-worktree"]);
    assert_eq!(run.code, 0, "{}", run.stderr);
    let global = repo.path.parent().unwrap().join("gitconfig");
    std::fs::write(&global, "").unwrap();
    let worktree = repo.path.join(".git/cudabisect/worktree");
    git_in(
        &global,
        &repo.path,
        &["worktree", "lock", worktree.to_str().unwrap()],
    );
    let run = cudabisect(&repo.path, &[&range]);
    assert_eq!(run.code, 0, "{}", run.stderr);
    assert_eq!(first_bad(&run), repo.commits[5].to_string());
    assert!(run.stdout.contains("First bad commit"), "{}", run.stdout);
    assert!(
        run.stderr
            .contains("warning: the probe worktree was not removed"),
        "{}",
        run.stderr
    );
    git_in(
        &global,
        &repo.path,
        &["worktree", "unlock", worktree.to_str().unwrap()],
    );
}

/// A stand-in for compute-sanitizer that runs the repro and reports an out-of-bounds write in the kernel
/// the probed commit's bug lives in (as memcheck would), by the commit's mode.
const KERNEL_SANITIZER: &str = include_str!("fakes/e2e_kernel_sanitizer.sh");

fn history(modes: &[&'static str]) -> TestRepo {
    linear(&modes.iter().map(|m| (*m, true)).collect::<Vec<_>>())
}

/// Two bugs of one class (both 717, as Triton faults surface in PyTorch): the other one, in another
/// function of the user's code, comes and goes before the target starts. Its commit must not be named.
#[test]
fn another_bug_of_the_same_class_is_never_named_as_the_culprit() {
    let mut modes = vec!["clean"; 30];
    for m in modes.iter_mut().take(18).skip(6) {
        *m = "tri-other";
    }
    for m in modes.iter_mut().skip(22) {
        *m = "tri-target";
    }
    let repo = history(&modes);
    let run = cudabisect(&repo.path, &[&format!("{}..main", repo.commits[0])]);
    assert_eq!(run.code, 0, "{}", run.stderr);
    assert_eq!(first_bad(&run), repo.commits[22].to_string());
    let report = run.report.as_ref().unwrap();
    assert_eq!(
        report.target.as_ref().and_then(|t| t.launch.as_deref()),
        Some("pkg/embed.py:hash_embed"),
        "{report:#?}"
    );
    for p in &report.probes {
        if p.signature.launch.as_deref() == Some("pkg/ops.py:bias_gelu") {
            assert_eq!(p.verdict, Verdict::Skip, "{p:#?}");
        }
    }
}

/// The same shape when nothing in the output tells the two apart (one wrapper launches both kernels):
/// compute-sanitizer learns the target's kernel at the bad endpoint and settles each lookalike probe.
#[test]
fn the_sanitizer_tells_lookalike_faults_apart() {
    let mut modes = vec!["clean"; 30];
    for m in modes.iter_mut().take(18).skip(6) {
        *m = "tri-same-other";
    }
    for m in modes.iter_mut().skip(22) {
        *m = "tri-same-target";
    }
    let repo = history(&modes);
    let (run, calls) = start_with_kernel_sanitizer(&repo);
    assert_eq!(run.code, 0, "{}", run.stderr);
    assert_eq!(first_bad(&run), repo.commits[22].to_string());
    // A fault PyTorch reports keeps the host frames in every sanitizer run.
    assert!(!calls.is_empty());
    assert!(
        calls.iter().all(|c| c.ends_with(" host+device")),
        "{calls:?}"
    );
    let report = run.report.as_ref().unwrap();
    assert_eq!(
        report.target.as_ref().and_then(|t| t.kernel.as_deref()),
        Some("_hash_embed_kernel"),
        "{report:#?}"
    );
    assert_eq!(report.probes[1].role, ProbeRole::EndpointSanitizer);
    let others = &report.other_bugs;
    assert!(!others.is_empty(), "{report:#?}");
    assert!(others
        .iter()
        .all(|o| o.signature.kernel.as_deref() == Some("_bias_gelu_kernel")));
    assert!(
        run.stdout.contains("Another bug on the way"),
        "{}",
        run.stdout
    );
}

/// `start --no-shrink` with [`KERNEL_SANITIZER`] as compute-sanitizer (triage on): the run, and one line per
/// sanitizer run (`sanitized MODE FRAMES`).
fn start_with_kernel_sanitizer(repo: &TestRepo) -> (Run, Vec<String>) {
    let dir = repo.path.parent().unwrap();
    let fake = dir.join("compute-sanitizer");
    std::fs::write(&fake, KERNEL_SANITIZER).unwrap();
    std::fs::set_permissions(&fake, std::os::unix::fs::PermissionsExt::from_mode(0o755)).unwrap();
    let calls = dir.join("calls.txt");
    let config_path = dir.join("sanitized.toml");
    let text = config("").replace("[triage]\nenabled = false\n", "")
        + &format!(
            "[triage]\nsanitizer = \"{}\"\nenv = {{ SANITIZER_CALLS = \"{}\" }}\n",
            fake.display(),
            calls.display()
        );
    std::fs::write(&config_path, text).unwrap();
    let run = start_with_config(repo, &config_path, &["--no-shrink"]);
    let calls = std::fs::read_to_string(&calls).unwrap_or_default();
    (run, calls.lines().map(str::to_string).collect())
}

/// A Triton kernel's fault (its launcher names no kernel): the sanitizer runs that learn its kernel at the
/// bad end and triage it at the culprit record device frames only, where a 10⁵-thread fault spends its
/// time on host frames that name only Triton's launcher.
#[test]
fn a_triton_fault_is_sanitized_with_device_frames_only() {
    let mut modes = vec!["clean"; 20];
    modes.extend(["tri-same-target-triton"; 10]);
    let repo = history(&modes);
    let (run, calls) = start_with_kernel_sanitizer(&repo);
    assert_eq!(run.code, 0, "{}", run.stderr);
    assert_eq!(first_bad(&run), repo.commits[20].to_string());
    let report = run.report.as_ref().unwrap();
    let target = report.target.as_ref().unwrap();
    assert_eq!(target.framework.as_deref(), Some("triton"), "{target:#?}");
    assert_eq!(
        target.kernel.as_deref(),
        Some("_hash_embed_kernel"),
        "{target:#?}"
    );
    assert_eq!(report.probes[1].role, ProbeRole::EndpointSanitizer);
    let triage = report.triage.as_ref().unwrap();
    assert_eq!(triage.status, TriageStatus::Found, "{triage:#?}");
    assert!(calls.len() >= 2, "the bad end's and triage's: {calls:?}");
    assert!(
        calls
            .iter()
            .all(|c| c == "sanitized tri-same-target-triton device"),
        "{calls:?}"
    );
}

/// An unrelated failure of class `other` (an ImportError for a while) never steers a search for another
/// `other` failure (an AssertionError).
#[test]
fn an_unrelated_other_failure_never_steers_the_search() {
    // c10..=c15 fail to import (fixed at c16); the assertion starts at c23.
    let mut modes = vec!["clean"; 30];
    for m in modes.iter_mut().take(16).skip(10) {
        *m = "import-err";
    }
    for m in modes.iter_mut().skip(23) {
        *m = "assert-err";
    }
    let repo = history(&modes);
    let run = cudabisect(&repo.path, &[&format!("{}..main", repo.commits[0])]);
    assert_eq!(run.code, 0, "{}", run.stderr);
    assert_eq!(first_bad(&run), repo.commits[23].to_string());
}

/// A build and repro wrapper (`wrapper.sh build|repro`) that counts its runs and, on the run named in
/// `kill_at.txt`, SIGKILLs cudabisect (its parent) as a preempted runner would, mid-build or mid-repro.
const KILLING_REPRO: &str = include_str!("fakes/e2e_killing_repro.sh");

fn killing_setup(repo: &TestRepo) -> (PathBuf, PathBuf) {
    let state = repo.path.parent().unwrap().join("kill-state");
    std::fs::create_dir_all(&state).unwrap();
    let wrapper = state.join("wrapper.sh");
    std::fs::write(&wrapper, KILLING_REPRO).unwrap();
    let cfg = state.join("kill.toml");
    std::fs::write(
        &cfg,
        config("")
            .replace(
                "command = [\"./build.sh\"]",
                &format!(
                    "command = [\"sh\", \"{}\", \"build\"]\nenv = {{ STATE = \"{}\" }}",
                    wrapper.display(),
                    state.display(),
                ),
            )
            .replace(
                "command = [\"./repro.sh\"]",
                &format!(
                    "command = [\"sh\", \"{}\", \"repro\"]\nenv = {{ STATE = \"{}\", FIXTURES = \"{}\" }}",
                    wrapper.display(),
                    state.display(),
                    fixtures().display()
                ),
            )
            .replace(
                &format!("env = {{ FIXTURES = \"{}\" }}\n", fixtures().display()),
                "",
            ),
    )
    .unwrap();
    (state, cfg)
}

fn runs_so_far(state: &Path) -> usize {
    std::fs::read_to_string(state.join("count.txt"))
        .ok()
        .and_then(|t| t.trim().parse().ok())
        .unwrap_or(0)
}

#[test]
fn a_run_killed_at_any_probe_resumes_with_at_most_that_probe_redone() {
    let shape = |i: usize| {
        if i >= 11 {
            ("fault", true)
        } else {
            ("clean", true)
        }
    };
    // The uninterrupted run: how many repro runs the whole search takes.
    let reference = linear(&modes(24, shape));
    let (state, cfg) = killing_setup(&reference);
    let good = reference.commits[0].to_string();
    let range = format!("{good}..main");
    let args = ["--config", cfg.to_str().unwrap(), &range, "--no-shrink"];
    let full = cudabisect(&reference.path, &args);
    assert_eq!(full.code, 0, "{}", full.stderr);
    let expected = first_bad(&full);
    let total = runs_so_far(&state);
    assert!(total >= 4, "{total}");

    for kill_at in 1..=total {
        let repo = linear(&modes(24, shape));
        let (state, cfg) = killing_setup(&repo);
        let good = repo.commits[0].to_string();
        let range = format!("{good}..main");
        let args = ["--config", cfg.to_str().unwrap(), &range, "--no-shrink"];
        std::fs::write(state.join("kill_at.txt"), kill_at.to_string()).unwrap();
        let before = snapshot(&repo.path);
        let killed = cudabisect(&repo.path, &args);
        assert_ne!(killed.code, 0, "killed at run {kill_at}: {}", killed.stderr);
        assert_eq!(runs_so_far(&state), kill_at);
        let resumed = cudabisect(&repo.path, &args);
        assert_eq!(
            resumed.code, 0,
            "after a kill at run {kill_at}: {}",
            resumed.stderr
        );
        assert_eq!(first_bad(&resumed), expected, "killed at run {kill_at}");
        // Runs are builds and repros, two per probe: a kill mid-probe redoes at most that probe's two.
        let redone = runs_so_far(&state) - kill_at;
        assert!(
            kill_at + redone <= total + 2,
            "killed at run {kill_at}: {redone} runs after the kill, {total} for the whole search"
        );
        let probes = &resumed.report.as_ref().unwrap().probes;
        let reused = probes.iter().filter(|p| p.reused).count();
        assert_eq!(
            reused,
            (kill_at - 1) / 2,
            "killed at run {kill_at}: every finished probe is reused"
        );
        assert!(resumed.stderr.contains("[reused from the journal]") || reused == 0);
        // The user's checkout is as it was before the killed run: the resume also removes the probe
        // worktree the killed run left registered.
        assert_eq!(snapshot(&repo.path), before, "killed at run {kill_at}");
    }
}

#[test]
fn start_fresh_ignores_the_journal() {
    let repo = faulting_from(12, 5);
    let good = repo.commits[0].to_string();
    let range = format!("{good}..main");
    let first = cudabisect(&repo.path, &[&range, "--no-shrink"]);
    assert_eq!(first.code, 0, "{}", first.stderr);
    let again = cudabisect(&repo.path, &[&range, "--no-shrink"]);
    let probes = |r: &Run| r.report.as_ref().unwrap().probes.clone();
    assert!(probes(&again).iter().all(|p| p.reused), "{}", again.stderr);
    assert_eq!(first_bad(&again), first_bad(&first));
    assert!(
        again
            .stdout
            .contains("reused from the journal of an earlier run)"),
        "{}",
        again.stdout
    );
    let fresh = cudabisect(&repo.path, &[&range, "--no-shrink", "--fresh"]);
    assert!(probes(&fresh).iter().all(|p| !p.reused));
    assert_eq!(first_bad(&fresh), first_bad(&first));
}

#[test]
fn the_log_of_a_run_replays_in_git_bisect_to_the_same_first_bad_commit() {
    let repo = faulting_from(20, 13);
    let good = repo.commits[0].to_string();
    let run = cudabisect(&repo.path, &[&format!("{good}..main"), "--no-shrink"]);
    assert_eq!(run.code, 0, "{}", run.stderr);
    let expected = first_bad(&run);
    let log = |format: &str| {
        let out = Command::new(env!("CARGO_BIN_EXE_cudabisect"))
            .args(["log", "--format", format, "-C"])
            .arg(&repo.path)
            .output()
            .unwrap();
        assert_eq!(
            out.status.code(),
            Some(0),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8_lossy(&out.stdout).into_owned()
    };
    let probes = run.report.as_ref().unwrap().probes.len();
    let human = log("human");
    assert_eq!(human.lines().count(), probes + 1, "{human}");
    // One JSON line: the run's `finished` event, as `start --message-format json` ends.
    let json = log("json");
    assert_eq!(json.lines().count(), 1, "{json}");
    let Event::Finished { report: logged } = &crate::common::events(&json)[0] else {
        panic!("not the finished event: {json}")
    };
    assert_eq!(crate::common::first_bad(logged).as_ref(), Some(&expected));
    // The git form, replayed by git itself in the (test) repository.
    let file = repo.path.parent().unwrap().join("bisect.log");
    std::fs::write(&file, log("git")).unwrap();
    let replay = Command::new("git")
        .arg("-C")
        .arg(&repo.path)
        .args(["bisect", "replay"])
        .arg(&file)
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&replay.stdout).into_owned()
        + &String::from_utf8_lossy(&replay.stderr);
    assert!(
        text.contains(&format!("{expected} is the first bad commit")),
        "{text}\n{}",
        std::fs::read_to_string(&file).unwrap()
    );
    let _ = Command::new("git")
        .arg("-C")
        .arg(&repo.path)
        .args(["bisect", "reset"])
        .output();

    // No run at all: one line, exit 2.
    let empty = linear(&modes(2, |_| ("clean", true)));
    let out = Command::new(env!("CARGO_BIN_EXE_cudabisect"))
        .args(["log", "-C"])
        .arg(&empty.path)
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
    assert_eq!(String::from_utf8_lossy(&out.stderr).lines().count(), 1);
}

/// (failures, errors, tests, the failure's message and body) from a JUnit file, parsed.
fn junit_counts(path: &Path) -> (String, String, String, Option<(String, String)>) {
    let text = std::fs::read_to_string(path).unwrap();
    let doc = roxmltree::Document::parse(&text).unwrap();
    let root = doc.root_element();
    assert_eq!(root.tag_name().name(), "testsuites");
    let case = root
        .descendants()
        .find(|n| n.has_tag_name("testcase"))
        .expect("a test case");
    assert_eq!(case.attribute("classname"), Some("cudabisect"));
    let failure = case
        .children()
        .find(|n| n.has_tag_name("failure"))
        .map(|f| {
            (
                f.attribute("message").unwrap_or("").to_string(),
                f.text().unwrap_or("").to_string(),
            )
        });
    (
        root.attribute("failures").unwrap_or("").to_string(),
        root.attribute("errors").unwrap_or("").to_string(),
        root.attribute("tests").unwrap_or("").to_string(),
        failure,
    )
}

#[test]
fn junit_and_the_step_summary_say_what_ci_needs() {
    let repo = faulting_from(10, 6);
    let good = repo.commits[0].to_string();
    let dir = repo.path.parent().unwrap();
    let junit = dir.join("junit.xml");
    let summary = dir.join("summary.md");
    std::fs::write(&summary, "earlier step\n").unwrap();
    let out = Command::new(env!("CARGO_BIN_EXE_cudabisect"))
        .args(["start", &format!("{good}..main"), "--no-shrink", "--junit"])
        .arg(&junit)
        .arg("-C")
        .arg(&repo.path)
        .env("GITHUB_STEP_SUMMARY", &summary)
        .output()
        .unwrap();
    assert_eq!(
        out.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let (failures, errors, tests, failure) = junit_counts(&junit);
    assert_eq!(
        (failures.as_str(), errors.as_str(), tests.as_str()),
        ("1", "0", "1")
    );
    let (message, body) = failure.expect("a failure");
    assert!(
        message.contains(&repo.commits[6].to_string()[..12]),
        "{message}"
    );
    assert!(
        body.contains("First bad commit") || body.contains(&repo.commits[6].to_string()),
        "{body}"
    );
    let md = std::fs::read_to_string(&summary).unwrap();
    assert!(
        md.starts_with("earlier step\n"),
        "appended, not replaced: {md}"
    );
    assert!(md.contains(&repo.commits[6].to_string()[..12]), "{md}");

    // A range whose bad end does not reproduce: an error, not a failure.
    let clean = linear(&modes(4, |_| ("clean", true)));
    let good = clean.commits[0].to_string();
    let junit = clean.path.parent().unwrap().join("junit.xml");
    let out = Command::new(env!("CARGO_BIN_EXE_cudabisect"))
        .args(["start", &format!("{good}..main"), "--junit"])
        .arg(&junit)
        .arg("-C")
        .arg(&clean.path)
        .env_remove("GITHUB_STEP_SUMMARY")
        .output()
        .unwrap();
    assert_eq!(
        out.status.code(),
        Some(3),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let (failures, errors, _, failure) = junit_counts(&junit);
    assert_eq!((failures.as_str(), errors.as_str()), ("0", "1"));
    assert!(failure.is_none());
}

#[test]
fn a_run_killed_during_triage_resumes_with_the_same_culprit_and_finding() {
    let setup = |kill_at: Option<usize>| {
        let repo = faulting_from(6, 3);
        let dir = repo.path.parent().unwrap().to_path_buf();
        let fake = dir.join("fake-sanitizer");
        std::fs::write(&fake, FAKE_SANITIZER).unwrap();
        // The sanitizer cudabisect runs: counts its calls and SIGKILLs cudabisect on the named one.
        let wrapper = dir.join("compute-sanitizer");
        std::fs::write(
            &wrapper,
            format!(
                "#!/bin/sh\nn=$(($(cat {count} 2>/dev/null || echo 0) + 1))\necho $n > {count}\nif [ \"$n\" = \"{kill}\" ]; then kill -KILL \"$PPID\"; exit 0; fi\nexec sh {fake} \"$@\"\n",
                count = dir.join("count.txt").display(),
                kill = kill_at.map(|k| k.to_string()).unwrap_or_default(),
                fake = fake.display()
            ),
        )
        .unwrap();
        std::fs::set_permissions(
            &wrapper,
            std::os::unix::fs::PermissionsExt::from_mode(0o755),
        )
        .unwrap();
        let config_path = dir.join("triage.toml");
        let text = config("").replace("[triage]\nenabled = false\n", "")
            + &format!(
                "[triage]\nsanitizer = \"{}\"\nenv = {{ FAKE_SANITIZER_CALLS = \"{}\", FIXTURES = \"{}\" }}\n",
                wrapper.display(),
                dir.join("calls.txt").display(),
                fixtures().display()
            );
        std::fs::write(&config_path, text).unwrap();
        (repo, dir, config_path)
    };
    let calls = |dir: &Path| {
        std::fs::read_to_string(dir.join("count.txt"))
            .ok()
            .and_then(|t| t.trim().parse::<usize>().ok())
            .unwrap_or(0)
    };
    let (repo, dir, cfg) = setup(None);
    let range = format!("{}..main", repo.commits[0]);
    let full = cudabisect(&repo.path, &[&range, "--config", cfg.to_str().unwrap()]);
    assert_eq!(full.code, 0, "{}", full.stderr);
    let total = calls(&dir);
    assert!(total >= 2, "{total}");
    let triage = |r: &Run| {
        r.report
            .as_ref()
            .unwrap()
            .triage
            .as_ref()
            .and_then(|t| t.signature.as_ref())
            .and_then(|s| s.kernel.clone())
    };
    assert_eq!(triage(&full).as_deref(), Some("shared_race"));
    for kill_at in 1..=total {
        let (repo, _dir, cfg) = setup(Some(kill_at));
        let range = format!("{}..main", repo.commits[0]);
        let killed = cudabisect(&repo.path, &[&range, "--config", cfg.to_str().unwrap()]);
        assert_eq!(killed.code, -1, "killed at sanitizer call {kill_at}");
        let resumed = cudabisect(&repo.path, &[&range, "--config", cfg.to_str().unwrap()]);
        assert_eq!(resumed.code, 0, "kill at {kill_at}: {}", resumed.stderr);
        assert_eq!(first_bad(&resumed), repo.commits[3].to_string());
        assert_eq!(triage(&resumed), triage(&full), "kill at {kill_at}");
    }
}

#[test]
fn a_run_killed_while_writing_its_bundle_keeps_the_result_and_resumes() {
    let repo = faulting_from(8, 5);
    let dir = repo.path.parent().unwrap();
    // The environment section of the bundle asks `uname` first: this one SIGKILLs cudabisect there.
    let bin_dir = dir.join("fakebin");
    std::fs::create_dir_all(&bin_dir).unwrap();
    let uname = bin_dir.join("uname");
    std::fs::write(&uname, "#!/bin/sh\nkill -KILL \"$PPID\"\n").unwrap();
    std::fs::set_permissions(&uname, std::os::unix::fs::PermissionsExt::from_mode(0o755)).unwrap();
    let path = format!(
        "{}:{}",
        bin_dir.display(),
        std::env::var("PATH").unwrap_or_default()
    );
    let range = format!("{}..main", repo.commits[0]);
    let out = Command::new(env!("CARGO_BIN_EXE_cudabisect"))
        .args(["start", &range, "-C"])
        .arg(&repo.path)
        .env("PATH", &path)
        .output()
        .unwrap();
    assert_eq!(out.status.code(), None, "killed while writing the bundle");
    // The result was on disk before the bundle was started: it survives the kill whole.
    let runs = repo.path.join(".git/cudabisect/runs");
    let saved: Vec<Report> = std::fs::read_dir(&runs)
        .unwrap()
        .filter_map(|e| std::fs::read_to_string(e.unwrap().path().join("report.json")).ok())
        .map(|t| serde_json::from_str(&t).expect("a whole report, never a torn one"))
        .collect();
    assert_eq!(saved.len(), 1);
    assert_eq!(
        saved[0].first_bad.as_ref().map(|c| c.commit.clone()),
        Some(repo.commits[5].to_string())
    );
    let resumed = cudabisect(&repo.path, &[&range]);
    assert_eq!(resumed.code, 0, "{}", resumed.stderr);
    assert_eq!(first_bad(&resumed), repo.commits[5].to_string());
    let report = resumed.report.as_ref().unwrap();
    assert!(report.probes.iter().all(|p| p.reused));
    let bundle = report.bundle.as_deref().expect("a bundle this time");
    assert!(Path::new(bundle).join("REPORT.md").is_file());
}

/// A config file beside the repository: the committed one plus `extra`, with `env` entries added.
fn config_file(repo: &TestRepo, name: &str, env: &[(&str, &Path)], extra: &str) -> PathBuf {
    let dir = repo.path.parent().unwrap();
    let vars: String = env
        .iter()
        .map(|(k, v)| format!("{k} = \"{}\", ", v.display()))
        .collect();
    let path = dir.join(name);
    std::fs::write(
        &path,
        config(extra).replace("env = {", &format!("env = {{ {vars}")),
    )
    .unwrap();
    path
}

#[test]
fn parallel_probes_run_in_worktrees_of_their_own_pinned_to_their_devices() {
    let repo = faulting_from(24, 15);
    let before = snapshot(&repo.path);
    let dir = repo.path.parent().unwrap().to_path_buf();
    let log = dir.join("probes.log");
    // `[search] jobs = 1` in the file; `--jobs 3` on the command line wins.
    let config_path = config_file(
        &repo,
        "parallel.toml",
        &[("PROBE_LOG", &log)],
        "\n[search]\njobs = 1\ndevices = [\"7\", \"8\", \"9\"]\n",
    );
    let run = start_with_config(&repo, &config_path, &["--jobs", "3"]);
    assert_eq!(run.code, 0, "{}", run.stderr);
    assert_eq!(first_bad(&run), repo.commits[15].to_string());
    let lines = std::fs::read_to_string(&log).unwrap();
    let mut by_worker: std::collections::BTreeMap<
        String,
        std::collections::BTreeSet<(String, String)>,
    > = Default::default();
    for line in lines.lines() {
        let f: Vec<&str> = line.split_whitespace().collect();
        by_worker
            .entry(f[1].to_string())
            .or_default()
            .insert((f[2].to_string(), f[3].to_string()));
    }
    assert_eq!(
        by_worker.keys().map(String::as_str).collect::<Vec<_>>(),
        ["1", "2", "3"],
        "{lines}"
    );
    let mut worktrees = std::collections::BTreeSet::new();
    for (worker, seen) in &by_worker {
        // One device and one worktree per worker, every probe.
        assert_eq!(seen.len(), 1, "worker {worker}: {seen:?}");
        let (device, worktree) = seen.iter().next().unwrap();
        let want = (6 + worker.parse::<usize>().unwrap()).to_string();
        assert_eq!(device, &want, "worker {worker}");
        worktrees.insert(worktree.clone());
    }
    assert_eq!(worktrees.len(), 3, "{worktrees:?}");
    // Fewer rounds than the serial search needs probes: 24 commits take 5 probes one at a time.
    let human = run.stderr.clone();
    assert!(human.contains("[w2]") && human.contains("[w3]"), "{human}");
    assert_eq!(before, snapshot(&repo.path), "the checkout changed");
    let r = git2::Repository::open(&repo.path).unwrap();
    assert!(
        r.worktrees().unwrap().is_empty(),
        "worktrees left registered"
    );
}

/// A config with the stand-in sanitizer for triage (memcheck sees nothing, racecheck the recorded race)
/// and each run of the repro logged to `probes.log` (its commit, worker and worktree).
fn triage_and_probe_log_config(repo: &TestRepo) -> (PathBuf, PathBuf) {
    let dir = repo.path.parent().unwrap();
    let fake = dir.join("compute-sanitizer");
    std::fs::write(&fake, FAKE_SANITIZER).unwrap();
    std::fs::set_permissions(&fake, std::os::unix::fs::PermissionsExt::from_mode(0o755)).unwrap();
    let log = dir.join("probes.log");
    let path = dir.join("early.toml");
    let text = config("")
        .replace("[triage]\nenabled = false\n", "")
        .replace("env = {", &format!("env = {{ PROBE_LOG = \"{}\", ", log.display()))
        + &format!(
            "[triage]\nsanitizer = \"{}\"\nenv = {{ FAKE_SANITIZER_CALLS = \"{}\", FIXTURES = \"{}\", PROBE_LOG = \"{}\" }}\n",
            fake.display(),
            dir.join("calls.txt").display(),
            fixtures().display(),
            log.display()
        );
    std::fs::write(&path, text).unwrap();
    (path, log)
}

/// How many of the events on a run's stdout (JSON Lines) are `which`.
fn count_events(run: &Run, which: impl Fn(&Event) -> bool) -> usize {
    crate::common::events(&run.stdout)
        .iter()
        .filter(|e| which(e))
        .count()
}

fn triage_began(e: &Event) -> bool {
    matches!(
        e,
        Event::StageBegan {
            stage: Stage::Triage
        }
    )
}

fn triage_finished(e: &Event) -> bool {
    matches!(e, Event::TriageFinished { .. })
}

#[test]
fn with_four_workers_triage_starts_at_the_answer_while_it_is_cross_checked_and_ends_the_same() {
    let repo = faulting_from(24, 18);
    let (config_path, log) = triage_and_probe_log_config(&repo);
    let json = ["--message-format", "json"];
    let parallel = start_with_config(&repo, &config_path, &["--jobs", "4", json[0], json[1]]);
    assert_eq!(parallel.code, 0, "{}", parallel.stderr);
    let probes = std::fs::read_to_string(&log).unwrap();
    std::fs::remove_file(&log).unwrap();
    let serial = start_with_config(&repo, &config_path, &["--jobs", "1", json[0], json[1]]);
    assert_eq!(serial.code, 0, "{}", serial.stderr);
    let (p, s) = (
        parallel.report.clone().unwrap(),
        serial.report.clone().unwrap(),
    );
    let first_bad = crate::common::first_bad;
    assert_eq!(first_bad(&p), first_bad(&s));
    assert_eq!(first_bad(&p), Some(repo.commits[18].to_string()));
    // Triage ran beside the cross-check, in the second worker's worktree (the cross-check holds the
    // first's): its run of the repro at the culprit (no probe: no worker number) is logged from there.
    let culprit = repo.commits[18].to_string();
    let triaged: Vec<&str> = probes
        .lines()
        .filter(|l| l.starts_with(&culprit) && l.split_whitespace().nth(1) == Some("none"))
        .collect();
    assert_eq!(triaged.len(), 1, "{probes}");
    assert!(triaged[0].ends_with("/worktree-2"), "{probes}");
    // The same triage, bundle and events as one stage after the other.
    let triage = |r: &Report| {
        let t = r.triage.clone().expect("triage ran");
        (t.status, t.summary, t.tools_run, t.signature)
    };
    assert_eq!(triage(&p), triage(&s));
    let files = |r: &Report| {
        let mut names: Vec<String> = std::fs::read_dir(r.bundle.as_deref().unwrap())
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .collect();
        names.sort();
        names
    };
    assert_eq!(files(&p), files(&s));
    for run in [&parallel, &serial] {
        assert_eq!(count_events(run, triage_began), 1);
        assert_eq!(count_events(run, triage_finished), 1);
    }
}

#[test]
fn every_probe_of_a_parallel_run_has_a_step_number_of_its_own() {
    // Four workers: a probe that hangs is stopped once its answer no longer matters, then the
    // answer's cross-check runs alone; none of them shares a number with another.
    let repo = linear(&modes(60, |i| match i {
        39..=58 => ("hang", true),
        37.. => ("fault", true),
        _ => ("clean", true),
    }));
    // Hangs end after 2 s.
    let short = short_timeout_config(&repo);
    let run = start_with_config(
        &repo,
        &short,
        &["--jobs", "4", "--no-shrink", "--message-format", "json"],
    );
    assert_eq!(run.code, 0, "{}", run.stderr);
    assert_eq!(first_bad(&run), repo.commits[37].to_string());
    let events = crate::common::events(&run.stdout);
    let verify = |e: &Event| {
        matches!(
            e,
            Event::PhaseStarted {
                role: ProbeRole::Verify,
                ..
            }
        )
    };
    assert!(events.iter().any(verify), "no cross-check: {}", run.stdout);
    assert!(
        events
            .iter()
            .any(|e| matches!(e, Event::ProbeAbandoned { .. })),
        "no probe was stopped: {}",
        run.stdout
    );
    crate::common::one_probe_per_step(&events).unwrap_or_else(|e| panic!("{e}\n{}", run.stderr));
}

#[test]
fn stages_started_at_a_parallel_answer_that_does_not_hold_alone_are_dropped_and_run_at_the_right_one(
) {
    // Commits 1..17 are clean alone but fault on any worker but the first: the parallel search names one
    // of them, the cross-check (on the first worker) finds it clean, and the search runs again serially.
    let repo = linear(&modes(24, |i| match i {
        0 => ("clean", true),
        i if i >= 18 => ("fault", true),
        _ => ("crowd", true),
    }));
    let (config_path, _log) = triage_and_probe_log_config(&repo);
    let run = start_with_config(
        &repo,
        &config_path,
        &["--jobs", "4", "--message-format", "json"],
    );
    assert_eq!(run.code, 0, "{}", run.stderr);
    assert_eq!(
        count_events(&run, |e| matches!(e, Event::ParallelAnswerDisagrees { .. })),
        1,
        "{}",
        run.stdout
    );
    let report = run.report.as_ref().unwrap();
    assert_eq!(
        crate::common::first_bad(report),
        Some(repo.commits[18].to_string())
    );
    // What was started at the answer that did not hold left no event and no result: one triage, at the
    // right commit, and its bundle.
    assert_eq!(count_events(&run, triage_began), 1, "{}", run.stdout);
    assert_eq!(count_events(&run, triage_finished), 1);
    assert_eq!(
        report.triage.as_ref().map(|t| t.status),
        Some(TriageStatus::Found),
        "{:#?}",
        report.triage
    );
    let short = &repo.commits[18].to_string()[..12];
    assert!(
        report.bundle.as_deref().unwrap().ends_with(short),
        "{:?}",
        report.bundle
    );
}

#[test]
fn a_probe_needing_more_gpus_than_listed_is_bad_input_that_writes_nothing() {
    let repo = faulting_from(6, 3);
    let before = snapshot(&repo.path);
    let config_path = config_file(
        &repo,
        "two.toml",
        &[],
        "\n[search]\ndevices = [0, 1]\ngpus-per-probe = 3\n",
    );
    let run = start_with_config(&repo, &config_path, &["--jobs", "2"]);
    assert_eq!(run.code, 2, "{}", run.stderr);
    assert_eq!(
        run.stderr.trim(),
        "error: one probe needs 3 GPUs, and 2 are available (0,1)"
    );
    assert_eq!(before, snapshot(&repo.path));
    assert!(!repo.path.join(".git/cudabisect").exists());
}

#[test]
fn ctrl_c_stops_every_workers_process_group_and_the_journal_stays_whole() {
    // The endpoints answer; every commit in between hangs, so all three workers are busy when Ctrl-C comes.
    let repo = linear(&modes(12, |i| match i {
        0 => ("clean", true),
        11 => ("fault", true),
        _ => ("hang-worker", true),
    }));
    let dir = repo.path.parent().unwrap().to_path_buf();
    let pids = dir.join("pids");
    std::fs::create_dir_all(&pids).unwrap();
    let config_path = config_file(
        &repo,
        "hang.toml",
        &[("PID_DIR", &pids)],
        "\n[search]\njobs = 3\n",
    );
    let child = Command::new(env!("CARGO_BIN_EXE_cudabisect"))
        .args(["start", &format!("{}..main", repo.commits[0]), "--config"])
        .arg(&config_path)
        .arg("-C")
        .arg(&repo.path)
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let pid_files = |prefix: &str| -> Vec<i32> {
        std::fs::read_dir(&pids)
            .map(|d| {
                d.flatten()
                    .filter(|e| e.file_name().to_string_lossy().starts_with(prefix))
                    .filter_map(|e| std::fs::read_to_string(e.path()).ok())
                    .filter_map(|t| t.trim().parse().ok())
                    .collect()
            })
            .unwrap_or_default()
    };
    interrupt_when(
        child,
        &pids,
        || pid_files("main.").len() >= 3 && pid_files("bg.").len() >= 3,
        "three workers never ran at once",
    );
    for pid in pid_files("main.").into_iter().chain(pid_files("bg.")) {
        assert!(!alive(pid), "a repro process ({pid}) of a worker survived");
    }
    let r = git2::Repository::open(&repo.path).unwrap();
    assert!(
        r.worktrees().unwrap().is_empty(),
        "worktrees left registered"
    );
    // The journal holds whole lines, and only probes that finished: the two endpoints.
    let journal = std::fs::read_to_string(repo.path.join(".git/cudabisect/journal.jsonl")).unwrap();
    let commits: Vec<String> = journal
        .lines()
        .map(|l| {
            /// The part of a journal line this test reads.
            #[derive(serde::Deserialize)]
            struct Line {
                commit: String,
            }
            serde_json::from_str::<Line>(l)
                .expect("a whole JSON line")
                .commit
        })
        .collect();
    let endpoints = [repo.commits[11].to_string(), repo.commits[0].to_string()];
    assert!(commits.iter().all(|c| endpoints.contains(c)), "{journal}");
}

/// Runs `start` over `repo` with `[search]` settings `search` and a counter directory for the coin modes.
fn coin_run(repo: &TestRepo, search: &str) -> Run {
    let dir = repo.path.parent().unwrap().to_path_buf();
    let coins = dir.join("coins");
    std::fs::create_dir_all(&coins).unwrap();
    let log = dir.join("probes.log");
    let config_path = config_file(
        repo,
        "coins.toml",
        &[("COIN_DIR", &coins), ("PROBE_LOG", &log)],
        &format!("\n[search]\n{search}"),
    );
    start_with_config(repo, &config_path, &[])
}

/// 40 commits; from 25 on, a repro that faults on about half the runs.
fn coin_repo() -> TestRepo {
    linear(&modes(40, |i| {
        if i >= 25 {
            ("coin", true)
        } else {
            ("clean", true)
        }
    }))
}

#[test]
fn a_flaky_fault_is_found_with_its_confidence_and_verified_against_its_parent() {
    let repo = coin_repo();
    let run = coin_run(
        &repo,
        "endpoint-runs = 6\nconfidence = 0.95\nmax-runs = 400\n",
    );
    assert_eq!(run.code, 0, "{}", run.stderr);
    assert_eq!(first_bad(&run), repo.commits[25].to_string());
    let report = run.report.as_ref().unwrap();
    let flaky = report.flaky.as_ref().expect("a flaky answer");
    assert!(flaky.reached, "{flaky:#?}");
    assert!(flaky.posterior >= 0.95, "{flaky:#?}");
    let p = flaky.p;
    assert!((0.2..0.8).contains(&p), "estimated p {p}");
    let runs = flaky.runs;
    assert!(runs < 400, "{runs} runs");
    let v = flaky.verification.as_ref().expect("a verification");
    assert_eq!(v.parent, repo.commits[24].to_string());
    assert!(v.separation >= 0.95, "{v:#?}");
    assert_eq!(v.parent_rate.0, 0, "the parent never faults: {v:#?}");
    assert!(
        run.stdout.contains("Flaky: the fault shows on about"),
        "{}",
        run.stdout
    );
    assert!(
        run.stdout.contains("Verified: the culprit faulted on"),
        "{}",
        run.stdout
    );
    // The git log of a flaky run marks only the verified answer: its runs contradict each other.
    let log = Command::new(env!("CARGO_BIN_EXE_cudabisect"))
        .args(["log", "--format", "git", "-C"])
        .arg(&repo.path)
        .output()
        .unwrap();
    let log = String::from_utf8_lossy(&log.stdout);
    assert!(log.contains("# a flaky fault"), "{log}");
    let marks: Vec<&str> = log
        .lines()
        .filter(|l| l.starts_with("git bisect "))
        .collect();
    assert_eq!(
        marks[marks.len() - 2..],
        [
            format!("git bisect good {}", repo.commits[24]),
            format!("git bisect bad {}", repo.commits[25])
        ],
        "{log}"
    );
}

#[test]
fn a_flaky_search_out_of_runs_lists_the_most_likely_commits_and_is_inconclusive() {
    let repo = coin_repo();
    let run = coin_run(
        &repo,
        "endpoint-runs = 7\nconfidence = 0.99\nmax-runs = 12\n",
    );
    assert_eq!(run.code, 4, "{}", run.stderr);
    let report = run.report.as_ref().unwrap();
    assert_eq!(report.result, RunResult::Ambiguous);
    let flaky = report.flaky.as_ref().expect("a flaky answer");
    assert!(!flaky.reached);
    assert!(flaky.verification.is_none());
    assert!(
        report.message.starts_with("a flaky fault: 12 runs spent"),
        "{}",
        report.message
    );
    assert!(!report.candidates.is_empty());
}

#[test]
fn a_plain_search_misled_by_a_clean_run_is_caught_at_the_parent_and_searched_again() {
    // The bad end faults every time, so the search starts plain; but every other bad commit runs clean
    // the first time, which sends plain bisection past the culprit. Its parent then faults.
    let repo = linear(&modes(30, |i| match i {
        29 => ("fault", true),
        15..=28 => ("lie-once", true),
        _ => ("clean", true),
    }));
    let run = coin_run(&repo, "endpoint-runs = 5\nconfidence = 0.95\n");
    assert_eq!(run.code, 0, "{}", run.stderr);
    assert_eq!(first_bad(&run), repo.commits[15].to_string());
    let report = run.report.as_ref().unwrap();
    assert!(
        report.flaky.as_ref().is_some_and(|f| f.reached),
        "{:#?}",
        report.flaky
    );
    assert!(
        run.stderr
            .contains("shows the fault too: a flaky fault after all"),
        "{}",
        run.stderr
    );
}

#[test]
fn a_flaky_search_with_several_workers_runs_its_rounds_and_verification_on_all_of_them() {
    let repo = coin_repo();
    let run = coin_run(
        &repo,
        "endpoint-runs = 6\nconfidence = 0.95\nmax-runs = 400\njobs = 3\n",
    );
    assert_eq!(run.code, 0, "{}", run.stderr);
    assert_eq!(first_bad(&run), repo.commits[25].to_string());
    let report = run.report.as_ref().unwrap();
    let flaky = report.flaky.as_ref().expect("a flaky answer");
    assert!(flaky.reached, "{flaky:#?}");
    assert!(flaky.verification.as_ref().unwrap().separation >= 0.95);
    let log = std::fs::read_to_string(repo.path.parent().unwrap().join("probes.log")).unwrap();
    let workers: std::collections::BTreeSet<&str> = log
        .lines()
        .filter_map(|l| l.split_whitespace().nth(1))
        .collect();
    assert_eq!(
        workers.into_iter().collect::<Vec<_>>(),
        ["1", "2", "3"],
        "{log}"
    );
}

#[test]
fn without_a_minimal_repro_the_bundle_reproduces_with_the_projects_own_repro_at_the_culprit() {
    let repo = faulting_from(12, 7);
    let before = snapshot(&repo.path);
    let run = cudabisect(&repo.path, &[&format!("{}..main", repo.commits[0])]);
    assert_eq!(run.code, 0, "{}", run.stderr);
    let bundle = PathBuf::from(run.report.as_ref().unwrap().bundle.as_deref().unwrap());
    let md = std::fs::read_to_string(bundle.join("REPORT.md")).unwrap();
    assert!(
        md.contains("No minimal repro: the repro is not a Python program"),
        "{md}"
    );
    // reproduce.sh, run from elsewhere against the project: it builds and runs the culprit in a fresh
    // clone, and the fault shows; the user's checkout is as it was.
    let elsewhere = tempfile::tempdir().unwrap();
    let out = Command::new(bundle.join("reproduce.sh"))
        .arg(&repo.path)
        .current_dir(elsewhere.path())
        .env("TMPDIR", elsewhere.path())
        .output()
        .unwrap();
    let text =
        String::from_utf8_lossy(&out.stdout).into_owned() + &String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(42), "{text}");
    assert!(text.contains("illegal memory access"), "{text}");
    assert!(
        text.contains(&repo.commits[7].to_string()),
        "it checks out the culprit: {text}"
    );
    assert_eq!(snapshot(&repo.path), before, "the user's checkout changed");
}

#[test]
fn a_sanitizer_report_of_random_bytes_is_unreadable_not_a_clean_run() {
    let tmp = tempfile::tempdir().unwrap();
    git2::Repository::init(tmp.path()).unwrap();
    // A fake compute-sanitizer: writes 4 KB of random bytes where the XML goes, runs the program.
    let fake = tmp.path().join("fake-cs");
    std::fs::write(
        &fake,
        "#!/bin/sh\nwhile [ \"$1\" != \"--save\" ]; do shift; done\nhead -c 4096 /dev/urandom > \"$2\"\nshift 2\nwhile [ \"${1#--}\" != \"$1\" ]; do shift 2; done\n\"$@\"\nexit 1\n",
    )
    .unwrap();
    std::fs::set_permissions(&fake, std::os::unix::fs::PermissionsExt::from_mode(0o755)).unwrap();
    std::fs::write(
        tmp.path().join("bisect.toml"),
        format!(
            "[repro]\ncommand = [\"true\"]\n[triage]\nsanitizer = \"{}\"\n",
            fake.display()
        ),
    )
    .unwrap();
    let out = Command::new(env!("CARGO_BIN_EXE_cudabisect"))
        .args(["triage", "-C"])
        .arg(tmp.path())
        .args([
            "--",
            "sh",
            "-c",
            "echo 'RuntimeError: CUDA error: unspecified launch failure'; exit 1",
        ])
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert_eq!(
        out.status.code(),
        Some(4),
        "{stdout}{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(
        stdout.contains("unreadable compute-sanitizer XML"),
        "{stdout}"
    );
}

/// `start --jobs 3` on a machine whose one GPU a stand-in `nvidia-smi` describes, its probes using
/// `peak_mib` of it: the run's human output and the probe log.
fn three_workers_on_one_gpu(peak_mib: u32) -> (Run, String) {
    let repo = faulting_from(24, 15);
    let dir = repo.path.parent().unwrap().to_path_buf();
    let bin_dir = dir.join("bin");
    std::fs::create_dir_all(&bin_dir).unwrap();
    std::fs::copy(
        Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/integration/fakes/nvidia_smi_one_gpu.sh"),
        bin_dir.join("nvidia-smi"),
    )
    .unwrap();
    let log = dir.join("probes.log");
    let config_path = config_file(&repo, "shared.toml", &[("PROBE_LOG", &log)], "");
    let range = format!("{}..main", repo.commits[0]);
    let report = dir.join("report.json");
    let out = Command::new(crate::common::bin())
        .args(["start", &range, "--jobs", "3", "--config"])
        .arg(&config_path)
        .arg("-C")
        .arg(&repo.path)
        .arg("--report")
        .arg(&report)
        .env(
            "PATH",
            format!("{}:{}", bin_dir.display(), std::env::var("PATH").unwrap()),
        )
        .env_remove("CUDA_VISIBLE_DEVICES")
        .env("FAKE_PEAK_MIB", peak_mib.to_string())
        .output()
        .unwrap();
    let run = Run {
        code: out.status.code().unwrap_or(-1),
        stdout: String::from_utf8_lossy(&out.stdout).into_owned(),
        stderr: String::from_utf8_lossy(&out.stderr).into_owned(),
        report: std::fs::read_to_string(&report)
            .ok()
            .map(|t| serde_json::from_str(&t).unwrap()),
    };
    assert_eq!(run.code, 0, "{}", run.stderr);
    assert_eq!(first_bad(&run), repo.commits[15].to_string());
    (run, std::fs::read_to_string(&log).unwrap())
}

#[test]
fn workers_share_one_gpu_as_far_as_the_memory_a_probe_used_allows() {
    // The first round's three probes (the bad end, the good end, the midpoint) took 6 GiB of 140
    // together: 2 GiB each, so all three at once, every worker on GPU 0 in a worktree of its own.
    let (run, log) = three_workers_on_one_gpu(400 + 3 * 2048);
    assert!(
        run.stderr
            .contains("note: 3 of 3 workers probe at once on GPU 0: the first round's 3 probes peaked at 2.0 GiB each, of the GPU's 140.4 GiB"),
        "{}",
        run.stderr
    );
    let mut worktrees = std::collections::BTreeSet::new();
    for line in log.lines() {
        let f: Vec<&str> = line.split_whitespace().collect();
        assert_eq!(f[2], "0", "{line}");
        worktrees.insert(f[3].to_string());
    }
    assert_eq!(worktrees.len(), 3, "{log}");
    // 117 GiB together, 39 GiB each: two at a time, and said.
    let (run, log) = three_workers_on_one_gpu(120_400);
    assert!(
        run.stderr.contains(
            "note: 2 of 3 workers probe at once on GPU 0: the first round's 3 probes peaked at 39.1 GiB each"
        ),
        "{}",
        run.stderr
    );
    assert!(log
        .lines()
        .all(|l| l.split_whitespace().nth(2) == Some("0")));
}

#[test]
fn the_bundle_asks_pytorch_for_its_environment_only_when_the_run_used_pytorch() {
    crate::common::require_python("import torch", "torch");
    let env_of = |mode: &'static str| {
        let repo = linear(&modes(6, |i| {
            if i >= 3 {
                (mode, true)
            } else {
                ("clean", true)
            }
        }));
        let run = cudabisect(&repo.path, &[&format!("{}..main", repo.commits[0])]);
        assert_eq!(run.code, 0, "{}", run.stderr);
        let bundle = PathBuf::from(run.report.as_ref().unwrap().bundle.as_deref().unwrap());
        let env: Environment = serde_json::from_str(
            &std::fs::read_to_string(bundle.join("environment.json")).unwrap(),
        )
        .unwrap();
        (env, run.stderr)
    };
    // A native fault: no torch in the run, no `collect_env` (seconds and hundreds of MiB).
    let (env, human) = env_of("fault");
    assert!(env.torch_collect_env.is_none(), "{env:#?}");
    assert!(!human.contains("collect_env"), "{human}");
    assert!(
        env.python
            .as_deref()
            .is_some_and(|p| p.starts_with("Python 3")),
        "{env:#?}"
    );
    // A PyTorch fault: its report is there.
    let (env, _) = env_of("torchfault");
    assert!(
        env.torch_collect_env
            .as_deref()
            .is_some_and(|t| t.contains("PyTorch version")),
        "{env:#?}"
    );
}
