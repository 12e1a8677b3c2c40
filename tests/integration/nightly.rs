//! `cudabisect nightly` night by night on a repository that grows: a baseline, clean nights, a regression
//! that is bisected, a night that still fails (no new bisection), a fix, and a first night that faults
//! without a last good commit. State, statuses, exit codes and JUnit (parsed) are checked each night.

use std::path::PathBuf;
use std::process::Command;

use crate::common::repo_builder::{put, Files, RepoBuilder};
use cudabisect::classify::FaultClass;
use cudabisect::report::record::{NightlyRecord, NightlyStatus, ProbeRole, Report, RunResult};
use cudabisect::run::nightly_state::{NightlyReport, NightlyState};
use git2::Oid;

/// A night's report, when it wrote one.
type Night = Option<NightlyReport>;

/// The night's record.
fn rec(r: &Night) -> &NightlyRecord {
    &r.as_ref().expect("a nightly report").nightly
}

/// The night's bisection.
fn bis(r: &Night) -> &Report {
    r.as_ref()
        .and_then(|n| n.bisect.as_ref())
        .expect("a bisection")
}

const REPRO: &str = "#!/bin/sh\nif [ \"$(cat mode.txt)\" = fault ]; then echo 'RuntimeError: CUDA error: an illegal memory access was encountered'; echo 'CUDA kernel errors might be asynchronously reported'; exit 1; fi\nif [ \"$(cat mode.txt)\" = assert ]; then echo 'RuntimeError: CUDA error: device-side assert triggered'; exit 1; fi\necho ok\n";
/// The notify hook writes what it was told next to the repository.
const CONFIG: &str = include_str!("fakes/nightly_config.toml");

struct Grower {
    _tmp: tempfile::TempDir,
    path: PathBuf,
    state: PathBuf,
    builder: RepoBuilder,
    commits: Vec<Oid>,
}

impl Grower {
    fn new() -> Self {
        let tmp = tempfile::tempdir().unwrap();
        let path = tmp.path().join("repo");
        let state = tmp.path().join("ci-cache");
        let builder = RepoBuilder::init(&path).unwrap();
        Grower {
            _tmp: tmp,
            path,
            state,
            builder,
            commits: Vec::new(),
        }
    }

    /// Adds commits (each `fault` or `clean`) on main and checks main out.
    fn grow(&mut self, modes: &[&str]) {
        for mode in modes {
            let i = self.commits.len();
            let mut f = Files::new();
            put(&mut f, "repro.sh", REPRO, true);
            put(&mut f, "mode.txt", *mode, false);
            put(&mut f, "bisect.toml", CONFIG, false);
            put(&mut f, "src.txt", format!("revision {i}\n"), false);
            let parents: Vec<Oid> = self.commits.last().copied().into_iter().collect();
            let c = self
                .builder
                .commit(&parents, &f, &format!("night commit {i}"))
                .unwrap();
            self.commits.push(c);
        }
        self.builder
            .set_branch("main", *self.commits.last().unwrap())
            .unwrap();
        self.builder.checkout_main().unwrap();
    }

    /// One night: (exit code, report, JUnit (failures, errors), stderr).
    fn night(&self, extra: &[&str]) -> (i32, Night, (String, String), String) {
        self.night_in(extra, None)
    }

