//! Shrinking end to end through the real binary on the CPU reference: the fixture models shrink to
//! exactly the nodes they need, a candidate failing another way is rejected, and `start` shrinks at the
//! first bad commit and checks the minimal subgraph at its parent.

use std::path::{Path, PathBuf};
use std::process::Command;

use crate::common::repo_builder::{put, Files, RepoBuilder};
use crate::common::{bin, first_bad, kept, shrink, shrink_of, start_report};
use cudabisect::classify::FaultClass;
use cudabisect::report::record::{ParentCheck, Report, ShrinkStatus};

fn fixture(name: &str) -> String {
    std::fs::read_to_string(
        Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("fixtures/models")
            .join(name),
    )
    .unwrap()
}

fn config(shrink: &str) -> String {
    format!(
        "[repro]\ncommand = [\"{}\", \"harness\", \"run\", \"model.toml\", \"--backend\", \"cpu\"]\ntimeout = \"30s\"\n\n[triage]\nenabled = false\n\n[shrink]\n{shrink}\n",
        bin()
    )
}

fn repo_with(
    model: &str,
    shrink: &str,
    extra: &[(&str, &str, bool)],
) -> (tempfile::TempDir, PathBuf) {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("repo");
    let mut b = RepoBuilder::init(&dir).unwrap();
    let mut f = Files::new();
    put(&mut f, "model.toml", model, false);
    put(&mut f, "bisect.toml", config(shrink), false);
    for (p, c, x) in extra {
        put(&mut f, p, *c, *x);
    }
    let c = b.commit(&[], &f, "model").unwrap();
    b.set_branch("main", c).unwrap();
    b.checkout_main().unwrap();
    (tmp, dir)
}

#[test]
fn each_fixture_shrinks_to_exactly_the_nodes_it_needs() {
    for (file, want, nodes) in [
        ("shrink_one_node.toml", vec!["b2_lookup"], 24),
        (
            "shrink_two_nodes.toml",
            vec!["b1_cache_update", "b3_slot_lookup"],
            32,
        ),
        ("shrink_residual.toml", vec!["route"], 20),
    ] {
        let (_tmp, dir) = repo_with(
            &fixture(file),
            "model = \"model.toml\"\nbackend = \"cpu\"\nconfirm = 3",
            &[],
        );
        let (code, r, out) = shrink(&dir, &[]);
        assert_eq!(code, 0, "{file}: {out}");
        assert_eq!(kept(&r), want, "{file}");
        assert_eq!(r.nodes_before, nodes, "{file}");
        assert_eq!(r.status, ShrinkStatus::Minimal);
        assert_eq!(
            r.signature.as_ref().map(|s| s.class),
            Some(FaultClass::IllegalAddress)
        );
        assert_eq!(r.confirmation.as_ref().map(|c| c.reproduced), Some(3));
        let bound = (usize::BITS - (nodes - 1usize).leading_zeros()) as u64 + 3;
        if want.len() == 1 {
            assert!(
                (r.runs_to_minimal as u64) <= bound,
                "{file}: {}",
                r.runs_to_minimal
            );
        }
        // The extracted minimal model reproduces on its own.
        let model = r.minimal_model.as_deref().unwrap();
        let run = Command::new(bin())
            .args(["harness", "run", model, "--backend", "cpu"])
            .output()
            .unwrap();
        assert_eq!(
            run.status.code(),
            Some(1),
            "{file}: minimal model does not fault"
        );
        let text = String::from_utf8_lossy(&run.stdout);
        assert!(text.contains("illegal memory access"), "{text}");
        assert!(
            r.reproduce.as_deref().unwrap().contains("harness run"),
            "{:?}",
            r.reproduce
        );
    }
}

