//! The classifier on real-world logs people pasted into public issues (`fixtures/logs/real/`, each file
//! naming its source, its hand-given class, and its kernel where the log names one).

use std::path::Path;

use cudabisect::classify::trailer::exit_from_code;
use cudabisect::classify::{classify, Exit};

struct Case {
    file: String,
    class: String,
    kernel: Option<String>,
    exit: Exit,
    text: String,
}

fn cases() -> Vec<Case> {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("fixtures/logs/real");
    let mut files: Vec<_> = std::fs::read_dir(&dir)
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|e| e == "log"))
        .collect();
    files.sort();
    files
        .into_iter()
        .map(|path| {
            let raw = std::fs::read_to_string(&path).unwrap();
            let (mut class, mut kernel, mut exit, mut source) = (None, None, Exit::Unknown, None);
            let mut body = Vec::new();
            for line in raw.lines() {
                if let Some(v) = line.strip_prefix("# class: ") {
                    class = Some(v.to_string());
                } else if let Some(v) = line.strip_prefix("# kernel: ") {
                    kernel = Some(v.to_string());
                } else if let Some(v) = line.strip_prefix("# exit: ") {
                    exit = exit_from_code(v.parse().unwrap());
                } else if let Some(v) = line.strip_prefix("# source: ") {
                    source = Some(v.to_string());
                } else {
                    body.push(line);
                }
            }
            let file = path.file_name().unwrap().to_string_lossy().into_owned();
            assert!(source.is_some(), "{file} names no source");
            Case {
                class: class.unwrap_or_else(|| panic!("{file} has no class")),
                file,
                kernel,
                exit,
                text: body.join("\n") + "\n",
            }
        })
        .collect()
}

#[test]
fn the_corpus_is_large_and_covers_every_family() {
    let all = cases();
    let public =
        std::fs::read_dir(Path::new(env!("CARGO_MANIFEST_DIR")).join("fixtures/logs/real"))
            .unwrap()
            .filter(|e| {
                let text = std::fs::read_to_string(e.as_ref().unwrap().path()).unwrap_or_default();
                text.starts_with("# source: https://")
            })
            .count();
    assert!(public >= 60, "{public} public excerpts");
    for class in [
        "illegal_address",
        "misaligned_address",
        "illegal_instruction",
        "device_mismatch",
        "device_assert",
        "hardware_stack_error",
        "launch_failure",
        "out_of_memory",
        "nccl",
        "nan",
        "signal",
        "build_failure",
        "infra",
        "other",
        "none",
    ] {
        assert!(all.iter().any(|c| c.class == class), "no {class} log");
    }
}

#[test]
fn real_world_logs_are_read_right() {
    let all = cases();
    let mut wrong_class = Vec::new();
    let mut wrong_kernel = Vec::new();
    for c in &all {
        let sig = classify(c.exit, &c.text);
        if sig.class.as_str() != c.class {
            wrong_class.push(format!("{}: {} (want {})", c.file, sig.short(), c.class));
        }
        if let Some(k) = &c.kernel {
            if sig.kernel.as_deref() != Some(k.as_str()) {
                wrong_kernel.push(format!("{}: kernel {:?} (want {k})", c.file, sig.kernel));
            }
        }
    }
    let right = all.len() - wrong_class.len();
    eprintln!("{right}/{} right on class", all.len());
    assert!(
        wrong_class.is_empty() && wrong_kernel.is_empty(),
        "class:\n{}\nkernel:\n{}",
        wrong_class.join("\n"),
        wrong_kernel.join("\n")
    );
}