    /// A night with `CI` set to `ci` (unset when `None`).
    fn night_in(&self, extra: &[&str], ci: Option<&str>) -> (i32, Night, (String, String), String) {
        let dir = self.path.parent().unwrap();
        let report = dir.join("night.json");
        let junit = dir.join("night.xml");
        let _ = std::fs::remove_file(&report);
        let _ = std::fs::remove_file(&junit);
        let out = Command::new(env!("CARGO_BIN_EXE_cudabisect"))
            .arg("nightly")
            .arg("-C")
            .arg(&self.path)
            .arg("--state")
            .arg(&self.state)
            .arg("--report")
            .arg(&report)
            .arg("--junit")
            .arg(&junit)
            .arg("--no-stages")
            .args(extra)
            .env_remove("GITHUB_STEP_SUMMARY")
            .env_remove("CI")
            .envs(ci.map(|v| ("CI", v)))
            .output()
            .unwrap();
        let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
        // A report that does not read as the crate's own type fails the test.
        let report: Night = std::fs::read_to_string(&report)
            .ok()
            .map(|t| serde_json::from_str(&t).expect("a nightly report"));
        let counts = std::fs::read_to_string(&junit)
            .ok()
            .map(|t| {
                let doc = roxmltree::Document::parse(&t).unwrap();
                let root = doc.root_element();
                (
                    root.attribute("failures").unwrap_or("").to_string(),
                    root.attribute("errors").unwrap_or("").to_string(),
                )
            })
            .unwrap_or_default();
        (out.status.code().unwrap_or(-1), report, counts, stderr)
    }

    fn sha(&self, i: usize) -> String {
        self.commits[i].to_string()
    }
}

fn zero() -> (String, String) {
    ("0".into(), "0".into())
}

#[test]
fn under_ci_a_good_night_exits_zero_and_a_regression_fails_the_step() {
    let mut g = Grower::new();
    g.grow(&["clean", "clean"]);
    let (code, r, _, err) = g.night_in(&[], Some("true"));
    assert_eq!(code, 0, "{err}");
    assert_eq!(rec(&r).status, NightlyStatus::Baseline);
    // The head is named as what it is, not as an endpoint of a range.
    assert!(err.contains("step 1 (head) · "), "{err}");
    assert!(!err.contains("candidates left"), "{err}");
    g.grow(&["fault"]);
    let (code, r, _, err) = g.night_in(&[], Some("true"));
    assert_eq!(code, 12, "{err}");
    assert_eq!(rec(&r).status, NightlyStatus::Regression);
    g.grow(&["clean"]);
    // The style asked for wins over the environment's, both ways.
    let (code, r, _, err) = g.night_in(&["--exit-codes", "detailed"], Some("true"));
    assert_eq!((code, rec(&r).status.as_str()), (11, "fixed"), "{err}");
    g.grow(&["fault"]);
    let (code, _, _, err) = g.night_in(&["--exit-codes", "ci"], Some("false"));
    assert_eq!(code, 12, "{err}");
    g.grow(&["clean"]);
    let (code, r, _, err) = g.night_in(&["--exit-codes", "ci"], None);
    assert_eq!((code, rec(&r).status.as_str()), (0, "fixed"), "{err}");
}