#[test]
fn a_candidate_that_fails_another_way_is_rejected() {
    // A harness wrapper that reports an OOM for any candidate without b1_mm: a different bug, which must
    // not count as reproducing, so b1_mm is kept.
    let wrapper = format!(
        "#!/bin/sh\ncase \"$*\" in\n  run*--keep*) case \"$*\" in *b1_mm*) ;; *) echo 'RuntimeError: CUDA out of memory. Tried to allocate 2.00 GiB'; exit 1 ;; esac ;;\nesac\nexec \"{}\" harness --model model.toml --backend cpu \"$@\"\n",
        bin()
    );
    let (_tmp, dir) = repo_with(
        &fixture("shrink_one_node.toml"),
        "harness = [\"./harness.sh\"]\nconfirm = 2",
        &[("harness.sh", &wrapper, true)],
    );
    let (code, r, out) = shrink(&dir, &[]);
    assert_eq!(code, 0, "{out}");
    assert_eq!(kept(&r), vec!["b1_mm", "b2_lookup"]);
    assert!(!r.rejected.is_empty());
    assert!(
        r.rejected
            .iter()
            .all(|x| x.class == FaultClass::OutOfMemory),
        "{:?}",
        r.rejected
    );
}

#[test]
fn a_model_that_does_not_fault_is_reported_not_shrunk() {
    let (_tmp, dir) = repo_with(
        &fixture("mlp.toml"),
        "model = \"model.toml\"\nbackend = \"cpu\"",
        &[],
    );
    let (code, r, out) = shrink(&dir, &[]);
    assert_eq!(code, 3, "{out}");
    assert_eq!(r.status, ShrinkStatus::NotReproduced);
    assert!(r.summary.contains("not a fault"), "{}", r.summary);
}

#[test]
fn shrink_config_errors_are_one_line_and_exit_2() {
    let (_tmp, dir) = repo_with(
        &fixture("mlp.toml"),
        "model = \"model.toml\"\nharness = [\"x\"]",
        &[],
    );
    let (code, done, out) = crate::common::shrink_run(&dir, &[]);
    assert_eq!((code, done.is_none()), (2, true), "{out}");
    assert!(
        out.contains("[shrink] give either harness or model, not both"),
        "{out}"
    );
    let (_tmp, dir) = repo_with(
        &fixture("mlp.toml"),
        "model = \"model.toml\"\nbackend = \"tpu\"",
        &[],
    );
    let (code, done, out) = crate::common::shrink_run(&dir, &[]);
    assert_eq!((code, done.is_none()), (2, true), "{out}");
    assert!(
        out.contains("unknown variant `tpu`, expected one of `cuda`, `cpu`, `auto`"),
        "{out}"
    );
}

/// Twelve commits of `shrink_one_node.toml` with `config` as bisect.toml, tagged `good` at the first:
/// from the eighth on (the culprit, returned) a lookup leaves its table.
fn one_node_regression(dir: &Path, config: &str) -> git2::Oid {
    let mut b = RepoBuilder::init(dir).unwrap();
    let bad_model = fixture("shrink_one_node.toml");
    // Before the regression the lookup ids stay inside the table.
    let good_model = bad_model.replace("268435456]", "15]");
    assert_ne!(good_model, bad_model);
    let mut parent = None;
    let mut culprit = None;
    for i in 0..12 {
        let mut f = Files::new();
        put(
            &mut f,
            "model.toml",
            if i < 7 { &good_model } else { &bad_model },
            false,
        );
        put(&mut f, "bisect.toml", config, false);
        put(&mut f, "notes.txt", format!("change {i}\n"), false);
        let c = b
            .commit(parent.as_slice(), &f, &format!("change {i}"))
            .unwrap();
        if i == 0 {
            b.tag("good", c).unwrap();
        }
        if i == 7 {
            culprit = Some(c);
        }
        parent = Some(c);
    }
    b.set_branch("main", parent.unwrap()).unwrap();
    b.checkout_main().unwrap();
    culprit.unwrap()
}

