//! GPU tests, run only when CUDABISECT_GPU_TESTS=1 (they need an NVIDIA GPU, nvcc and compute-sanitizer):
//! planted faults of each kind go through `cudabisect triage` and must come out with the right class,
//! kernel and access. Paths can be overridden with CUDABISECT_BIN and CUDABISECT_ROOT when the binaries
//! were built on another machine.

use std::path::PathBuf;
use std::process::Command;

fn enabled() -> bool {
    std::env::var("CUDABISECT_GPU_TESTS").as_deref() == Ok("1")
}

fn root() -> PathBuf {
    std::env::var_os("CUDABISECT_ROOT")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from(env!("CARGO_MANIFEST_DIR")))
}

fn bin() -> PathBuf {
    std::env::var_os("CUDABISECT_BIN")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from(env!("CARGO_BIN_EXE_cudabisect")))
}

fn nvcc() -> PathBuf {
    let on_path = Command::new("nvcc").arg("--version").output().is_ok();
    if on_path {
        PathBuf::from("nvcc")
    } else {
        PathBuf::from("/usr/local/cuda/bin/nvcc")
    }
}

#[test]
fn planted_faults_are_triaged_with_class_kernel_and_access() {
    if !enabled() {
        eprintln!("skipped: set CUDABISECT_GPU_TESTS=1 on a machine with a GPU");
        return;
    }
    let tmp = tempfile::tempdir().unwrap();
    let exe = tmp.path().join("planted_faults");
    let status = Command::new(nvcc())
        .args(["-lineinfo", "-arch=sm_90", "-o"])
        .arg(&exe)
        .arg(root().join("kernels/planted/planted_faults.cu"))
        .status()
        .expect("nvcc runs");
    assert!(status.success(), "nvcc failed");
    let cases = [
        (
            "oob",
            "illegal_address",
            Some("write_oob"),
            Some("write of 4 bytes"),
        ),
        (
            "misaligned",
            "misaligned_address",
            Some("load_misaligned"),
            Some("read of 16 bytes"),
        ),
        ("trap", "launch_failure", None, None),
        ("assert", "device_assert", Some("assert_kernel"), None),
        ("race", "race", Some("shared_race"), None),
        (
            "uninit",
            "uninitialized_read",
            Some("read_uninit"),
            Some("read of 4 bytes"),
        ),
        (
            "uaf",
            "illegal_address",
            Some("write_freed"),
            Some("write of 4 bytes"),
        ),
    ];
    let mut failures = Vec::new();
    for (mode, class, kernel, access) in cases {
        let out = Command::new(bin())
            .args(["triage", "--json", "-C"])
            .arg(tmp.path())
            .arg("--")
            .arg(&exe)
            .arg(mode)
            .output()
            .unwrap();
        let json: serde_json::Value = match serde_json::from_slice(&out.stdout) {
            Ok(v) => v,
            Err(e) => {
                failures.push(format!(
                    "{mode}: no JSON ({e}): {}",
                    String::from_utf8_lossy(&out.stderr)
                ));
                continue;
            }
        };
        let sig = &json["signature"];
        let detail = sig["detail"].as_str().unwrap_or("");
        println!(
            "{mode}: status={} tools={} class={} kernel={} site={} detail={} | {}",
            json["status"],
            json["tools_run"],
            sig["class"],
            sig["kernel"],
            sig["site"],
            detail,
            json["summary"]
        );
        if sig["class"] != class {
            failures.push(format!("{mode}: class {} != {class}", sig["class"]));
        }
        if let Some(k) = kernel {
            if sig["kernel"] != k {
                failures.push(format!("{mode}: kernel {} != {k}", sig["kernel"]));
            }
        }
        if let Some(a) = access {
            if !detail.contains(a) {
                failures.push(format!("{mode}: detail `{detail}` lacks `{a}`"));
            }
        }
    }
    assert!(failures.is_empty(), "{failures:#?}");
}