#[test]
fn five_nights_baseline_clean_regression_still_failing_fixed() {
    let mut g = Grower::new();
    g.grow(&["clean", "clean", "clean"]);
    let (code, r, junit, err) = g.night(&[]);
    assert_eq!(code, 10, "{err}");
    assert_eq!(rec(&r).status, NightlyStatus::Baseline);
    assert_eq!(rec(&r).last_good.as_deref(), Some(g.sha(2).as_str()));
    assert_eq!(junit, zero());

    g.grow(&["clean", "clean"]);
    let (code, r, junit, err) = g.night(&[]);
    assert_eq!(code, 0, "{err}");
    assert_eq!(rec(&r).status, NightlyStatus::Clean);
    assert_eq!(rec(&r).last_good.as_deref(), Some(g.sha(4).as_str()));
    assert_eq!(junit, zero());

    g.grow(&["clean", "fault", "fault"]);
    let (code, r, junit, err) = g.night(&[]);
    assert_eq!(code, 12, "{err}");
    assert_eq!(rec(&r).status, NightlyStatus::Regression);
    assert_eq!(
        rec(&r).first_bad.as_deref(),
        Some(g.sha(6).as_str()),
        "{r:#?}"
    );
    assert_eq!(rec(&r).open_since.as_deref(), Some(g.sha(7).as_str()));
    assert_eq!(rec(&r).last_good.as_deref(), Some(g.sha(4).as_str()));
    assert_eq!(bis(&r).result, RunResult::Found);
    // The night's own probe of the head is the bisection's bad endpoint, taken from the journal.
    assert_eq!(bis(&r).probes[0].role, ProbeRole::BadEndpoint);
    assert!(bis(&r).probes[0].reused, "{r:#?}");
    // And the last night's clean head is its good end, from the journal too: a clean run is clean
    // whatever the target.
    let good_end = bis(&r)
        .probes
        .iter()
        .find(|p| p.role == ProbeRole::GoodEndpoint)
        .unwrap();
    assert_eq!(good_end.commit, g.sha(4));
    assert!(good_end.reused, "{r:#?}");
    assert_eq!(junit, ("1".into(), "0".into()));
    let notes = g.path.parent().unwrap().join("notified.txt");
    let notified = || std::fs::read_to_string(&notes).unwrap_or_default();
    let report_path = g.path.parent().unwrap().join("night.json");
    assert_eq!(
        notified(),
        format!("regression {} {}\n", g.sha(6), report_path.display()),
        "[nightly] notify runs after a regression with its environment"
    );

    g.grow(&["fault", "fault"]);
    let (code, r, junit, err) = g.night(&[]);
    assert_eq!(code, 13, "{err}");
    assert_eq!(rec(&r).status, NightlyStatus::StillFailing);
    assert_eq!(rec(&r).nights_failing, 2);
    assert_eq!(rec(&r).first_bad.as_deref(), Some(g.sha(6).as_str()));
    assert!(
        r.as_ref().unwrap().bisect.is_none(),
        "no new bisection: {r:#?}"
    );
    assert_eq!(junit, ("1".into(), "0".into()));
    assert_eq!(
        notified().lines().count(),
        1,
        "no notification while still failing"
    );

    g.grow(&["clean"]);
    let (code, r, junit, err) = g.night(&[]);
    assert_eq!(code, 11, "{err}");
    assert_eq!(rec(&r).status, NightlyStatus::Fixed);
    assert_eq!(
        rec(&r).fixed_range,
        Some(format!("{}..{}", g.sha(9), g.sha(10)))
    );
    assert!(rec(&r).first_bad.is_none());
    assert_eq!(rec(&r).last_good.as_deref(), Some(g.sha(10).as_str()));
    assert_eq!(junit, zero());
    let fixed_line = format!("fixed  {}", report_path.display());
    assert_eq!(notified().lines().last(), Some(fixed_line.as_str()));

    g.grow(&["clean"]);
    let (code, r, _, err) = g.night(&[]);
    assert_eq!(code, 0, "{err}");
    assert_eq!(rec(&r).status, NightlyStatus::Clean);
    // The state is one JSON file per branch, config and machine, in the directory CI caches.
    let files: Vec<PathBuf> = std::fs::read_dir(&g.state)
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| !p.ends_with("journal.jsonl"))
        .collect();
    assert_eq!(files.len(), 1, "{files:?}");
    // The probe journal lives in the same cached directory, not in the clone.
    assert!(g.state.join("journal.jsonl").is_file());
    assert!(!g.path.join(".git/cudabisect/journal.jsonl").exists());
    let state: NightlyState =
        serde_json::from_str(&std::fs::read_to_string(&files[0]).unwrap()).unwrap();
    assert_eq!(state.last_good, Some(g.sha(11)));
    assert!(state.open.is_none());
}

#[test]
fn a_first_night_that_faults_needs_since_and_then_bisects_from_it() {
    let mut g = Grower::new();
    g.grow(&["clean", "clean", "fault", "fault"]);
    let (code, _, _, err) = g.night(&[]);
    assert_eq!(code, 2, "{err}");
    let errors: Vec<&str> = err.lines().filter(|l| l.starts_with("error:")).collect();
    assert_eq!(errors.len(), 1, "{err}");
    assert!(errors[0].contains("pass --since"), "{err}");
    // No state file: only the journal, whose record of the head the next night reuses.
    let state_files = |g: &Grower| -> Vec<PathBuf> {
        std::fs::read_dir(&g.state)
            .map(|d| d.map(|e| e.unwrap().path()).collect())
            .unwrap_or_default()
    };
    assert!(
        state_files(&g).iter().all(|p| p.ends_with("journal.jsonl")),
        "{:?}",
        state_files(&g)
    );
    let since = g.sha(0);
    let (code, r, _, err) = g.night(&["--since", &since]);
    assert_eq!(code, 12, "{err}");
    assert_eq!(rec(&r).first_bad.as_deref(), Some(g.sha(2).as_str()));
}

