//! The classifier against every real log recorded on the H200 (fixtures/logs), table-driven, and the
//! sanitizer XML parser against the recorded memcheck report.

use cudabisect::classify::sanitizer::{self, FindingKind};
use cudabisect::classify::{classify, Exit, FaultClass};
use cudabisect::report::record::SanitizerTool;

fn log(name: &str) -> (Exit, String) {
    let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("fixtures/logs")
        .join(name);
    let text = std::fs::read_to_string(path).unwrap();
    let (body, last) = text.trim_end().rsplit_once('\n').unwrap();
    let code = last.strip_prefix("exit=").unwrap().parse().unwrap();
    (Exit::Code(code), body.to_string())
}

struct Case {
    file: &'static str,
    class: FaultClass,
    code: Option<u32>,
    kernel: Option<&'static str>,
    site: Option<&'static str>,
    framework: Option<&'static str>,
}

#[test]
fn every_recorded_log_is_classified_with_its_details() {
    use FaultClass as F;
    let cases = [
        Case {
            file: "native_oob_async.log",
            class: F::IllegalAddress,
            code: Some(700),
            kernel: None,
            site: None,
            framework: Some("cudarc"),
        },
        Case {
            file: "native_oob_sync.log",
            class: F::IllegalAddress,
            code: Some(700),
            kernel: None,
            site: None,
            framework: Some("cudarc"),
        },
        Case {
            file: "triton_oob_sync.log",
            class: F::InvalidAddressSpace,
            code: Some(717),
            kernel: None,
            site: Some("/home/user/repro/cases.py:14"),
            framework: Some("triton"),
        },
        Case {
            file: "torch_embedding_assert.log",
            class: F::DeviceAssert,
            code: Some(710),
            kernel: Some("indexSelectSmallIndex"),
            site: Some("/pytorch/aten/src/ATen/native/cuda/Indexing.cu:1515"),
            framework: Some("pytorch"),
        },
        Case {
            file: "torch_device_mismatch.log",
            class: F::DeviceMismatch,
            code: None,
            kernel: None,
            site: Some("/home/user/repro/cases.py:23"),
            framework: None,
        },
        Case {
            file: "torch_oom.log",
            class: F::OutOfMemory,
            code: None,
            kernel: None,
            site: Some("/home/user/repro/cases.py:26"),
            framework: Some("pytorch"),
        },
        Case {
            file: "cupy_misaligned.log",
            class: F::MisalignedAddress,
            code: Some(716),
            kernel: None,
            site: Some("/home/user/repro/cases.py:35"),
            framework: Some("cupy"),
        },
        Case {
            file: "torch_uaf_cached.log",
            class: F::IllegalAddress,
            code: Some(700),
            kernel: None,
            site: Some("/home/user/repro/cases.py:60"),
            framework: Some("pytorch"),
        },
        Case {
            file: "torch_nan_anomaly.log",
            class: F::Nan,
            code: None,
            kernel: None,
            site: Some("/home/user/repro/cases.py:66"),
            framework: Some("pytorch"),
        },
        Case {
            file: "sanitizer_memcheck_oob.log",
            class: F::IllegalAddress,
            code: Some(700),
            kernel: Some("oob"),
            site: Some("/home/user/repro/torch_oob.py:9"),
            framework: Some("cupy"),
        },
        Case {
            file: "sanitizer_memcheck_misaligned.log",
            class: F::MisalignedAddress,
            code: Some(716),
            kernel: Some("mis"),
            site: Some("/home/user/repro/cases.py:35"),
            framework: Some("cupy"),
        },
        Case {
            file: "sanitizer_racecheck.log",
            class: F::Race,
            code: None,
            kernel: Some("race"),
            site: None,
            framework: None,
        },
        Case {
            file: "sanitizer_initcheck.log",
            class: F::UninitializedRead,
            code: None,
            kernel: Some("u"),
            site: None,
            framework: Some("cupy"),
        },
    ];
    for case in cases {
        let (exit, body) = log(case.file);
        let s = classify(exit, &body);
        let got = (
            s.class,
            s.code,
            s.kernel.as_deref(),
            s.site.as_deref(),
            s.framework.as_deref(),
        );
        let want = (
            case.class,
            case.code,
            case.kernel,
            case.site,
            case.framework,
        );
        assert_eq!(got, want, "{}: {s:#?}", case.file);
        assert!(!s.summary.is_empty());
    }
}

#[test]
fn device_assert_keeps_the_assertion_text() {
    let (exit, body) = log("torch_embedding_assert.log");
    let s = classify(exit, &body);
    assert_eq!(
        s.detail.as_deref(),
        Some("Assertion `srcIndex < srcSelectDimSize` failed")
    );
}

