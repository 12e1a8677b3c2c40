//! The real binary's tool commands: shell completions and the man page from the CLI definition, and
//! `bundle pack` on a bundle directory.

use std::process::Command;

use crate::common::bin;

fn run(args: &[&str]) -> (Option<i32>, String, String) {
    let out = Command::new(bin()).args(args).output().expect("runs");
    (
        out.status.code(),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

#[test]
fn completions_and_the_man_page_come_from_the_cli_definition() {
    for shell in ["bash", "zsh", "fish"] {
        let (code, out, err) = run(&["completions", shell]);
        assert_eq!(code, Some(0), "{shell}: {err}");
        for word in [
            "cudabisect",
            "first-parent",
            "message-format",
            "include-binary",
        ] {
            assert!(out.contains(word), "{shell} completions lack {word}");
        }
    }
    let (code, _, err) = run(&["completions", "tcsh"]);
    assert_eq!(code, Some(2), "an unknown shell is a usage error: {err}");
    let (code, out, err) = run(&["man"]);
    assert_eq!(code, Some(0), "{err}");
    assert!(
        out.starts_with(".ie") || out.contains(".TH cudabisect"),
        "{out}"
    );
    assert!(out.contains("start") && out.contains("shrink") && out.contains("bundle"));
}

#[test]
fn bundle_pack_writes_an_archive_beside_the_bundle_and_refuses_other_directories() {
    let tmp = tempfile::tempdir().unwrap();
    let b = tmp.path().join("0a1b2c3");
    std::fs::create_dir_all(b.join("bin")).unwrap();
    std::fs::write(b.join("REPORT.md"), "# First bad commit\n").unwrap();
    std::fs::write(b.join("reproduce.sh"), "#!/bin/sh\n").unwrap();
    std::fs::write(b.join("bin/cudabisect"), vec![0u8; 4096]).unwrap();
    let (code, out, err) = run(&["bundle", "pack", b.to_str().unwrap()]);
    assert_eq!(code, Some(0), "{err}");
    let archive = tmp.path().join("0a1b2c3.tar.gz");
    assert!(archive.is_file());
    assert!(
        out.starts_with(archive.to_str().unwrap())
            && out.contains("2 files")
            && out.contains("KiB"),
        "{out}"
    );
    assert!(!out.contains("with the binary"), "{out}");
    assert!(err.is_empty(), "a small archive warns of nothing: {err}");

    // Over the 25 MB an issue attachment may be: packed all the same, with a warning. (The data is
    // random, so the archive does not compress below the limit.)
    let big = tmp.path().join("big");
    std::fs::create_dir_all(big.join("minimal")).unwrap();
    std::fs::write(big.join("REPORT.md"), "# First bad commit\n").unwrap();
    let mut state = 0x2545_f491_4f6c_dd1d_u64;
    let noise: Vec<u8> = (0..26_000_000)
        .map(|_| {
            state ^= state << 13;
            state ^= state >> 7;
            state ^= state << 17;
            (state >> 24) as u8
        })
        .collect();
    std::fs::write(big.join("minimal/repro_data.pt"), noise).unwrap();
    let (code, out, err) = run(&["bundle", "pack", big.to_str().unwrap()]);
    assert_eq!(code, Some(0), "{err}");
    assert!(out.contains("MiB"), "{out}");
    assert!(
        err.contains("over the 25 MB an issue attachment may be"),
        "{err}"
    );
    // A disk that fills while the archive is written (a file-size limit stands in for it): the archive is
    // blamed, in one line, and neither it nor its temporary file is left behind.
    let full = tmp.path().join("full");
    std::fs::create_dir_all(&full).unwrap();
    let out = Command::new("sh")
        .arg("-c")
        .arg("ulimit -f 64 && exec \"$0\" bundle pack \"$1\" -o \"$2\"")
        .arg(bin())
        .arg(&big)
        .arg(full.join("big.tar.gz"))
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert_ne!(out.status.code(), Some(0), "{err}");
    let line = err
        .lines()
        .find(|l| l.starts_with("error:"))
        .unwrap_or_default();
    assert!(line.contains("big.tar.gz"), "{err}");
    assert!(!line.contains("repro_data.pt"), "{err}");
    assert_eq!(std::fs::read_dir(&full).unwrap().count(), 0, "{err}");

    let other = tmp.path().join("not-a-bundle");
    std::fs::create_dir_all(&other).unwrap();
    let (code, out, err) = run(&["bundle", "pack", other.to_str().unwrap()]);
    assert_eq!(code, Some(2), "{out}{err}");
    assert_eq!(err.lines().count(), 1, "{err}");
    assert!(err.contains("not a cudabisect bundle"), "{err}");
    assert!(!tmp.path().join("not-a-bundle.tar.gz").exists());
    // A place that takes no file is the user's `-o` to fix (exit 2), named as the archive's.
    let (code, _, err) = run(&["bundle", "pack", b.to_str().unwrap(), "-o", "/proc/x.tgz"]);
    assert_eq!(code, Some(2), "{err}");
    assert!(err.contains("/proc/x.tgz: cannot write there"), "{err}");
    // A directory name that is not UTF-8 names its archive byte for byte.
    use std::os::unix::ffi::OsStrExt;
    let odd = tmp
        .path()
        .join(std::ffi::OsStr::from_bytes(b"bundle-\xff-odd"));
    std::fs::create_dir_all(&odd).unwrap();
    std::fs::write(odd.join("REPORT.md"), "# First bad commit\n").unwrap();
    let out = std::process::Command::new(crate::common::bin())
        .args(["bundle", "pack"])
        .arg(&odd)
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(0));
    assert!(tmp
        .path()
        .join(std::ffi::OsStr::from_bytes(b"bundle-\xff-odd.tar.gz"))
        .is_file());
}

/// The examples' command lines use only options the CLI has (so a renamed flag breaks this test, not a
/// user's nightly job).
#[test]
fn the_examples_use_only_options_the_cli_has() {
    let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("examples");
    let mut checked = 0;
    for file in ["github/nightly.yml", "systemd/cudabisect-nightly.service"] {
        let text = std::fs::read_to_string(root.join(file)).unwrap();
        // Join continuation lines, then look at every cudabisect invocation.
        let text = text.replace("\\\n", " ");
        for line in text.lines() {
            let Some(at) = line.find("cudabisect ") else {
                continue;
            };
            let words: Vec<&str> = line[at + "cudabisect ".len()..]
                .split_whitespace()
                .collect();
            let Some(sub) = words.first().filter(|w| ["nightly", "bundle"].contains(w)) else {
                continue;
            };
            let help_args: Vec<&str> = if *sub == "bundle" {
                vec!["bundle", "pack", "--help"]
            } else {
                vec![sub, "--help"]
            };
            let (code, help, err) = run(&help_args);
            assert_eq!(code, Some(0), "{err}");
            for flag in words.iter().filter(|w| w.starts_with('-')) {
                let flag = flag.split('=').next().unwrap_or(flag);
                assert!(
                    help.contains(flag),
                    "{file}: `{flag}` is not an option of `cudabisect {sub}`"
                );
                checked += 1;
            }
        }
    }
    assert!(checked >= 6, "only {checked} options checked");
}

/// One `--message-format` for every subcommand that prints a result; the old spellings still work, unseen
/// in `--help`.
#[test]
fn every_command_takes_message_format_and_the_old_spellings_still_work() {
    let log = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/fixtures/logs/cupy_misaligned.log"
    );
    let (code, new, err) = run(&["classify", log, "--message-format", "json"]);
    assert_eq!(code, Some(5), "{err}");
    let parsed: serde_json::Value = serde_json::from_str(new.trim()).expect("one JSON object");
    assert!(parsed["class"].is_string(), "{new}");
    let (_, old, _) = run(&["classify", log, "--json"]);
    assert_eq!(old, new);
    let (_, human, _) = run(&["classify", log]);
    assert!(
        serde_json::from_str::<serde_json::Value>(human.trim()).is_err(),
        "{human}"
    );
    for command in [
        "start",
        "shrink",
        "nightly",
        "classify",
        "triage",
        "log",
        "demo",
        "init",
        "bundle pack",
    ] {
        let words: Vec<&str> = command.split(' ').chain(["--help"]).collect();
        let (code, help, err) = run(&words);
        assert_eq!(code, Some(0), "{err}");
        assert!(
            help.contains("--message-format"),
            "{command} --help: {help}"
        );
        assert!(
            !help.contains("--json ") && !help.contains(" --format "),
            "{command}: {help}"
        );
    }
    // `log --format` is the old spelling of `log --message-format`: the same usage error either way.
    let (a, _, _) = run(&["log", "-C", "/nonexistent", "--format", "git"]);
    let (b, _, _) = run(&["log", "-C", "/nonexistent", "--message-format", "git"]);
    assert_eq!(a, b);
    // `bundle pack -o -` is refused: the archive goes to a file, never to a file named `-`.
    let tmp = tempfile::tempdir().unwrap();
    let b = tmp.path().join("0a1b2c3");
    std::fs::create_dir_all(&b).unwrap();
    std::fs::write(b.join("REPORT.md"), "# First bad commit\n").unwrap();
    let (code, out, err) = run(&["bundle", "pack", b.to_str().unwrap(), "-o", "-"]);
    assert_eq!(code, Some(2), "{err}");
    assert!(out.is_empty() && err.contains("-o -"), "{err}");
    assert!(!std::path::Path::new("-").exists());
}