#[test]
fn start_shrinks_at_the_first_bad_commit_and_the_parent_passes() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("repo");
    let culprit = one_node_regression(
        &dir,
        &config("model = \"model.toml\"\nbackend = \"cpu\"\nconfirm = 2"),
    );
    let (code, r, text) = start_report(&dir, &["good..main"], tmp.path());
    assert_eq!(code, 0, "{text}");
    let r = r.unwrap_or_else(|| panic!("no report: {text}"));
    assert_eq!(first_bad(&r), Some(culprit.to_string()));
    assert_eq!(kept(shrink_of(&r, &text)), vec!["b2_lookup"]);
    assert_eq!(shrink_of(&r, &text).parent_check, Some(ParentCheck::Passed));
    assert!(text.contains("Shrink: 1 of 24 nodes (b2_lookup)"), "{text}");

    let (code, r, text) = start_report(&dir, &["good..main", "--no-shrink"], tmp.path());
    assert_eq!(code, 0);
    let r = r.unwrap_or_else(|| panic!("no report: {text}"));
    assert!(r.shrink.is_none());
}

/// A chain of `n` relus whose last node gathers with an out-of-range id: a large `describe`.
fn long_chain(n: usize) -> String {
    let mut m = String::from(
        "[model]\nname = \"chain\"\n\n[[tensor]]\nname = \"x0\"\nshape = [4, 8]\ninit = \"random\"\n\n[[tensor]]\nname = \"ids\"\nshape = [2]\ndtype = \"i32\"\ninit = \"values\"\nvalues = [0, 99]\n",
    );
    for i in 0..n {
        m.push_str(&format!(
            "\n[[node]]\nid = \"relu_{i}\"\nop = \"relu\"\ninputs = [\"x{i}\"]\noutputs = [\"x{}\"]\n",
            i + 1
        ));
    }
    m.push_str(&format!(
        "\n[[node]]\nid = \"lookup\"\nop = \"embedding\"\ninputs = [\"x{n}\", \"ids\"]\noutputs = [\"y\"]\n"
    ));
    m
}

#[test]
fn a_description_of_thousands_of_nodes_goes_through_whole() {
    // About 2.7 MB of description: far past what the bounded log capture keeps.
    let (_tmp, dir) = repo_with(
        &long_chain(6000),
        "model = \"model.toml\"\nbackend = \"cpu\"\nconfirm = 1\ncheck-parent = false",
        &[],
    );
    let (code, report, out) = shrink(&dir, &[]);
    assert_eq!(code, 0, "{out}");
    assert_eq!(report.nodes_before, 6001, "{out}");
    assert_eq!(kept(&report), ["lookup"]);
}

/// A harness of the user's own: writes the description where `--out` says, prints noise around it, and
/// runs by delegating to the native harness.
fn own_harness(description: &str) -> String {
    format!(
        r#"#!/bin/sh
verb=$1; shift
if [ "$verb" = describe ]; then
  echo "warning: }}"; echo "loading {{" >&2
  [ "$1" = --out ] || {{ echo "no --out"; exit 3; }}
  cat > "$2" <<'JSON'
{description}
JSON
  exit 0
fi
exec "$CUDABISECT_BIN" harness --model model.toml --backend cpu "$verb" "$@"
"#
    )
}

#[test]
fn the_description_channel_ignores_noise_and_checks_the_protocol_version() {
    let native = Command::new(bin())
        .args(["harness", "describe"])
        .arg(Path::new(env!("CARGO_MANIFEST_DIR")).join("fixtures/models/shrink_one_node.toml"))
        .output()
        .unwrap();
    let description = String::from_utf8_lossy(&native.stdout).into_owned();
    let shrink_cfg = format!(
        "harness = [\"./own_harness.sh\"]\nconfirm = 1\ncheck-parent = false\nenv = {{ CUDABISECT_BIN = \"{}\" }}",
        bin()
    );
    let (_tmp, dir) = repo_with(
        &fixture("shrink_one_node.toml"),
        &shrink_cfg,
        &[("own_harness.sh", &own_harness(&description), true)],
    );
    let (code, report, out) = shrink(&dir, &[]);
    assert_eq!(code, 0, "{out}");
    assert_eq!(kept(&report), ["b2_lookup"]);

    let old = description.replace("\"protocol\": 2", "\"protocol\": 1");
    let (_tmp, dir) = repo_with(
        &fixture("shrink_one_node.toml"),
        &shrink_cfg,
        &[("own_harness.sh", &own_harness(&old), true)],
    );
    let (code, report, out) = shrink(&dir, &[]);
    assert_eq!(code, 2, "{out}");
    assert!(
        report
            .summary
            .contains("the harness speaks protocol 1, cudabisect speaks 2"),
        "{report:#?}"
    );
}