#[test]
fn another_bug_on_top_of_an_open_one_is_bisected_from_the_last_head_that_showed_only_the_older() {
    let mut g = Grower::new();
    g.grow(&["clean", "clean"]);
    assert_eq!(g.night(&[]).0, 10);
    g.grow(&["clean", "fault", "fault"]);
    let (code, r, _, err) = g.night(&[]);
    assert_eq!(code, 12, "{err}");
    assert_eq!(rec(&r).first_bad.as_deref(), Some(g.sha(3).as_str()));
    // Night 3: a device-side assert now fires before the illegal access.
    g.grow(&["assert", "assert"]);
    let (code, r, junit, err) = g.night(&[]);
    assert_eq!(code, 12, "a different bug is a new regression: {err}");
    assert_eq!(rec(&r).status, NightlyStatus::Regression);
    assert_eq!(
        rec(&r).first_bad.as_deref(),
        Some(g.sha(5).as_str()),
        "{r:#?}"
    );
    assert_eq!(rec(&r).signature.class, FaultClass::DeviceAssert);
    assert_eq!(
        bis(&r).good[0],
        g.sha(4).as_str(),
        "bisected from the last head with only the older bug"
    );
    assert_eq!(junit, ("1".into(), "0".into()));
    // The same assert the next night is still failing, not a new bisection.
    g.grow(&["assert"]);
    let (code, r, _, err) = g.night(&[]);
    assert_eq!(code, 13, "{err}");
    assert_eq!(rec(&r).first_bad.as_deref(), Some(g.sha(5).as_str()));
}

/// A repro wrapper that counts its runs and SIGKILLs cudabisect (its parent) on the run named in
/// `kill_at.txt`.
const KILLING_REPRO: &str = include_str!("fakes/nightly_killing_repro.sh");

/// A grower with an outside config whose repro goes through the killing wrapper; returns the
/// `--config` arguments' path and the counter directory.
fn killing(g: &Grower) -> (String, PathBuf) {
    let dir = g.path.parent().unwrap().join("kill");
    std::fs::create_dir_all(&dir).unwrap();
    std::fs::write(dir.join("wrapper.sh"), KILLING_REPRO).unwrap();
    let cfg = dir.join("kill.toml");
    std::fs::write(
        &cfg,
        format!(
            "[repro]\ncommand = [\"sh\", \"{}\"]\ntimeout = \"30s\"\nenv = {{ STATE = \"{}\" }}\n\n[triage]\nenabled = false\n",
            dir.join("wrapper.sh").display(),
            dir.display()
        ),
    )
    .unwrap();
    (cfg.display().to_string(), dir)
}

fn count(dir: &std::path::Path) -> usize {
    std::fs::read_to_string(dir.join("count.txt"))
        .ok()
        .and_then(|t| t.trim().parse().ok())
        .unwrap_or(0)
}