#[test]
fn sanitizer_text_reports_the_allocation_relation() {
    let (exit, body) = log("sanitizer_memcheck_oob.log");
    let s = classify(exit, &body);
    assert_eq!(
        s.detail.as_deref(),
        Some("write of 4 bytes, 17,953 bytes after an allocation of size 4,096 bytes")
    );
    let lines: Vec<&str> = body.lines().collect();
    let folded = sanitizer::fold(&sanitizer::parse_text(&lines));
    assert_eq!(folded.len(), 1);
    assert_eq!(folded[0].count, 5);
    assert_eq!(sanitizer::error_summary(&lines), Some(1027));
}

#[test]
fn recorded_memcheck_xml_parses_and_folds() {
    let path =
        std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("fixtures/logs/memcheck_oob.xml");
    let xml = std::fs::read_to_string(path).unwrap();
    let findings = sanitizer::parse_xml(&xml).unwrap();
    assert_eq!(findings.len(), 2);
    let f = &findings[0];
    assert_eq!(f.kind, Some(FindingKind::OutOfBounds));
    assert_eq!(
        (f.kernel.as_deref(), f.pc.as_deref()),
        (Some("oob"), Some("0xe0"))
    );
    assert_eq!((f.direction.as_deref(), f.size), (Some("write"), Some(4)));
    assert_eq!((f.thread, f.block), (Some([0, 0, 0]), Some([2, 0, 0])));
    let folded = sanitizer::fold(&findings);
    assert_eq!(folded.len(), 1);
    assert_eq!(folded[0].count, 2);
    assert!(
        folded[0]
            .line()
            .contains("threads (0-1,0,0), blocks (2,0,0)"),
        "{}",
        folded[0].line()
    );
    // A truncated report is an error, never a panic.
    assert!(sanitizer::parse_xml(&xml[..xml.len() / 2]).is_err());
}

#[test]
fn classify_cli_prints_the_json_keys() {
    let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("fixtures/logs/torch_oom.log");
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_cudabisect"))
        .args(["classify", "--json"])
        .arg(&path)
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(5));
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(v["class"], "out_of_memory");
    for key in ["class", "code", "kernel", "site", "framework", "summary"] {
        assert!(v.get(key).is_some(), "{key}");
    }
    assert!(v["kernel"].is_null());
    let bad = std::process::Command::new(env!("CARGO_BIN_EXE_cudabisect"))
        .args(["classify", "/nonexistent/log"])
        .output()
        .unwrap();
    assert_eq!(bad.status.code(), Some(2));
}

#[test]
fn a_log_saved_as_utf16_or_gzipped_is_read_as_its_text() {
    let dir = tempfile::tempdir().unwrap();
    let text = std::fs::read_to_string(
        std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("fixtures/logs/torch_oom.log"),
    )
    .unwrap();
    // PowerShell's `>`: UTF-16LE with its byte-order mark; and the other order.
    let utf16 = |le: bool| -> Vec<u8> {
        let mut out = if le {
            vec![0xff, 0xfe]
        } else {
            vec![0xfe, 0xff]
        };
        for unit in text.encode_utf16() {
            out.extend(if le {
                unit.to_le_bytes()
            } else {
                unit.to_be_bytes()
            });
        }
        out
    };
    let mut gz = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::fast());
    std::io::Write::write_all(&mut gz, text.as_bytes()).unwrap();
    let cases = [
        ("le.log", utf16(true)),
        ("be.log", utf16(false)),
        ("log.gz", gz.finish().unwrap()),
    ];
    for (name, bytes) in cases {
        let path = dir.path().join(name);
        std::fs::write(&path, &bytes).unwrap();
        let out = std::process::Command::new(env!("CARGO_BIN_EXE_cudabisect"))
            .args(["classify", "--json"])
            .arg(&path)
            .output()
            .unwrap();
        assert_eq!(out.status.code(), Some(5), "{name}");
        let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
        assert_eq!(v["class"], "out_of_memory", "{name}");
    }
    // A gzip header over a broken body cannot be read: one line, exit 2, never a guess.
    let path = dir.path().join("broken.gz");
    std::fs::write(&path, [0x1f, 0x8b, 8, 0, 1, 2, 3]).unwrap();
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_cudabisect"))
        .arg("classify")
        .arg(&path)
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
    assert_eq!(String::from_utf8_lossy(&out.stderr).lines().count(), 1);
}

fn triage_fixture(
    name: &str,
    tool: SanitizerTool,
) -> cudabisect::run::probe::sanitizer::Interpretation {
    let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("fixtures/logs");
    let log = std::fs::read_to_string(dir.join(format!("{name}.log"))).unwrap();
    let xml = std::fs::read_to_string(dir.join(format!("{name}.xml"))).unwrap();
    cudabisect::run::probe::sanitizer::interpret(tool, Exit::Code(86), &log, Some(&xml))
}