/// A harness that delegates to the native one and, on the call named in `kill_at.txt`, SIGKILLs
/// cudabisect (its parent), as a preempted runner would, in the middle of the shrink stage.
const KILLING_HARNESS: &str = include_str!("fakes/shrink_e2e_killing_harness.sh");

/// A repository whose change 5 makes the model fault, with the killing harness configured.
fn regression_with_killing_harness() -> (tempfile::TempDir, PathBuf, PathBuf, String) {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("repo");
    let state = tmp.path().join("state");
    std::fs::create_dir_all(&state).unwrap();
    let wrapper = state.join("harness.sh");
    std::fs::write(&wrapper, KILLING_HARNESS).unwrap();
    let bad_model = fixture("shrink_one_node.toml");
    let good_model = bad_model.replace("268435456]", "15]");
    let shrink_cfg = format!(
        "harness = [\"sh\", \"{}\"]\nconfirm = 2\nenv = {{ CUDABISECT_BIN = \"{}\", STATE = \"{}\" }}",
        wrapper.display(),
        bin(),
        state.display()
    );
    let mut b = RepoBuilder::init(&dir).unwrap();
    let mut parent = None;
    let mut culprit = String::new();
    for i in 0..8 {
        let mut f = Files::new();
        put(
            &mut f,
            "model.toml",
            if i < 5 { &good_model } else { &bad_model },
            false,
        );
        put(&mut f, "bisect.toml", config(&shrink_cfg), false);
        put(&mut f, "notes.txt", format!("change {i}\n"), false);
        let c = b
            .commit(parent.as_slice(), &f, &format!("change {i}"))
            .unwrap();
        if i == 0 {
            b.tag("good", c).unwrap();
        }
        if i == 5 {
            culprit = c.to_string();
        }
        parent = Some(c);
    }
    b.set_branch("main", parent.unwrap()).unwrap();
    b.checkout_main().unwrap();
    (tmp, dir, state, culprit)
}

fn start_json(dir: &Path) -> (Option<i32>, Option<Report>) {
    let report = dir.parent().unwrap().join("report.json");
    let _ = std::fs::remove_file(&report);
    let out = Command::new(bin())
        .args(["start", "good..main", "-C"])
        .arg(dir)
        .arg("--report")
        .arg(&report)
        .output()
        .unwrap();
    let r = std::fs::read_to_string(&report)
        .ok()
        .map(|t| serde_json::from_str(&t).unwrap_or_else(|e| panic!("not a report ({e}): {t}")));
    (out.status.code(), r)
}

fn harness_calls(state: &Path) -> usize {
    std::fs::read_to_string(state.join("count.txt"))
        .ok()
        .and_then(|t| t.trim().parse().ok())
        .unwrap_or(0)
}

#[test]
fn a_run_killed_during_the_shrink_resumes_with_the_search_reused_and_the_same_answer() {
    let (_tmp, dir, state, culprit) = regression_with_killing_harness();
    let (code, full) = start_json(&dir);
    assert_eq!(code, Some(0), "{full:#?}");
    let full = full.expect("a report");
    assert_eq!(first_bad(&full), Some(culprit.clone()));
    assert_eq!(kept(shrink_of(&full, "")), vec!["b2_lookup"]);
    let total = harness_calls(&state);
    assert!(total >= 4, "{total}");

    for kill_at in 1..=total {
        let (_tmp, dir, state, culprit) = regression_with_killing_harness();
        std::fs::write(state.join("kill_at.txt"), kill_at.to_string()).unwrap();
        let (code, _) = start_json(&dir);
        assert_eq!(code, None, "killed by a signal at harness call {kill_at}");
        let (code, r) = start_json(&dir);
        assert_eq!(
            code,
            Some(0),
            "resumed after a kill at harness call {kill_at}: {r:#?}"
        );
        let r = r.expect("a report");
        assert_eq!(first_bad(&r), Some(culprit.clone()));
        assert_eq!(
            kept(shrink_of(&r, "")),
            vec!["b2_lookup"],
            "kill at {kill_at}"
        );
        assert!(
            r.probes.iter().all(|p| p.reused),
            "the search finished before the kill: every probe is reused (kill at {kill_at})"
        );
    }
}