#[test]
fn a_night_killed_at_any_run_resumes_with_at_most_that_run_redone() {
    let nights = |g: &mut Grower, cfg: &str| {
        g.grow(&["clean", "clean"]);
        assert_eq!(g.night(&["--config", cfg]).0, 10);
        g.grow(&[
            "clean", "clean", "clean", "fault", "fault", "fault", "fault",
        ]);
    };
    // The whole regression night, uninterrupted: how many repro runs it takes.
    let mut g = Grower::new();
    let (cfg, dir) = killing(&g);
    nights(&mut g, &cfg);
    let before = count(&dir);
    let (code, r, _, err) = g.night(&["--config", &cfg]);
    assert_eq!(code, 12, "{err}");
    let expected = rec(&r).first_bad.clone();
    assert_eq!(expected, Some(g.sha(5)));
    let total = count(&dir) - before;
    assert!(total >= 3, "{total}");

    for k in 1..=total {
        let mut g = Grower::new();
        let (cfg, dir) = killing(&g);
        nights(&mut g, &cfg);
        let before = count(&dir);
        std::fs::write(dir.join("kill_at.txt"), (before + k).to_string()).unwrap();
        let (code, _, _, _) = g.night(&["--config", &cfg]);
        assert_eq!(code, -1, "killed at run {k} of the night");
        let (code, r, junit, err) = g.night(&["--config", &cfg]);
        assert_eq!(code, 12, "resumed after a kill at run {k}: {err}");
        assert_eq!(rec(&r).first_bad, expected, "kill at {k}");
        assert_eq!(junit, ("1".into(), "0".into()));
        let runs = count(&dir) - before;
        assert!(
            runs <= total + 1,
            "kill at {k}: {runs} runs in all, {total} uninterrupted"
        );
    }
}