/// README's two commands for a fresh machine are what CI runs, and its config examples load.
#[test]
fn the_readme_commands_are_what_ci_runs_and_its_configs_load() {
    let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR"));
    let readme = std::fs::read_to_string(root.join("README.md")).unwrap();
    let ci = std::fs::read_to_string(root.join(".ci/run")).unwrap();
    let section = readme
        .split("## Two commands for a fresh machine")
        .nth(1)
        .and_then(|s| s.split("```sh\n").nth(1))
        .and_then(|s| s.split("```").next())
        .expect("the two commands");
    let commands: Vec<&str> = section
        .lines()
        .map(|l| l.split('#').next().unwrap_or("").trim())
        .filter(|l| !l.is_empty())
        .collect();
    assert_eq!(commands, ["cargo run --release -- demo", "ci/test"]);
    assert!(
        ci.lines().any(|l| l.trim() == "ci/test"),
        "CI does not run README's test command"
    );
    assert!(root.join("ci/test").is_file());
    // Every TOML block of the README is a config that loads.
    let mut checked = 0;
    for block in readme.split("```toml\n").skip(1) {
        let text = block.split("```").next().unwrap();
        cudabisect::config::Config::parse(std::path::Path::new("bisect.toml"), text)
            .unwrap_or_else(|e| panic!("README's config does not load: {e}\n{text}"));
        checked += 1;
    }
    assert!(checked >= 1);
}