/// The files of a bundle, by path inside it, leaving out the probe logs (how many probes ran, and on which
/// worker, differs with the number of workers) and what records times.
fn bundle_files(bundle: &Path) -> Vec<String> {
    fn walk(root: &Path, dir: &Path, out: &mut Vec<String>) {
        for e in std::fs::read_dir(dir).unwrap().flatten() {
            let p = e.path();
            let rel = p.strip_prefix(root).unwrap().display().to_string();
            if rel == "logs/probes" {
                continue;
            }
            if p.is_dir() {
                walk(root, &p, out);
            } else {
                out.push(rel);
            }
        }
    }
    let mut out = Vec::new();
    walk(bundle, bundle, &mut out);
    out.sort();
    out
}

#[test]
fn triage_and_the_shrink_side_by_side_give_the_same_report_and_bundle_as_one_after_the_other() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("repo");
    // A sanitizer that, when asked to, waits until the shrink has begun (its directory under the run's):
    // it ends only if the two stages run at the same time. It says whether it saw the shrink.
    let wait_flag = tmp.path().join("wait-for-shrink");
    let saw = tmp.path().join("saw");
    let sanitizer = tmp.path().join("sanitizer.sh");
    std::fs::write(
        &sanitizer,
        format!(
            "#!/bin/sh\nwhile [ $# -gt 0 ]; do case \"$1\" in --tool|--save|--print-limit|--error-exitcode|--show-backtrace) shift 2 ;; --xml) shift ;; *) break ;; esac; done\n\
             if [ -e {flag} ]; then i=0; while [ $i -lt 400 ]; do ls -d ../runs/*/shrink/* >/dev/null 2>&1 && {{ echo yes > {saw}; break; }}; i=$((i+1)); sleep 0.05; done; fi\n\
             exec \"$@\"\n",
            flag = wait_flag.display(),
            saw = saw.display()
        ),
    )
    .unwrap();
    std::fs::set_permissions(
        &sanitizer,
        std::os::unix::fs::PermissionsExt::from_mode(0o755),
    )
    .unwrap();
    let cfg = config("model = \"model.toml\"\nbackend = \"cpu\"\nconfirm = 2").replace(
        "[triage]\nenabled = false\n",
        &format!(
            "[triage]\nenabled = true\nsanitizer = \"{}\"\n",
            sanitizer.display()
        ),
    );
    one_node_regression(&dir, &cfg);

    std::fs::write(&wait_flag, "").unwrap();
    let (code, side, text) = start_report(&dir, &["good..main", "--jobs", "3"], tmp.path());
    assert_eq!(code, 0, "{text}");
    assert!(saw.exists(), "triage did not run beside the shrink: {text}");
    std::fs::remove_file(&wait_flag).unwrap();
    let (code, serial, text) = start_report(&dir, &["good..main", "--jobs", "1"], tmp.path());
    assert_eq!(code, 0, "{text}");

    let (side, serial) = (side.expect("a report"), serial.expect("a report"));
    for r in [&side, &serial] {
        assert_eq!(kept(shrink_of(r, &text)), vec!["b2_lookup"]);
        assert_eq!(shrink_of(r, &text).parent_check, Some(ParentCheck::Passed));
    }
    assert_eq!(first_bad(&side), first_bad(&serial));
    let triage = |r: &Report| {
        let t = r.triage.clone().expect("triage ran");
        (t.status, t.summary, t.signature)
    };
    assert_eq!(triage(&side), triage(&serial));
    let shrunk = |r: &Report| {
        let s = shrink_of(r, "").clone();
        (
            s.status,
            s.summary,
            s.kept,
            s.removed,
            s.nodes_before,
            s.nodes_after,
        )
    };
    assert_eq!(shrunk(&side), shrunk(&serial));
    let files = |r: &Report| bundle_files(Path::new(r.bundle.as_deref().unwrap()));
    assert_eq!(files(&side), files(&serial));
}