#[test]
fn a_night_cut_short_resumes_in_a_fresh_clone_from_the_cached_state() {
    let mut g = Grower::new();
    let (cfg, dir) = killing(&g);
    g.grow(&["clean", "clean"]);
    assert_eq!(g.night(&["--config", &cfg]).0, 10);
    g.grow(&[
        "clean", "clean", "clean", "fault", "fault", "fault", "fault",
    ]);
    // Killed at the third repro run of the regression night: the head and two more probes are journaled.
    std::fs::write(dir.join("kill_at.txt"), (count(&dir) + 3).to_string()).unwrap();
    assert_eq!(g.night(&["--config", &cfg]).0, -1);
    // The next job: a fresh clone (no .git/cudabisect), the same cached state directory.
    let clone = g.path.parent().unwrap().join("fresh-clone");
    let status = Command::new("git")
        .args(["clone", "--quiet"])
        .arg(&g.path)
        .arg(&clone)
        .status()
        .unwrap();
    assert!(status.success());
    let report = g.path.parent().unwrap().join("fresh.json");
    let out = Command::new(env!("CARGO_BIN_EXE_cudabisect"))
        .args(["nightly", "--no-stages", "--config", &cfg, "-C"])
        .arg(&clone)
        .arg("--state")
        .arg(&g.state)
        .arg("--report")
        .arg(&report)
        .output()
        .unwrap();
    assert_eq!(
        out.status.code(),
        Some(12),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let r: Night = Some(serde_json::from_str(&std::fs::read_to_string(&report).unwrap()).unwrap());
    assert_eq!(rec(&r).first_bad.as_deref(), Some(g.sha(5).as_str()));
    let reused = bis(&r).probes.iter().filter(|p| p.reused).count();
    assert!(
        reused >= 2,
        "the killed night's probes are reused in the fresh clone: {r:#?}"
    );
}

#[test]
fn a_force_push_without_gc_is_bisected_from_the_merge_base_and_branch_takes_only_branch_names() {
    let mut g = Grower::new();
    g.grow(&["clean", "clean"]);
    let (code, _, _, err) = g.night(&[]);
    assert_eq!(code, 10, "{err}");
    // Force-push: main now grows from commit 0; commit 1, the last good, still exists but left the branch.
    g.commits.truncate(1);
    g.grow(&["clean", "fault"]);
    let (code, r, _, err) = g.night(&[]);
    assert_eq!(code, 12, "{err}");
    assert_eq!(
        rec(&r).first_bad.as_deref(),
        Some(g.sha(2).as_str()),
        "{err}"
    );
    assert!(err.contains("merge base"), "{err}");
    // `--branch` is a branch name or a full ref name of one, never a revision or a tag.
    for revision in ["main~1", "HEAD", &g.sha(1)] {
        let (code, _, _, err) = g.night(&["--branch", revision]);
        assert_eq!(code, 2, "{revision}: {err}");
        assert!(err.contains("is not a branch"), "{err}");
    }
    let (code, r, _, err) = g.night(&["--branch", "refs/heads/main"]);
    assert_eq!(code, 13, "the same state as `main`: {err}");
    assert_eq!(rec(&r).branch, "main", "{r:?}");
}

/// Runs the GitHub Action's script (action/run.sh) as the action runs it: inputs as `INPUT_*`, the real
/// binary on `PATH`, GitHub's output and summary files. Returns (exit code, outputs, summary, stderr).
fn action(g: &Grower, inputs: &[(&str, &str)]) -> (i32, String, String, String) {
    let dir = g.path.parent().unwrap();
    let outputs = dir.join("github_output");
    let summary = dir.join("step_summary");
    let _ = std::fs::remove_file(&outputs);
    let _ = std::fs::remove_file(&summary);
    let bin_dir = std::path::Path::new(env!("CARGO_BIN_EXE_cudabisect"))
        .parent()
        .unwrap();
    let path = format!(
        "{}:{}",
        bin_dir.display(),
        std::env::var("PATH").unwrap_or_default()
    );
    let script = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("action/run.sh");
    let mut cmd = Command::new("bash");
    cmd.arg(&script)
        .current_dir(&g.path)
        .env("PATH", path)
        .env("GITHUB_OUTPUT", &outputs)
        .env("GITHUB_STEP_SUMMARY", &summary)
        .env("INPUT_STATE", &g.state)
        .env("INPUT_OUTPUT_DIR", dir.join("out"))
        .env("CI", "true");
    for (k, v) in inputs {
        cmd.env(format!("INPUT_{k}"), v);
    }
    let out = cmd.output().unwrap();
    let read = |p: &std::path::Path| std::fs::read_to_string(p).unwrap_or_default();
    (
        out.status.code().unwrap_or(-1),
        read(&outputs),
        read(&summary),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

#[test]
fn the_github_actions_script_runs_nights_and_a_pull_requests_bisection() {
    let mut g = Grower::new();
    g.grow(&["clean", "clean"]);
    let (code, outputs, summary, err) = action(&g, &[("COMMAND", "nightly")]);
    assert_eq!(code, 0, "a good first night passes the step: {err}");
    assert!(outputs.contains("exit-code=0\n"), "{outputs}");
    assert!(
        summary.contains("## cudabisect nightly: baseline"),
        "{summary}"
    );
    let out = g.path.parent().unwrap().join("out");
    assert!(out.join("junit.xml").is_file() && out.join("report.json").is_file());

    g.grow(&["clean", "fault", "fault"]);
    let (code, outputs, summary, err) = action(&g, &[("COMMAND", "nightly")]);
    assert_eq!(code, 12, "a regression fails the step: {err}");
    assert!(
        outputs.contains(&format!("first-bad={}\n", g.sha(3))),
        "{outputs}"
    );
    assert!(summary.contains("regression"), "{summary}");

    // A pull request's bisection, from its base; extra options pass through as written.
    let range = format!("{}..{}", g.sha(2), g.sha(4));
    let (code, outputs, summary, err) = action(
        &g,
        &[
            ("COMMAND", "start"),
            ("RANGE", &range),
            ("ARGS", "--no-triage --jobs 1"),
        ],
    );
    assert_eq!(code, 0, "{err}");
    assert!(err.contains("--no-triage --jobs 1"), "{err}");
    assert!(
        outputs.contains(&format!("first-bad={}\n", g.sha(3))),
        "{outputs}"
    );
    assert!(summary.contains(&g.sha(3)[..12]), "{summary}");
    let bundle = outputs
        .lines()
        .find_map(|l| l.strip_prefix("bundle="))
        .unwrap();
    assert!(
        bundle.ends_with("cudabisect-bundle.tar.gz") && std::path::Path::new(bundle).is_file(),
        "{outputs}"
    );

    // A bad input: exit 2, one line, nothing run.
    let (code, _, _, err) = action(&g, &[("COMMAND", "start")]);
    assert_eq!(code, 2, "{err}");
    assert_eq!(err.lines().count(), 1, "{err}");
}

/// action.yml hands the script every input it reads, and declares every input it hands on.
#[test]
fn the_action_declares_every_input_its_script_reads() {
    let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR"));
    let action = std::fs::read_to_string(root.join("action.yml")).unwrap();
    let script = std::fs::read_to_string(root.join("action/run.sh")).unwrap();
    let read: std::collections::BTreeSet<String> = regex::Regex::new(r"INPUT_([A-Z_]+)")
        .unwrap()
        .captures_iter(&script)
        .map(|c| c[1].to_string())
        .collect();
    assert!(read.len() >= 8, "{read:?}");
    for name in read {
        let input = name.to_lowercase().replace('_', "-");
        assert!(
            action.contains(&format!("INPUT_{name}: ${{{{ inputs.{input} }}}}")),
            "action.yml does not pass INPUT_{name}"
        );
        assert!(
            action.contains(&format!("\n  {input}:\n")),
            "action.yml does not declare {input}"
        );
    }
}

/// Every directory under the state's `runs/`, by name.
fn run_dirs(state: &std::path::Path) -> Vec<String> {
    let mut names: Vec<String> = std::fs::read_dir(state.join("runs"))
        .map(|d| {
            d.filter_map(Result::ok)
                .map(|e| e.file_name().to_string_lossy().into_owned())
                .collect()
        })
        .unwrap_or_default();
    names.sort();
    names
}

#[test]
fn ctrl_c_during_the_heads_probe_says_interrupted_once_and_the_next_night_leaves_no_debris() {
    let mut g = Grower::new();
    g.grow(&["clean", "clean"]);
    let state = g.path.join(".git").join("cudabisect");
    // The repro announces itself in `started/` and waits: the night is stopped while its head runs.
    let dir = g.path.parent().unwrap().join("slow");
    let started = dir.join("started");
    std::fs::create_dir_all(&started).unwrap();
    let cfg = dir.join("slow.toml");
    std::fs::write(
        &cfg,
        format!(
            "[repro]\ncommand = 'if [ -e {stop} ]; then touch {started}/$$; sleep 60; fi; echo ok'\ntimeout = \"90s\"\n\n[triage]\nenabled = false\n",
            stop = dir.join("slow.flag").display(),
            started = started.display()
        ),
    )
    .unwrap();
    std::fs::write(dir.join("slow.flag"), "").unwrap();
    let child = Command::new(env!("CARGO_BIN_EXE_cudabisect"))
        .args(["nightly", "--no-stages", "--config"])
        .arg(&cfg)
        .arg("-C")
        .arg(&g.path)
        .arg("--state")
        .arg(&g.state)
        .env_remove("CI")
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    crate::common::wait_for_files(
        &started,
        std::time::Duration::from_secs(60),
        "the head's repro never started",
        || std::fs::read_dir(&started).is_ok_and(|mut d| d.next().is_some()),
    );
    // SAFETY: signals our own child.
    unsafe { libc::kill(child.id() as i32, libc::SIGINT) };
    let out = child.wait_with_output().unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(130), "{stderr}");
    assert_eq!(
        stderr.trim().lines().last(),
        Some("error: interrupted before anything was found"),
        "{stderr}"
    );
    let stopped = run_dirs(&state);
    assert_eq!(stopped.len(), 1, "the stopped night's directory");

    // The next night runs whole: the stopped one's directory, which holds nothing anyone refers to,
    // is gone; this night's stays.
    std::fs::remove_file(dir.join("slow.flag")).unwrap();
    let (code, r, _, stderr) = g.night(&["--config", cfg.to_str().unwrap()]);
    assert_eq!(code, 10, "{stderr}");
    assert_eq!(rec(&r).status, NightlyStatus::Baseline, "{stderr}");
    let left = run_dirs(&state);
    assert_eq!(left.len(), 1, "{left:?}");
    assert_ne!(left, stopped, "the stopped night's directory is gone");
}