#[test]
fn recorded_h200_trap_assert_and_race_reports_are_read() {
    let trap = triage_fixture("h200_trap_memcheck", SanitizerTool::Memcheck);
    let sig = trap.signature.unwrap();
    assert_eq!(
        (sig.class, sig.kernel.as_deref(), sig.site.as_deref()),
        (
            FaultClass::LaunchFailure,
            Some("trap_kernel"),
            Some("planted_faults.cu:22")
        )
    );
    assert_eq!(trap.program.class, FaultClass::LaunchFailure);

    let assert = triage_fixture("h200_assert_memcheck", SanitizerTool::Memcheck);
    assert_eq!(assert.signature.unwrap().class, FaultClass::DeviceAssert);
    assert_eq!(
        assert.findings.len(),
        1,
        "22 warp asserts fold into one line"
    );
    assert_eq!(assert.program.kernel.as_deref(), Some("assert_kernel"));

    let race = triage_fixture("h200_race_racecheck", SanitizerTool::Racecheck);
    let sig = race.signature.unwrap();
    assert_eq!(
        (sig.class, sig.kernel.as_deref()),
        (FaultClass::Race, Some("shared_race"))
    );
    assert!(
        race.findings[0]
            .line()
            .contains("race between write at line 32 and read at line 34 (1024 hazards)"),
        "{}",
        race.findings[0].line()
    );
}

/// A multi-rank log recorded under torchrun on two H200s (fixtures/logs/multirank), ending `exit=N` or
/// `exit=timeout`.
fn multirank(name: &str) -> cudabisect::classify::Signature {
    let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("fixtures/logs/multirank")
        .join(name);
    let text = std::fs::read_to_string(path).unwrap();
    let (body, last) = text.trim_end().rsplit_once('\n').unwrap();
    let exit = match last.strip_prefix("exit=").unwrap() {
        "timeout" => Exit::Timeout,
        code => Exit::Code(code.parse().unwrap()),
    };
    classify(exit, body)
}

#[test]
fn multi_rank_logs_name_the_rank_that_faulted_first_and_its_own_frames() {
    use FaultClass as F;
    // (file, class, rank, kernel, launch site of the user's code)
    type Case<'a> = (&'a str, F, Option<u32>, Option<&'a str>, Option<&'a str>);
    let cases: [Case; 7] = [
        (
            "kernel_fault.log",
            F::IllegalAddress,
            Some(1),
            None,
            Some("/home/user/repro/scenario.py:<module>"),
        ),
        (
            "kernel_fault-tee.log",
            F::IllegalAddress,
            Some(1),
            None,
            Some("/home/user/repro/scenario.py:<module>"),
        ),
        (
            "index_assert.log",
            F::DeviceAssert,
            Some(1),
            Some("indexSelectSmallIndex"),
            Some("/home/user/repro/scenario.py:<module>"),
        ),
        (
            "oom.log",
            F::OutOfMemory,
            Some(1),
            None,
            Some("/home/user/repro/scenario.py:<module>"),
        ),
        (
            "early_exit.log",
            F::Other,
            Some(0),
            None,
            Some("/home/user/repro/scenario.py:<module>"),
        ),
        ("collective_mismatch.log", F::Hang, None, None, None),
        (
            "collective_mismatch-async.log",
            F::Nccl,
            Some(0),
            None,
            None,
        ),
    ];
    for (file, class, rank, kernel, launch) in cases {
        let s = multirank(file);
        assert_eq!(s.class, class, "{file}: {s:?}");
        assert_eq!(s.rank, rank, "{file}: {s:?}");
        assert_eq!(s.kernel.as_deref(), kernel, "{file}: {s:?}");
        if launch.is_some() {
            assert_eq!(s.launch.as_deref(), launch, "{file}: {s:?}");
        }
        // The launcher's frame is never the site, and its banner never the summary.
        for field in [&s.site, &s.launch] {
            assert!(
                !field.as_deref().unwrap_or("").contains("bin/torchrun"),
                "{file}: {s:?}"
            );
        }
        assert!(!s.summary.contains("===="), "{file}: {}", s.summary);
    }
    let early = multirank("early_exit.log");
    assert!(
        early.summary.contains("ValueError: bad config"),
        "{}",
        early.summary
    );
    assert_eq!(multirank("clean.log").class, F::None);
    // Under launch blocking the mismatched collective prints nothing: the hang says so.
    let hang = multirank("collective_mismatch.log");
    assert!(hang.detail.is_some(), "{hang:?}");
}
