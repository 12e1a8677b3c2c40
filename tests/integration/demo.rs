//! `cudabisect demo` end to end (on the CPU reference without a GPU, on CUDA with one): the planted
//! culprit is found, the model is shrunk to the planted node, the bundle is complete, and its reproduce
//! script reproduces the fault from a copy of the bundle somewhere else.

use std::path::Path;
use std::process::Command;

fn copy_dir(from: &Path, to: &Path) {
    std::fs::create_dir_all(to).unwrap();
    for e in std::fs::read_dir(from).unwrap() {
        let e = e.unwrap();
        if e.file_type().unwrap().is_dir() {
            copy_dir(&e.path(), &to.join(e.file_name()));
        } else {
            std::fs::copy(e.path(), to.join(e.file_name())).unwrap();
        }
    }
}

#[test]
fn the_demo_finds_the_culprit_shrinks_it_and_hands_off_a_bundle_that_reproduces_elsewhere() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("demo");
    // The CPU demo on every machine: devices hidden, so a GPU machine runs the same thing (the GPU demo
    // is a GPU test).
    let out = Command::new(env!("CARGO_BIN_EXE_cudabisect"))
        .args(["demo", "--dir"])
        .arg(&dir)
        .env("CUDA_VISIBLE_DEVICES", "")
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
    assert_eq!(out.status.code(), Some(0), "{stdout}\n{stderr}");

    // The history: at least 100 commits, merges among them.
    let repo = git2::Repository::open(&dir).unwrap();
    let mut walk = repo.revwalk().unwrap();
    walk.push_head().unwrap();
    let oids: Vec<git2::Oid> = walk.map(|o| o.unwrap()).collect();
    assert!(oids.len() >= 100, "{} commits", oids.len());
    assert!(
        oids.iter()
            .any(|o| repo.find_commit(*o).unwrap().parent_count() == 2),
        "merges"
    );

    // The right culprit: the one the demo planted.
    let planted = stderr
        .split("the planted culprit is ")
        .nth(1)
        .unwrap()
        .get(..12)
        .unwrap()
        .to_string();
    let first_bad = stdout
        .lines()
        .find_map(|l| l.strip_prefix("First bad commit: "))
        .unwrap();
    assert!(first_bad.starts_with(&planted), "{first_bad} vs {planted}");
    assert!(
        stdout.contains("embedding: shrink the token table to 1000 rows"),
        "{stdout}"
    );
    assert!(
        stdout.contains("illegal_address (700) in engine_gather at node embed"),
        "{stdout}"
    );
    // The unrelated fault in another kernel was skipped, never taken for the bug.
    assert!(
        stderr.contains(
            "skipped, different failure: illegal_address (700) in index_add_f32 at node route"
        ),
        "{stderr}"
    );

    // Shrunk to the planted node, and the summary says where the bundle is.
    assert!(stdout.contains("Shrink: 1 of 21 nodes (embed)"), "{stdout}");
    assert!(
        stdout.contains("Minimal subgraph at the parent: passed"),
        "{stdout}"
    );
    let bundle = stdout
        .lines()
        .find_map(|l| l.strip_prefix("Bundle: "))
        .unwrap()
        .trim()
        .to_string();
    let bundle = Path::new(&bundle);
    assert_eq!(
        bundle,
        dir.join(".git/cudabisect/bundles").join(&first_bad[..12]),
        "bundles go to the state directory, never the working tree"
    );

    // Complete.
    for f in [
        "REPORT.md",
        "report.json",
        "bisect.toml",
        "environment.json",
        "reproduce.sh",
        "bin/cudabisect",
        "minimal/model.toml",
    ] {
        assert!(bundle.join(f).is_file(), "{f} missing");
    }
    assert!(
        std::fs::read_dir(bundle.join("logs/probes"))
            .unwrap()
            .count()
            >= 10
    );
    let md = std::fs::read_to_string(bundle.join("REPORT.md")).unwrap();
    for section in [
        "## First bad commit",
        "## The fault",
        "## Minimal repro",
        "## Reproduce",
        "## Environment",
        "reproduction rate: 3/3",
        "`embed` | embedding | engine_gather",
    ] {
        assert!(md.contains(section), "REPORT.md lacks {section}:\n{md}");
    }
    let report: cudabisect::report::record::Report =
        serde_json::from_str(&std::fs::read_to_string(bundle.join("report.json")).unwrap())
            .unwrap();
    assert_eq!(
        crate::common::kept(report.shrink.as_ref().unwrap()),
        ["embed"]
    );
    // The user's view of the repository is unchanged: nothing new, not even ignored files.
    let mut opts = git2::StatusOptions::new();
    opts.include_untracked(true).include_ignored(true);
    let statuses = repo.statuses(Some(&mut opts)).unwrap();
    assert_eq!(
        statuses.iter().count(),
        0,
        "git status shows nothing, ignored files included"
    );
    // Nothing in the bundle points back into the checkout or the state directory.
    assert!(!md.contains(".git/cudabisect"), "{md}");

    // The reproduce script works from a copy of the bundle alone.
    let elsewhere = tmp.path().join("maintainer").join("bundle");
    copy_dir(bundle, &elsewhere);
    std::fs::remove_dir_all(&dir).unwrap();
    let run = Command::new("sh")
        .arg(elsewhere.join("reproduce.sh"))
        .current_dir(tmp.path())
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&run.stdout);
    assert_eq!(
        run.status.code(),
        Some(1),
        "{text}{}",
        String::from_utf8_lossy(&run.stderr)
    );
    assert!(
        text.contains("illegal memory access was encountered"),
        "{text}"
    );
    assert!(text.contains("node=embed"), "{text}");
}
