//! GPU tests, ignored unless asked for (`cargo test -- --include-ignored`, on a machine with an NVIDIA GPU,
//! nvcc, compute-sanitizer and torch), so a skipped one is counted as ignored, never as passed:
//! planted faults of each kind go through `cudabisect triage` and must come out with the right class,
//! kernel and access. Paths can be overridden with CUDABISECT_BIN and CUDABISECT_ROOT when the binaries
//! were built on another machine.

use std::path::{Path, PathBuf};
use std::process::Command;

use crate::common::first_bad;
use crate::common::histories::{history_of_modes, linear_history};
use crate::common::repo_builder::{put, Files};
use cudabisect::report::event::Event;
use cudabisect::report::json::Envelope;
use cudabisect::report::record::{Report, ShrinkReport};

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

/// Fails the test unless nvidia-smi lists at least two GPUs.
fn need_two_gpus() {
    let gpus = Command::new("nvidia-smi")
        .args(["--query-gpu=index", "--format=csv,noheader"])
        .output()
        .map(|o| String::from_utf8_lossy(&o.stdout).lines().count())
        .unwrap_or(0);
    assert!(
        gpus >= 2,
        "this test needs two GPUs; nvidia-smi lists {gpus}"
    );
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
#[ignore = "needs an NVIDIA GPU, nvcc, compute-sanitizer and torch: run with --include-ignored on the GPU machine"]
fn planted_faults_are_triaged_with_class_kernel_and_access() {
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
        // JSON Lines: the last line is `triage_done`, its result.
        let last = String::from_utf8_lossy(&out.stdout)
            .lines()
            .last()
            .unwrap_or_default()
            .to_string();
        let result = match serde_json::from_str::<Envelope>(&last) {
            Ok(Envelope {
                event: Event::TriageDone { result },
                ..
            }) => result,
            other => {
                failures.push(format!(
                    "{mode}: no triage_done ({other:?}): {}",
                    String::from_utf8_lossy(&out.stderr)
                ));
                continue;
            }
        };
        let sig = result.signature.clone().unwrap_or_else(|| {
            cudabisect::classify::Signature::new(cudabisect::classify::FaultClass::None, "")
        });
        let detail = sig.detail.as_deref().unwrap_or("");
        println!(
            "{mode}: status={:?} tools={:?} class={} kernel={:?} site={:?} detail={} | {}",
            result.status,
            result.tools_run,
            sig.class.as_str(),
            sig.kernel,
            sig.site,
            detail,
            result.summary
        );
        if sig.class.as_str() != class {
            failures.push(format!("{mode}: class {} != {class}", sig.class.as_str()));
        }
        if let Some(k) = kernel {
            if sig.kernel.as_deref() != Some(k) {
                failures.push(format!("{mode}: kernel {:?} != {k}", sig.kernel));
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

fn harness(args: &[&str], cache: &std::path::Path) -> (i32, String) {
    let out = Command::new(bin())
        .arg("harness")
        .args(args)
        .env("CUDABISECT_CACHE_DIR", cache)
        .env("CUDA_LAUNCH_BLOCKING", "1")
        .output()
        .expect("cudabisect runs");
    let text =
        String::from_utf8_lossy(&out.stdout).into_owned() + &String::from_utf8_lossy(&out.stderr);
    (out.status.code().unwrap_or(-1), text)
}

fn model(name: &str) -> String {
    root()
        .join("fixtures/models")
        .join(name)
        .display()
        .to_string()
}

#[test]
#[ignore = "needs an NVIDIA GPU, nvcc, compute-sanitizer and torch: run with --include-ignored on the GPU machine"]
fn every_zoo_op_on_cuda_matches_the_cpu_reference() {
    let tmp = tempfile::tempdir().unwrap();
    let (gpu, cpu) = (tmp.path().join("gpu"), tmp.path().join("cpu"));
    for (backend, dir) in [("cuda", &gpu), ("cpu", &cpu)] {
        let (code, text) = harness(
            &[
                "run",
                &model("all_ops.toml"),
                "--backend",
                backend,
                "--record",
                dir.to_str().unwrap(),
            ],
            &tmp.path().join("cache"),
        );
        assert_eq!(code, 0, "{backend}: {text}");
        if backend == "cuda" {
            println!("{}", text.lines().next().unwrap_or(""));
        }
    }
    let mut bad = Vec::new();
    let mut names: Vec<_> = std::fs::read_dir(&cpu)
        .unwrap()
        .filter_map(|e| e.ok())
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .filter(|n| n.ends_with(".npy"))
        .collect();
    names.sort();
    assert!(names.len() >= 14, "{names:?}");
    for name in names {
        let a = cudabisect::harness::tensor::Tensor::read_npy(&gpu.join(&name)).unwrap();
        let b = cudabisect::harness::tensor::Tensor::read_npy(&cpu.join(&name)).unwrap();
        let err = cudabisect::harness::compare(&a, &b, 1e-5, 1e-4);
        println!("{name}: shape {:?}, scaled error {err:?}", a.shape);
        if err.is_none_or(|e| e > 1.0) {
            bad.push(name);
        }
    }
    assert!(bad.is_empty(), "differ from the CPU reference: {bad:?}");
}

#[test]
#[ignore = "needs an NVIDIA GPU, nvcc, compute-sanitizer and torch: run with --include-ignored on the GPU machine"]
fn planted_out_of_bounds_kernels_are_blamed_on_their_node() {
    let tmp = tempfile::tempdir().unwrap();
    for (file, node, kernel) in [
        ("shrink_one_node.toml", "b2_lookup", "embedding_gather"),
        (
            "shrink_two_nodes.toml",
            "b3_slot_lookup",
            "embedding_gather",
        ),
        ("shrink_residual.toml", "route", "index_add_f32"),
    ] {
        let (code, text) = harness(
            &["run", &model(file), "--backend", "cuda"],
            &tmp.path().join("cache"),
        );
        let sig = cudabisect::classify::classify(cudabisect::classify::Exit::Code(code), &text);
        println!(
            "{file}: exit {code}, {} kernel={:?} site={:?} | {}",
            sig.class.as_str(),
            sig.kernel,
            sig.site,
            sig.summary
        );
        assert_eq!(code, 1, "{text}");
        assert!(text.contains("CUDA_ERROR_ILLEGAL_ADDRESS"), "{text}");
        assert_eq!(sig.class, cudabisect::classify::FaultClass::IllegalAddress);
        assert_eq!(sig.kernel.as_deref(), Some(kernel));
        assert_eq!(sig.site, Some(format!("node {node}")));
    }
}

#[test]
#[ignore = "needs an NVIDIA GPU, nvcc, compute-sanitizer and torch: run with --include-ignored on the GPU machine"]
fn the_kernel_cache_is_hit_on_the_second_run() {
    let tmp = tempfile::tempdir().unwrap();
    let cache = tmp.path().join("cache");
    let (c1, first) = harness(
        &["run", &model("transformer_block.toml"), "--backend", "cuda"],
        &cache,
    );
    let (c2, second) = harness(
        &["run", &model("transformer_block.toml"), "--backend", "cuda"],
        &cache,
    );
    assert_eq!((c1, c2), (0, 0), "{first}\n{second}");
    let count = |t: &str, what: &str| {
        t.lines()
            .filter(|l| l.starts_with("harness: kernels") && l.contains(what))
            .count()
    };
    for l in first
        .lines()
        .chain(second.lines())
        .filter(|l| l.starts_with("harness: kernels") || l.starts_with("harness: time"))
    {
        println!("{l}");
    }
    assert!(
        count(&first, "compiled") >= 4 && count(&first, "cache hit") == 0,
        "{first}"
    );
    assert_eq!(
        count(&second, "cache hit"),
        count(&first, "compiled"),
        "{second}"
    );
    assert_eq!(count(&second, "compiled"), 0, "{second}");
}

fn git_repo_with(dir: &std::path::Path, files: &[(&str, String)]) {
    let mut b = crate::common::repo_builder::RepoBuilder::init(dir).unwrap();
    let mut f = crate::common::repo_builder::Files::new();
    for (p, c) in files {
        crate::common::repo_builder::put(&mut f, p, c.clone(), false);
    }
    let c = b.commit(&[], &f, "model").unwrap();
    b.set_branch("main", c).unwrap();
    b.checkout_main().unwrap();
}

#[test]
#[ignore = "needs an NVIDIA GPU, nvcc, compute-sanitizer and torch: run with --include-ignored on the GPU machine"]
fn the_shrink_fixtures_shrink_to_their_needed_nodes_on_cuda() {
    let tmp = tempfile::tempdir().unwrap();
    for (file, want) in [
        ("shrink_one_node.toml", vec!["b2_lookup"]),
        (
            "shrink_two_nodes.toml",
            vec!["b1_cache_update", "b3_slot_lookup"],
        ),
        ("shrink_residual.toml", vec!["route"]),
    ] {
        let dir = tmp.path().join(file);
        let config = format!(
            "[repro]\ncommand = [\"{}\", \"harness\", \"run\", \"model.toml\", \"--backend\", \"cuda\"]\n\n[shrink]\nmodel = \"model.toml\"\nbackend = \"cuda\"\nconfirm = 3\n",
            bin().display()
        );
        git_repo_with(
            &dir,
            &[
                ("model.toml", std::fs::read_to_string(model(file)).unwrap()),
                ("bisect.toml", config),
            ],
        );
        let out = Command::new(bin())
            .args(["shrink", "--message-format", "json", "-C"])
            .arg(&dir)
            .env("CUDABISECT_CACHE_DIR", tmp.path().join("cache"))
            .output()
            .unwrap();
        let stdout = String::from_utf8_lossy(&out.stdout);
        let report = shrink_done(&crate::common::events(&stdout))
            .unwrap_or_else(|| panic!("{file}: no shrink_done: {stdout}"));
        println!("{file}: exit {:?}: {}", out.status.code(), report.summary);
        assert_eq!(crate::common::kept(&report), want, "{file}: {stdout}");
        assert_eq!(
            report.signature.as_ref().and_then(|s| s.code),
            Some(700),
            "{file}"
        );
        assert_eq!(
            report.confirmation.as_ref().map(|c| c.reproduced),
            Some(3),
            "{file}"
        );
        let minimal = report.minimal_model.as_deref().unwrap();
        let again = Command::new(bin())
            .args(["harness", "run", minimal, "--backend", "cuda"])
            .output()
            .unwrap();
        assert_eq!(
            again.status.code(),
            Some(1),
            "{file}: the minimal model alone"
        );
    }
}

#[test]
#[ignore = "needs an NVIDIA GPU, nvcc, compute-sanitizer and torch: run with --include-ignored on the GPU machine"]
fn the_demo_runs_on_cuda_with_sanitizer_triage() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("demo");
    let out = Command::new(bin())
        .args(["demo", "--dir"])
        .arg(&dir)
        .env("CUDABISECT_CACHE_DIR", tmp.path().join("cache"))
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    println!("{stdout}");
    for l in stderr
        .lines()
        .filter(|l| l.starts_with("demo:") || l.contains("triage:"))
    {
        println!("{l}");
    }
    assert_eq!(out.status.code(), Some(0), "{stderr}");
    assert!(stderr.contains("a CUDA device is present"), "{stderr}");
    assert!(stdout.contains("Shrink: 1 of 21 nodes (embed)"), "{stdout}");
    let bundle = stdout
        .lines()
        .find_map(|l| l.strip_prefix("Bundle: "))
        .unwrap()
        .trim();
    let md = std::fs::read_to_string(std::path::Path::new(bundle).join("REPORT.md")).unwrap();
    let section = md.split("## compute-sanitizer").nth(1).unwrap_or("");
    println!(
        "REPORT.md triage section:{}",
        section.split("## Minimal").next().unwrap_or("")
    );
    assert!(section.contains("engine_gather"), "{md}");
    assert!(md.contains("- GPU: NVIDIA"), "{md}");
    let run = Command::new("sh")
        .arg(std::path::Path::new(bundle).join("reproduce.sh"))
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&run.stdout);
    println!(
        "reproduce.sh: exit {:?}, {}",
        run.status.code(),
        text.lines()
            .find(|l| l.contains("CUDA error"))
            .unwrap_or("")
    );
    assert_eq!(run.status.code(), Some(1), "{text}");
    assert!(text.contains("CUDA_ERROR_ILLEGAL_ADDRESS"), "{text}");
}

/// Shrinks a PyTorch fixture through the PyTorch harness and runs the written repro.py alone.
/// Whether a repro's signature has the class and kernel of a shrink report's.
fn same_signature(sig: &cudabisect::classify::Signature, report: &ShrinkReport) -> bool {
    report
        .signature
        .as_ref()
        .is_some_and(|s| s.class == sig.class && s.kernel == sig.kernel)
}

/// `cudabisect shrink --message-format json` in `dir`: the process's output and its events.
fn shrink_json(dir: &Path) -> (std::process::Output, Vec<Event>) {
    let out = Command::new(bin())
        .args(["shrink", "--message-format", "json", "-C"])
        .arg(dir)
        .output()
        .unwrap();
    let events = crate::common::events(&String::from_utf8_lossy(&out.stdout));
    (out, events)
}

/// The report of the `shrink_done` event, when there is one.
fn shrink_done(events: &[Event]) -> Option<ShrinkReport> {
    events.iter().find_map(|e| match e {
        Event::ShrinkDone { report } => Some((**report).clone()),
        _ => None,
    })
}

fn torch_case(fixture: &str, want: &[&str]) -> Result<String, String> {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("repo");
    let source = std::fs::read_to_string(root().join("fixtures/torch").join(fixture)).unwrap();
    let config = "[repro]\ncommand = [\"python3\", \"-c\", \"import toy_model\"]\n\n[shrink]\nmodel = \"toy_model:build\"\ninputs = \"toy_model:example_inputs\"\nconfirm = 3\ntimeout = \"10m\"\n".to_string();
    git_repo_with(&dir, &[("toy_model.py", source), ("bisect.toml", config)]);
    let (out, events) = shrink_json(&dir);
    let Some(report) = shrink_done(&events) else {
        return Err(format!(
            "{fixture}: no shrink_done: {}",
            String::from_utf8_lossy(&out.stderr)
        ));
    };
    let log = |name: &str| {
        std::fs::read_dir(dir.join(".git/cudabisect/runs"))
            .ok()
            .and_then(|mut d| d.next())
            .and_then(|e| {
                std::fs::read_to_string(e.ok()?.path().join("shrink/logs").join(name)).ok()
            })
            .unwrap_or_default()
    };
    let summary = format!(
        "{fixture}: {} | runs_to_minimal={} harness_runs={} duration={:.1}s signature={:?} | stderr: {}",
        report.summary,
        report.runs_to_minimal,
        report.harness_runs,
        report.duration_s,
        report.signature.as_ref().map(|s| s.short()),
        String::from_utf8_lossy(&out.stderr).lines().filter(|l| !l.starts_with('[')).collect::<Vec<_>>().join(" / ")
    );
    println!("{summary}");
    let kept: Vec<&str> = report.kept.iter().map(|n| n.id.as_str()).collect();
    // A kept node's id contains what was asked for (FX names nodes after their target).
    let matches = kept.len() == want.len() && kept.iter().zip(want).all(|(k, w)| k.contains(w));
    if !matches {
        return Err(format!(
            "{summary}\nkept {kept:?}, want {want:?}\nlocate log:\n{}",
            log("locate.log")
        ));
    }
    let kept_ops: Vec<&str> = report.kept.iter().map(|n| n.op.as_str()).collect();
    println!(
        "{fixture}: kept {kept:?} ops {kept_ops:?}; graph: {:?}",
        report.graph
    );
    let inputs = &report.kept[0].inputs;
    let shapes: Vec<String> = inputs
        .iter()
        .map(|t| format!("{}{}", t.name, t.shape_text()))
        .collect();
    println!("{fixture}: kept node inputs {shapes:?}");
    if inputs.is_empty() || inputs.iter().any(|t| t.shape.is_none()) {
        return Err(format!(
            "{summary}\nthe kept node's input shapes were not filled from the recording: {shapes:?}"
        ));
    }
    let repro = report.minimal_model.clone().unwrap_or_default();
    // A fresh directory holding only what extract wrote: the model's package is not importable there.
    let fresh = tempfile::tempdir().unwrap();
    let written: Vec<String> = std::fs::read_dir(Path::new(&repro).parent().unwrap())
        .unwrap()
        .filter_map(|e| e.ok())
        .map(|e| {
            let name = e.file_name().to_string_lossy().into_owned();
            std::fs::copy(e.path(), fresh.path().join(&name)).unwrap();
            name
        })
        .collect();
    println!("{fixture}: extract wrote {written:?}");
    let repro_text = std::fs::read_to_string(&repro).unwrap_or_default();
    if !repro_text.contains("NOT STANDALONE") && repro_text.contains("weights_only=False") {
        return Err(format!(
            "{fixture}: a standalone repro.py unpickles:\n{repro_text}"
        ));
    }
    // Both streams in one, in order, as cudabisect captures a run.
    let run = Command::new("sh")
        .arg("-c")
        .arg("python3 repro.py 2>&1")
        .env("CUDA_LAUNCH_BLOCKING", "1")
        .env_remove("PYTHONPATH")
        .current_dir(fresh.path())
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&run.stdout).into_owned();
    let code = run.status.code().unwrap_or(-1);
    let sig = cudabisect::classify::classify(cudabisect::classify::Exit::Code(code), &text);
    println!(
        "{fixture}: repro.py alone: exit {code}, {} (target {:?})",
        sig.short(),
        report.signature.as_ref().map(|s| s.short())
    );
    if !same_signature(&sig, &report) {
        return Err(format!(
            "repro.py shows {}:\n{text}\n--- repro.py ---\n{}",
            sig.short(),
            std::fs::read_to_string(&repro).unwrap_or_default()
        ));
    }
    Ok(summary)
}

#[test]
#[ignore = "needs an NVIDIA GPU, nvcc, compute-sanitizer and torch: run with --include-ignored on the GPU machine"]
fn pytorch_models_shrink_to_the_faulty_layer_and_repro_py_reproduces_alone() {
    let mut failures = Vec::new();
    for (fixture, want) in [
        ("resnet_triton.py", vec!["triton_relu"]),
        ("gpt2_gather.py", vec!["wpe"]),
        ("custom_op_triton.py", vec!["gather_rows"]),
        ("resnet_deep_control_flow.py", vec!["layer3_1_relu"]),
        ("nested_gather.py", vec!["blocks_1__lookup__embedding"]),
    ] {
        if let Err(e) = torch_case(fixture, &want) {
            failures.push(e);
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n\n"));
}

#[test]
#[ignore = "needs an NVIDIA GPU, nvcc, compute-sanitizer and torch: run with --include-ignored on the GPU machine"]
fn the_pytorch_harness_descends_into_an_untraceable_model_through_hooks_on_the_cpu() {
    let tmp = tempfile::tempdir().unwrap();
    std::fs::copy(
        root().join("fixtures/torch/untraceable.py"),
        tmp.path().join("toy_model.py"),
    )
    .unwrap();
    let harness = root().join("harness/torch_harness");
    let py = |args: &[&str]| {
        let out = Command::new("python3")
            .arg(&harness)
            .args([
                "--model",
                "toy_model:build",
                "--example-inputs",
                "toy_model:example_inputs",
                "--device",
                "cpu",
            ])
            .args(args)
            .current_dir(tmp.path())
            .output()
            .unwrap();
        let text = String::from_utf8_lossy(&out.stdout).into_owned()
            + &String::from_utf8_lossy(&out.stderr);
        (out.status.code().unwrap_or(-1), text)
    };
    let describe = |extra: &[&str]| {
        let file = tmp.path().join("describe.json");
        let mut args = vec!["describe"];
        args.extend(extra);
        args.extend(["--out", file.to_str().unwrap()]);
        let (code, text) = py(&args);
        assert_eq!(code, 0, "{text}");
        let d = cudabisect::protocol::types::Description::parse(&std::fs::read(&file).unwrap())
            .unwrap();
        let ids: Vec<String> = d.nodes.iter().map(|n| n.id.clone()).collect();
        (ids, d.graph.unwrap_or_default(), text)
    };
    // The model's own forward cannot be traced: it is one node, kept whole.
    let (ids, graph, text) = describe(&[]);
    println!("describe: {ids:?}; graph: {graph}");
    assert_eq!(ids, ["model"], "{text}");
    assert!(graph.contains("kept whole"), "{graph}");
    // The recorded run descends through hooks: nested markers name the call it died in.
    let rec = tmp.path().join("rec");
    let (code, text) = py(&["run", "--record", rec.to_str().unwrap()]);
    assert_eq!(code, 1, "{text}");
    let open: Vec<String> = cudabisect::marker::open_markers(&text)
        .iter()
        .map(|m| m.node.to_string())
        .collect();
    println!("recorded run: exit {code}, open markers {open:?}");
    assert_eq!(
        open,
        ["model", "model__pick", "model__pick__getitem"],
        "{text}"
    );
    // Described as recorded: the children (a chain: each got the previous one's output), and the op
    // inside `pick`, which FX could trace.
    let (ids, graph, _) = describe(&["--recording", rec.to_str().unwrap()]);
    println!("describe --recording: {ids:?}; graph: {graph}");
    assert_eq!(
        ids,
        [
            "model__lin1",
            "model__act",
            "model__lin2",
            "model__pick__getitem"
        ]
    );
    assert!(
        graph.contains("model: chain of children") && graph.contains("model__pick: fx"),
        "{graph}"
    );
    let (code, text) = py(&[
        "run",
        "--keep",
        "model__pick__getitem",
        "--recording",
        rec.to_str().unwrap(),
    ]);
    assert_eq!(code, 1, "{text}");
    assert!(text.contains("IndexError"), "{text}");
    let (code, text) = py(&[
        "run",
        "--keep",
        "model__act,model__lin2",
        "--recording",
        rec.to_str().unwrap(),
    ]);
    assert_eq!(code, 0, "{text}");
    assert!(
        text.contains("@@cudabisect node=model__lin2 op=Linear kernel=Linear end"),
        "{text}"
    );
    let out = tmp.path().join("min");
    let (code, text) = py(&[
        "extract",
        "--keep",
        "model__lin2",
        "--recording",
        rec.to_str().unwrap(),
        "--out",
        out.to_str().unwrap(),
    ]);
    assert_eq!(code, 0, "{text}");
    let run = Command::new("python3")
        .arg(out.join("repro.py"))
        .env("REPRO_DEVICE", "cpu")
        .current_dir("/")
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&run.stdout);
    println!(
        "repro.py on cpu: exit {:?}: {}",
        run.status.code(),
        text.lines().last().unwrap_or("")
    );
    assert_eq!(
        run.status.code(),
        Some(0),
        "{text}{}",
        String::from_utf8_lossy(&run.stderr)
    );
    assert!(text.contains("repro: ran clean"));
    // A torch.nn module is rebuilt from code and its state dict: nothing is unpickled.
    let repro = std::fs::read_to_string(out.join("repro.py")).unwrap();
    assert!(
        !repro.contains("weights_only=False") && !out.join("repro_modules.pt").exists(),
        "{repro}"
    );
    assert!(repro.contains("torch.nn.Linear("), "{repro}");
}

#[test]
#[ignore = "needs an NVIDIA GPU, nvcc, compute-sanitizer and torch: run with --include-ignored on the GPU machine"]
fn a_kernel_that_does_not_compile_fails_the_build_with_the_nvrtc_log() {
    let tmp = tempfile::tempdir().unwrap();
    let text = std::fs::read_to_string(model("mlp.toml"))
        .unwrap()
        .replace("[model]\n", "[model]\nkernels = [\"mine.cu\"]\n")
        .replace("op = \"gelu\"", "op = \"gelu\"\nkernel = \"my_gelu\"");
    std::fs::write(tmp.path().join("m.toml"), text).unwrap();
    std::fs::write(
        tmp.path().join("mine.cu"),
        "extern \"C\" __global__ void my_gelu(float *out, const float *x, long long total) {\n  out[0] = x[0] +;\n}\n",
    )
    .unwrap();
    let m = tmp.path().join("m.toml").display().to_string();
    let (code, text) = harness(
        &["build", &m, "--backend", "cuda"],
        &tmp.path().join("cache"),
    );
    println!(
        "build of a broken kernel: exit {code}: {}",
        text.lines().find(|l| l.contains("error")).unwrap_or("")
    );
    assert_eq!(code, 2, "{text}");
    assert!(
        text.contains("kernel compilation failed for mine.cu") && text.contains("mine.cu(2)"),
        "{text}"
    );
    std::fs::write(
        tmp.path().join("mine.cu"),
        "extern \"C\" __global__ void my_gelu(float *out, const float *x, long long total) {\n  long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x;\n  if (i < total) out[i] = x[i];\n}\n",
    )
    .unwrap();
    let (code, text) = harness(
        &["build", &m, "--backend", "cuda"],
        &tmp.path().join("cache"),
    );
    assert_eq!(code, 0, "{text}");
    assert!(
        text.contains("harness: kernels mine.cu: compiled"),
        "{text}"
    );
}

/// A small PyTorch package whose two Triton kernels each get an out-of-bounds store in different parts of
/// its history; both are launched through one helper, so only the kernel tells the bugs apart.
/// Runs `cudabisect ARGS -C DIR --report REPORT`, prints its summary, its probes' lines and its wall time,
/// asserts it exited 0, and returns the report and stdout.
fn start_with_report(dir: &Path, args: &[&str], report: &Path) -> (Report, String) {
    let started = std::time::Instant::now();
    let out = Command::new(bin())
        .args(args)
        .arg("-C")
        .arg(dir)
        .arg("--report")
        .arg(report)
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    let stderr = String::from_utf8_lossy(&out.stderr);
    println!("{stdout}");
    // Each probe's verdict, and the stage lines with their times (where the time after the search goes).
    for l in stderr.lines().filter(|l| {
        ["→", "compute-sanitizer", "shrink:", "triage:", "bundle:"]
            .iter()
            .any(|w| l.contains(w))
    }) {
        println!("{l}");
    }
    println!("wall {:.1}s", started.elapsed().as_secs_f64());
    assert_eq!(out.status.code(), Some(0), "{stdout}");
    let text = std::fs::read_to_string(report).unwrap();
    let r = serde_json::from_str(&text).unwrap_or_else(|e| panic!("not a report ({e}): {text}"));
    (r, stdout)
}

/// A report's part as the JSON it was written as, for the test's printout.
fn json(v: &impl serde::Serialize) -> String {
    serde_json::to_string(v).unwrap()
}

/// The target's kernel is `kernel`.
fn assert_target_kernel(r: &Report, kernel: &str) {
    assert_eq!(
        r.target.as_ref().and_then(|t| t.kernel.as_deref()),
        Some(kernel),
        "{:#?}",
        r.target
    );
}

/// Another bug was met on the way, and every other bug is in `kernel`.
fn assert_other_bugs_in(r: &Report, kernel: &str) {
    assert!(
        !r.other_bugs.is_empty(),
        "the other bug was never met: {r:#?}"
    );
    assert!(r
        .other_bugs
        .iter()
        .all(|o| o.signature.kernel.as_deref() == Some(kernel)));
}

fn two_bug_files(
    bias_bug: bool,
    embed_bug: bool,
    note: usize,
) -> crate::common::repo_builder::Files {
    use crate::common::repo_builder::{put, Files};
    let mut f = Files::new();
    put(&mut f, "pkg/__init__.py", "", false);
    put(
        &mut f,
        "pkg/launch.py",
        "def run(kernel, grid, *args, **kw):\n    # Every kernel of the package goes through here: the launch site is the same for all.\n    kernel[grid](*args, **kw)\n",
        false,
    );
    let kernel = |name: &str, body: &str, bug: bool| {
        format!(
            "import torch\nimport triton\nimport triton.language as tl\nfrom pkg.launch import run\n\n\n@triton.jit\ndef _{name}_kernel(x_ptr, out_ptr, n, BLOCK: tl.constexpr):\n    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)\n    x = tl.load(x_ptr + offs, mask=offs < n, other=0.0)\n    tl.store(out_ptr + offs, {body}{mask})\n\n\ndef {name}(x):\n    out = torch.empty_like(x)\n    n = x.numel()\n    blocks = {blocks}\n    run(_{name}_kernel, (blocks,), x, out, n, BLOCK=1024)\n    return out\n",
            mask = if bug { "" } else { ", mask=offs < n" },
            blocks = if bug { "n * 64  # far too many blocks, and the store is unmasked" } else { "triton.cdiv(n, 1024)" },
        )
    };
    put(
        &mut f,
        "pkg/ops.py",
        kernel("bias_gelu", "x * 0.5", bias_bug),
        false,
    );
    put(
        &mut f,
        "pkg/embed.py",
        kernel("hash_embed", "x + 1.0", embed_bug),
        false,
    );
    put(
        &mut f,
        "pkg/model.py",
        "from pkg.embed import hash_embed\nfrom pkg.ops import bias_gelu\n\n\ndef forward(x):\n    return hash_embed(bias_gelu(x))\n",
        false,
    );
    put(
        &mut f,
        "train.py",
        "import torch\nfrom pkg.model import forward\n\nx = torch.randn(1 << 16, device='cuda')\ny = forward(x)\ntorch.cuda.synchronize()\nprint('ok', float(y.sum()))\n",
        false,
    );
    put(
        &mut f,
        "bisect.toml",
        "[repro]\ncommand = [\"python3\", \"train.py\"]\ntimeout = \"300s\"\n\n[triage]\nenabled = true\ntimeout = \"10m\"\n",
        false,
    );
    put(&mut f, "NOTES.md", format!("revision {note}\n"), false);
    f
}

#[test]
#[ignore = "needs an NVIDIA GPU, nvcc, compute-sanitizer and torch: run with --include-ignored on the GPU machine"]
fn two_triton_bugs_of_one_class_are_told_apart_and_the_right_commit_is_named() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("twobugs");
    // The other bug spans the middle of the range, where the first probes land; the target starts at 22.
    let commits = linear_history(
        &dir,
        (0..30).map(|i| two_bug_files((10..=19).contains(&i), i >= 22, i)),
    )
    .unwrap();
    let range = format!("{}..main", commits[0]);
    // Several probes at once: a round may stop its probes inside the other bug's span once a clean probe
    // above it answers (they no longer matter), so meeting the other bug there is a matter of timing.
    let (r, stdout) = start_with_report(
        &dir,
        &["start", &range, "--no-shrink"],
        &tmp.path().join("report.json"),
    );
    println!("target: {}", json(&r.target));
    println!("other bugs: {}", json(&r.other_bugs));
    assert_eq!(first_bad(&r), Some(commits[22].to_string()), "{stdout}");
    assert_target_kernel(&r, "_hash_embed_kernel");
    assert!(r
        .other_bugs
        .iter()
        .all(|o| o.signature.kernel.as_deref() == Some("_bias_gelu_kernel")));
    // One probe at a time: the first cut lands in the other bug's span, so it is met and told apart.
    let (r, stdout) = start_with_report(
        &dir,
        &[
            "start",
            &range,
            "--no-shrink",
            "--no-triage",
            "--jobs",
            "1",
            "--fresh",
        ],
        &tmp.path().join("serial.json"),
    );
    println!("other bugs, one at a time: {}", json(&r.other_bugs));
    assert_eq!(first_bad(&r), Some(commits[22].to_string()), "{stdout}");
    assert_other_bugs_in(&r, "_bias_gelu_kernel");
}

#[test]
#[ignore = "needs an NVIDIA GPU, compute-sanitizer, torch and triton: run with --include-ignored on the GPU machine"]
fn cold_probes_pay_one_sanitizer_run_per_fault_stack_and_still_tell_the_two_bugs_apart() {
    // Cold probes name no Triton kernel (no launch hook): every lookalike must be settled by memcheck,
    // once per fault stack.
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("twobugs-cold");
    let commits = linear_history(
        &dir,
        (0..30).map(|i| {
            let mut f = two_bug_files((10..=19).contains(&i), i >= 22, i);
            put(
                &mut f,
                "bisect.toml",
                "[repro]\ncommand = [\"python3\", \"train.py\"]\ntimeout = \"300s\"\nwarm = false\n\n[triage]\nenabled = true\ntimeout = \"10m\"\n",
                false,
            );
            f
        }),
    )
    .unwrap();
    // One worker: the bisection meets the other bug's range in its order, and every lookalike's
    // sanitizer run is waited for (with several, one that outlasts the search is stopped unjudged, as
    // the driver tests check).
    let (r, stdout) = start_with_report(
        &dir,
        &[
            "start",
            &format!("{}..main", commits[0]),
            "--no-shrink",
            "--jobs",
            "1",
        ],
        &tmp.path().join("report.json"),
    );
    assert_eq!(first_bad(&r), Some(commits[22].to_string()), "{stdout}");
    let probes = &r.probes;
    let ran: Vec<&str> = probes
        .iter()
        .filter_map(|p| p.sanitizer.as_deref())
        .collect();
    for p in probes {
        println!(
            "{:?} {:?} {:?} {:?}",
            p.role, p.verdict, p.signature.kernel, p.sanitizer
        );
    }
    let fresh = ran
        .iter()
        .filter(|s| !s.starts_with("not run again"))
        .count();
    let remembered = ran.len() - fresh;
    println!("sanitizer runs: {fresh}; answers remembered: {remembered}");
    // The bad endpoint's run, the first lookalike's and the culprit's own check before it is named; every
    // other lookalike or target probe remembered.
    assert!(fresh <= 3, "{ran:?}");
    assert!(remembered >= 1, "{ran:?}");
    assert_other_bugs_in(&r, "_bias_gelu_kernel");
}

#[test]
#[ignore = "needs an NVIDIA GPU, compute-sanitizer, torch and triton: run with --include-ignored on the GPU machine"]
fn find_fix_names_the_fix_and_is_not_misled_by_another_triton_bug_of_the_same_class() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("fixbugs");
    // The fault (hash_embed) shows at 3..=14 and is fixed at 15; another bug of the same class, through
    // the same launch wrapper (bias_gelu), shows at 17..=22, where the first probes after the fix land.
    let commits = linear_history(
        &dir,
        (0..26).map(|i| two_bug_files((17..=22).contains(&i), (3..=14).contains(&i), i)),
    )
    .unwrap();
    let (r, stdout) = start_with_report(
        &dir,
        &["start", "--find-fix", &format!("{}..main", commits[3])],
        &tmp.path().join("report.json"),
    );
    println!("fault: {}", json(&r.target));
    assert_eq!(first_bad(&r), Some(commits[15].to_string()), "{stdout}");
    assert_target_kernel(&r, "_hash_embed_kernel");
    assert!(stdout.contains("First fixed commit"), "{stdout}");
}

/// A torch repro that gathers far past its table at and after the culprit commit, and logs which GPU
/// it ran on and when (for the rounds and the pinning).
const TWO_GPU_REPRO: &str = include_str!("fakes/gpu_two_gpu_repro.py");

#[test]
#[ignore = "needs two NVIDIA GPUs and torch: run with --include-ignored on the two-GPU machine"]
fn a_parallel_bisection_on_two_gpus_pins_each_worker_to_its_own_gpu() {
    need_two_gpus();
    let tmp = tempfile::tempdir().unwrap();
    let repo = tmp.path().join("repo");
    let log = tmp.path().join("runs.log");
    let culprit = 19;
    let config = format!(
        "[repro]\ncommand = [\"python3\", \"repro.py\"]\ntimeout = \"5m\"\nenv = {{ RUN_LOG = \"{}\" }}\n\n[triage]\nenabled = false\n\n[search]\njobs = \"auto\"\n",
        log.display()
    );
    let commits = linear_history(
        &repo,
        (0..32).map(|i| {
            let mut f = Files::new();
            let state = if i >= culprit { "bad" } else { "good" };
            put(&mut f, "repro.py", TWO_GPU_REPRO, false);
            put(&mut f, "state.txt", format!("{state}\n"), false);
            put(&mut f, "rev.txt", format!("{i}\n"), false);
            put(&mut f, "bisect.toml", config.clone(), false);
            f
        }),
    )
    .unwrap();
    let mut walls = Vec::new();
    for jobs in ["1", "auto"] {
        let _ = std::fs::remove_file(&log);
        let started = std::time::Instant::now();
        let out = Command::new(bin())
            .args([
                "start",
                &format!("{}..main", commits[0]),
                "--no-shrink",
                "--fresh",
                "--jobs",
                jobs,
                "-C",
            ])
            .arg(&repo)
            .output()
            .unwrap();
        let wall = started.elapsed().as_secs_f64();
        let stdout = String::from_utf8_lossy(&out.stdout);
        assert_eq!(
            out.status.code(),
            Some(0),
            "{stdout}{}",
            String::from_utf8_lossy(&out.stderr)
        );
        assert!(stdout.contains(&commits[culprit].to_string()), "{stdout}");
        let runs = std::fs::read_to_string(&log).unwrap_or_default();
        let devices: std::collections::BTreeSet<&str> = runs
            .lines()
            .filter_map(|l| l.split_whitespace().next())
            .collect();
        // Clean runs only (a faulting run dies before it logs): distinct start seconds bunch into rounds.
        let mut starts: Vec<f64> = runs
            .lines()
            .filter_map(|l| l.split_whitespace().nth(2)?.parse().ok())
            .collect();
        starts.sort_by(f64::total_cmp);
        let rounds = starts.windows(2).filter(|w| w[1] - w[0] > 1.0).count()
            + usize::from(!starts.is_empty());
        println!(
            "--jobs {jobs}: wall {wall:.1} s, clean runs {} on devices {devices:?}, rounds of clean runs {rounds}",
            starts.len()
        );
        if jobs == "auto" {
            assert!(devices.contains("0") && devices.contains("1"), "{runs}");
            assert!(
                runs.lines()
                    .all(|l| l.split_whitespace().nth(1) == Some("1")),
                "each worker sees one GPU: {runs}"
            );
        }
        walls.push(wall);
    }
    println!(
        "wall time: one at a time {:.1} s, one worker per GPU {:.1} s",
        walls[0], walls[1]
    );
}

#[test]
#[ignore = "needs two NVIDIA GPUs, torch and triton: run with --include-ignored on the two-GPU machine"]
fn a_torchrun_repro_is_bisected_to_the_commit_where_rank_one_faults_through_an_nccl_hang() {
    need_two_gpus();
    let scenario =
        std::fs::read_to_string(root().join("fixtures/logs/multirank/scenario.py")).unwrap();
    let tmp = tempfile::tempdir().unwrap();
    let repo = tmp.path().join("repo");
    let report = tmp.path().join("report.json");
    // A collective mismatch (rank 1 leaves, rank 0 waits in all_reduce: under CUDA_LAUNCH_BLOCKING=1 a
    // silent hang) where the search looks first, then rank 1's Triton gather past its table from 8 on.
    let modes = [
        "clean",
        "clean",
        "clean",
        "clean",
        "collective_mismatch",
        "collective_mismatch",
        "collective_mismatch",
        "clean",
        "kernel_fault",
        "kernel_fault",
        "kernel_fault",
        "kernel_fault",
    ];
    let config = "[repro]\ncommand = [\"sh\", \"-c\", \"exec torchrun --nproc-per-node $CUDABISECT_GPUS scenario.py $(cat mode.txt)\"]\ntimeout = \"45s\"\ngpus = 2\n\n[triage]\nenabled = false\n";
    let mut fixed = Files::new();
    put(&mut fixed, "scenario.py", scenario, false);
    let commits = history_of_modes(&repo, &modes, &fixed, config).unwrap();
    let started = std::time::Instant::now();
    let out = Command::new(bin())
        .args([
            "start",
            &format!("{}..main", commits[0]),
            "--no-shrink",
            "--fresh",
            "-C",
        ])
        .arg(&repo)
        .arg("--report")
        .arg(&report)
        .output()
        .unwrap();
    let wall = started.elapsed().as_secs_f64();
    let stdout = String::from_utf8_lossy(&out.stdout);
    println!("{stdout}{}", String::from_utf8_lossy(&out.stderr));
    assert_eq!(out.status.code(), Some(0), "{stdout}");
    let report: Report = serde_json::from_str(&std::fs::read_to_string(&report).unwrap()).unwrap();
    assert_eq!(first_bad(&report), Some(commits[8].to_string()));
    let probes = &report.probes;
    for p in probes {
        let s = &p.signature;
        println!(
            "probe {} ({:?}): {:?} {} rank={:?} site={:?} detail={:?}",
            &p.commit[..12],
            p.role,
            p.verdict,
            s.class.as_str(),
            s.rank,
            s.site,
            s.detail
        );
        assert!(
            !s.site.as_deref().unwrap_or("").contains("torchrun"),
            "a launcher frame as site: {p:#?}"
        );
    }
    let bad = probes
        .iter()
        .find(|p| p.commit == commits[8].to_string())
        .unwrap();
    assert_eq!(
        bad.signature.class,
        cudabisect::classify::FaultClass::IllegalAddress,
        "{bad:#?}"
    );
    assert_eq!(bad.signature.rank, Some(1), "{bad:#?}");
    let hangs: Vec<_> = probes
        .iter()
        .filter(|p| p.signature.class == cudabisect::classify::FaultClass::Hang)
        .collect();
    assert!(!hangs.is_empty(), "the search never met the hang stretch");
    assert!(hangs
        .iter()
        .all(|p| p.verdict == cudabisect::report::record::Verdict::Skip));
    // Every rank and the launcher are gone, and the GPUs are free.
    let left = Command::new("nvidia-smi")
        .args(["--query-compute-apps=pid", "--format=csv,noheader"])
        .output()
        .unwrap();
    let left = String::from_utf8_lossy(&left.stdout);
    assert!(left.trim().is_empty(), "processes left on the GPUs: {left}");
    println!(
        "wall {wall:.1} s, {} probes, {} hang(s) skipped",
        probes.len(),
        hangs.len()
    );
}

/// The GPU training fixture (`fixtures/torch/training_gpu`: trainpkg and train.py) as one commit's files,
/// `kernels.py` edited by `edits` (text replacements), with `config` as bisect.toml.
fn trainpkg_files(edits: &[(&str, &str)], config: &str) -> Files {
    let base = root().join("fixtures/torch/training_gpu");
    let mut f = Files::new();
    for p in ["trainpkg/__init__.py", "trainpkg/model.py", "train.py"] {
        put(
            &mut f,
            p,
            std::fs::read_to_string(base.join(p)).unwrap(),
            false,
        );
    }
    let mut kernels = std::fs::read_to_string(base.join("trainpkg/kernels.py")).unwrap();
    for (from, to) in edits {
        assert!(kernels.contains(from), "kernels.py has no {from:?}");
        kernels = kernels.replace(from, to);
    }
    put(&mut f, "trainpkg/kernels.py", kernels, false);
    put(&mut f, "bisect.toml", config.to_string(), false);
    f
}

/// Runs the bundle's reproduce.sh against the repository from another directory; its exit status and
/// signature.
fn reproduce_from_bundle(
    bundle: &Path,
    repo: &Path,
) -> (i32, cudabisect::classify::Signature, String) {
    let elsewhere = tempfile::tempdir().unwrap();
    let out = Command::new("sh")
        .arg("-c")
        .arg(format!(
            "{} {} 2>&1",
            bundle.join("reproduce.sh").display(),
            repo.display()
        ))
        .current_dir(elsewhere.path())
        .env("TMPDIR", elsewhere.path())
        .env_remove("PYTHONPATH")
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    let code = out.status.code().unwrap_or(-1);
    let sig = cudabisect::classify::classify(cudabisect::classify::Exit::Code(code), &text);
    (code, sig, text)
}

#[test]
#[ignore = "needs an NVIDIA GPU, torch and triton: run with --include-ignored on the GPU machine"]
fn training_scripts_are_captured_and_shrunk_to_the_faulting_backward_or_update_on_cuda() {
    let mut failures = Vec::new();
    for (case, args, edits, want, phase, step) in [
        // A Triton backward kernel behind a torch.autograd.Function; only step 3's batch has a hot row.
        (
            "autograd.Function",
            "--emb fn",
            vec![],
            "emb__GatherFn__backward",
            "backward",
            3,
        ),
        // The same kernel behind a custom_op whose register_autograd backward is another custom_op (FX
        // traces the module down to the op's call: the node is the op's).
        (
            "custom_op + register_autograd",
            "--emb op",
            vec![],
            "embed_default__backward",
            "backward",
            3,
        ),
        // A fused Triton SGD update writes far away: the optimizer step, from step 1.
        (
            "optimizer",
            "--emb plain --opt triton",
            vec![("BUG_SGD_STRIDE = 1\n", "BUG_SGD_STRIDE = 1 << 22\n")],
            "optimizer_step",
            "optimizer",
            1,
        ),
    ] {
        let tmp = tempfile::tempdir().unwrap();
        let dir = tmp.path().join("repo");
        let argv: Vec<String> = args.split(' ').map(|a| format!("{a:?}")).collect();
        let config = format!(
            "[repro]\ncommand = [\"python3\", \"train.py\", {}]\ntimeout = \"5m\"\n\n[shrink]\nconfirm = 3\ntimeout = \"10m\"\n",
            argv.join(", ")
        );
        linear_history(&dir, [trainpkg_files(&edits, &config)]).unwrap();
        let started = std::time::Instant::now();
        let (out, events) = shrink_json(&dir);
        let Some(report) = shrink_done(&events) else {
            failures.push(format!(
                "{case}: no shrink_done: {}",
                String::from_utf8_lossy(&out.stderr)
            ));
            continue;
        };
        let kept: Vec<&str> = report.kept.iter().map(|n| n.id.as_str()).collect();
        let captured = report.captured.as_ref();
        println!(
            "{case}: {} | captured step {:?} phase {:?} | kept {kept:?} | signature {:?} | {:.1}s",
            report.summary,
            captured.map(|c| c.step),
            captured.map(|c| &c.phase),
            report.signature.as_ref().map(|s| s.short()),
            started.elapsed().as_secs_f64()
        );
        if kept != [want]
            || captured.map(|c| c.phase.as_str()) != Some(phase)
            || captured.map(|c| c.step) != Some(step)
        {
            failures.push(format!(
                "{case}: kept {kept:?} captured {}, want [{want}] in {phase} at step {step}\n{}",
                json(&report.captured),
                String::from_utf8_lossy(&out.stderr)
            ));
            continue;
        }
        let bundle = events.iter().find_map(|e| match e {
            Event::BundleWritten { path, .. } => Some(PathBuf::from(path)),
            _ => None,
        });
        let Some(bundle) = bundle else {
            failures.push(format!("{case}: no bundle"));
            continue;
        };
        let (code, sig, text) = reproduce_from_bundle(&bundle, &dir);
        println!(
            "{case}: reproduce.sh: exit {code}, {} (target {:?})",
            sig.short(),
            report.signature.as_ref().map(|s| s.short())
        );
        if !same_signature(&sig, &report) {
            failures.push(format!(
                "{case}: reproduce.sh shows {}:\n{text}",
                sig.short()
            ));
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n\n"));
}

#[test]
#[ignore = "needs an NVIDIA GPU, compute-sanitizer, torch and triton: run with --include-ignored on the GPU machine"]
fn start_on_a_custom_op_package_names_the_culprit_and_keeps_its_minimal_training_repro() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("repo");
    let config = "[repro]\ncommand = [\"python3\", \"train.py\", \"--emb\", \"op\"]\ntimeout = \"5m\"\n\n[shrink]\nconfirm = 3\ntimeout = \"10m\"\n";
    let clean = [("BUG_OP_BWD_STRIDE = 1 << 22\n", "BUG_OP_BWD_STRIDE = 1\n")];
    let commits = linear_history(
        &dir,
        (0..6).map(|i| trainpkg_files(if i < 3 { &clean[..] } else { &[] }, config)),
    )
    .unwrap();
    let report_path = tmp.path().join("report.json");
    let started = std::time::Instant::now();
    let out = Command::new(bin())
        .args(["start", &format!("{}..main", commits[0]), "-C"])
        .arg(&dir)
        .arg("--report")
        .arg(&report_path)
        .output()
        .unwrap();
    let text =
        String::from_utf8_lossy(&out.stdout).into_owned() + &String::from_utf8_lossy(&out.stderr);
    println!("{text}");
    let r: Report = serde_json::from_str(
        &std::fs::read_to_string(&report_path).unwrap_or_else(|_| panic!("no report: {text}")),
    )
    .unwrap();
    let s = crate::common::shrink_of(&r, &text);
    println!(
        "start: culprit {:?} (want {}), target {:?}, shrink {} | kept {} | {:.1}s",
        first_bad(&r),
        commits[3],
        r.target.as_ref().map(|t| t.short()),
        s.summary,
        s.kept.len(),
        started.elapsed().as_secs_f64()
    );
    assert_eq!(first_bad(&r), Some(commits[3].to_string()), "{text}");
    assert_eq!(
        s.status,
        cudabisect::report::record::ShrinkStatus::Minimal,
        "{text}"
    );
    assert_eq!(
        crate::common::kept(s),
        ["embed_default__backward"],
        "{text}"
    );
    let bundle = PathBuf::from(r.bundle.as_deref().unwrap());
    let (code, sig, repro) = reproduce_from_bundle(&bundle, &dir);
    println!("start: reproduce.sh: exit {code}, {}", sig.short());
    assert_eq!(
        Some(sig.class),
        r.target.as_ref().map(|t| t.class),
        "{repro}"
    );
    assert_eq!(
        sig.kernel,
        s.signature.as_ref().and_then(|g| g.kernel.clone()),
        "{repro}"
    );
}

/// A Python build step on the GPU machine: it imports torch, triton and the commit's kernels, and asks
/// for the device (a build's child may: its warm interpreter never does).
const GPU_BUILD: &str = "import torch\nimport triton\nimport trainpkg.kernels\nassert torch.cuda.is_available()\nopen('built.txt', 'w').write(triton.__version__)\n";

#[test]
#[ignore = "needs an NVIDIA GPU, torch and triton: run with --include-ignored on the GPU machine"]
fn a_python_build_of_a_training_package_runs_warm_and_the_culprit_is_named() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("repo");
    let config = "[build]\ncommand = \"python3 build.py\"\n\n[repro]\ncommand = [\"python3\", \"train.py\", \"--emb\", \"op\"]\ntimeout = \"5m\"\n\n[triage]\nenabled = false\n";
    let clean = [("BUG_OP_BWD_STRIDE = 1 << 22\n", "BUG_OP_BWD_STRIDE = 1\n")];
    let commits = linear_history(
        &dir,
        (0..8).map(|i| {
            let mut f = trainpkg_files(if i < 5 { &clean[..] } else { &[] }, config);
            put(&mut f, "build.py", GPU_BUILD.to_string(), false);
            f
        }),
    )
    .unwrap();
    let report_path = tmp.path().join("report.json");
    let started = std::time::Instant::now();
    let range = format!("{}..main", commits[0]);
    let (r, text) = start_with_report(&dir, &["start", &range, "--no-shrink"], &report_path);
    let probes = &r.probes;
    for p in probes {
        println!(
            "  {:?} {}: build {:?} ({:?}), repro {:?}, {:.1}s",
            p.role, p.commit, p.build_runner, p.verdict, p.runner, p.duration_s
        );
    }
    println!(
        "start: culprit {:?} (want {}), {} probes, {:.1}s",
        first_bad(&r),
        commits[5],
        probes.len(),
        started.elapsed().as_secs_f64()
    );
    assert_eq!(first_bad(&r), Some(commits[5].to_string()), "{text}");
    assert!(!probes.is_empty(), "{text}");
    for p in probes {
        assert_eq!(p.build_runner.as_deref(), Some("warm"), "{p:?}");
    }
}

/// The GPU JAX fixture (a Pallas kernel reading a window at an offset from memory) with `offset` and
/// `config` as bisect.toml.
fn jax_gpu_files(offset: i64, config: &str) -> Files {
    let mut f = Files::new();
    for p in [
        "gk/__init__.py",
        "gk/kernels.py",
        "gk/step.py",
        "gk/kmodel.py",
        "train.py",
    ] {
        let text = std::fs::read_to_string(root().join("fixtures/jax/gpu").join(p)).unwrap();
        put(&mut f, p, text, false);
    }
    put(
        &mut f,
        "gk/offsets.py",
        format!("OFFSET = {offset}\n"),
        false,
    );
    put(&mut f, "bisect.toml", config.to_string(), false);
    f
}

/// Checks that a shrink report's `repro.py` needs nothing of the project and, run alone from a fresh
/// directory, faults with an illegal address; returns what it printed.
fn standalone_repro_faults(shrink: &ShrinkReport) -> String {
    let minimal = PathBuf::from(
        shrink
            .minimal_model
            .as_deref()
            .unwrap_or_else(|| panic!("no repro.py: {:?}", shrink.extract_error)),
    );
    let repro = std::fs::read_to_string(&minimal).unwrap();
    assert!(!repro.contains("cudabisect-needs-project"), "{repro}");
    let (code, out) = repro_alone(minimal.parent().unwrap());
    println!(
        "repro.py alone: exit {code:?}\n{}",
        out.lines().take(8).collect::<Vec<_>>().join("\n")
    );
    assert_eq!(code, Some(1), "{out}");
    assert!(
        out.contains("CUDA_ERROR_ILLEGAL_ADDRESS") || out.contains("illegal memory access"),
        "{out}"
    );
    out
}

/// Runs a minimal repro's folder from a fresh directory without the project; its exit and output.
fn repro_alone(minimal: &Path) -> (Option<i32>, String) {
    let fresh = tempfile::tempdir().unwrap();
    cudabisect::report::bundle::copy_dir(minimal, fresh.path()).unwrap();
    let out = Command::new("python3")
        .arg(fresh.path().join("repro.py"))
        .current_dir(fresh.path())
        .env("CUDA_LAUNCH_BLOCKING", "1")
        .env_remove("PYTHONPATH")
        .output()
        .unwrap();
    (
        out.status.code(),
        String::from_utf8_lossy(&out.stdout).into_owned() + &String::from_utf8_lossy(&out.stderr),
    )
}

#[test]
#[ignore = "needs an NVIDIA GPU and jax with CUDA (and keras): run with --include-ignored on the GPU machine"]
fn a_jax_training_step_with_a_faulting_pallas_kernel_is_bisected_shrunk_and_handed_off() {
    let config = "[repro]\ncommand = [\"python3\", \"train.py\"]\ntimeout = \"300s\"\n\n[triage]\nenabled = false\n\n[shrink]\nframework = \"jax\"\nfunction = \"gk.step:train_step\"\ninputs = \"gk.step:example_inputs\"\nconfirm = 2\ntimeout = \"300s\"\n";
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("repo");
    let commits = linear_history(
        &dir,
        [0, 0, 0, -(1 << 28), -(1 << 28), -(1 << 28)].map(|o| jax_gpu_files(o, config)),
    )
    .unwrap();
    let report_path = tmp.path().join("report.json");
    let (r, text) = start_with_report(
        &dir,
        &["start", &format!("{}..main", commits[0])],
        &report_path,
    );
    assert_eq!(first_bad(&r), Some(commits[3].to_string()), "{text}");
    assert_eq!(
        r.target.as_ref().map(|t| t.class),
        Some(cudabisect::classify::FaultClass::IllegalAddress),
        "{text}"
    );
    let s = crate::common::shrink_of(&r, &text);
    assert_eq!(
        s.status,
        cudabisect::report::record::ShrinkStatus::Minimal,
        "{text}"
    );
    assert_eq!(crate::common::kept(s), ["e003_pallas_call"], "{text}");
    assert_eq!(
        s.signature.as_ref().and_then(|g| g.kernel.as_deref()),
        Some("window_kernel"),
        "{text}"
    );
    let out = standalone_repro_faults(s);
    assert!(
        out.contains("@@cudabisect launch kernel=window_kernel"),
        "{out}"
    );
}

#[test]
#[ignore = "needs an NVIDIA GPU and jax with CUDA (and keras): run with --include-ignored on the GPU machine"]
fn a_keras_model_with_a_faulting_pallas_layer_is_shrunk_to_that_layer() {
    let config = "[repro]\ncommand = [\"python3\", \"train.py\"]\n\n[shrink]\nframework = \"keras\"\nmodel = \"gk.kmodel:build\"\ninputs = \"gk.kmodel:example_inputs\"\nconfirm = 2\ntimeout = \"300s\"\n";
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("repo");
    linear_history(&dir, [jax_gpu_files(-(1 << 28), config)]).unwrap();
    let started = std::time::Instant::now();
    let (out, events) = shrink_json(&dir);
    let text =
        String::from_utf8_lossy(&out.stdout).into_owned() + &String::from_utf8_lossy(&out.stderr);
    println!(
        "{}",
        text.lines()
            .filter(|l| !l.starts_with('{'))
            .collect::<Vec<_>>()
            .join("\n")
    );
    println!("wall {:.1}s", started.elapsed().as_secs_f64());
    let r = shrink_done(&events).unwrap_or_else(|| panic!("no shrink_done: {text}"));
    println!(
        "kept {} of {}: {}",
        r.nodes_after, r.nodes_before, r.summary
    );
    assert_eq!(
        r.status,
        cudabisect::report::record::ShrinkStatus::Minimal,
        "{text}"
    );
    assert_eq!(crate::common::kept(&r), ["l01_window"], "{text}");
    // The layer launches one Pallas kernel: the shrink's signature names it.
    assert_eq!(
        r.signature.as_ref().and_then(|g| g.kernel.as_deref()),
        Some("window_kernel"),
        "{text}"
    );
    standalone_repro_faults(&r);
}

/// Files of one commit of a default-shrink package: trainpkg (its kernels with `kernel_edits`), the
/// realistic GPU fixtures, and `extra` files.
fn default_shrink_files(
    kernel_edits: &[(&str, &str)],
    extra: &[(&str, String)],
    config: &str,
) -> Files {
    let mut f = trainpkg_files(kernel_edits, config);
    let base = root().join("fixtures/torch/realistic_gpu");
    for p in [
        "deep_model.py",
        "train_deep.py",
        "train_compiled.py",
        "hfce/__init__.py",
        "hfce/ce.py",
        "train_hf.py",
    ] {
        put(
            &mut f,
            p,
            std::fs::read_to_string(base.join(p)).unwrap(),
            false,
        );
    }
    for (p, text) in extra {
        put(&mut f, p, text.clone(), false);
    }
    f
}

/// `init` then `start` on a GPU training package (a custom op's Triton backward three modules deep) with no
/// config written by hand: the right culprit and a minimal repro of the faulting backward.
#[test]
#[ignore = "needs an NVIDIA GPU, torch and triton: run with --include-ignored on the GPU machine"]
fn init_then_start_on_a_gpu_training_package_names_the_culprit() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("repo");
    let files = |edit: (&str, &str)| {
        let mut f = default_shrink_files(&[edit], &[], "");
        f.remove("bisect.toml");
        f
    };
    let good = ("BUG_OP_BWD_STRIDE = 1 << 22\n", "BUG_OP_BWD_STRIDE = 1\n");
    let bad = (
        "BUG_OP_BWD_STRIDE = 1 << 22\n",
        "BUG_OP_BWD_STRIDE = 1 << 22\n",
    );
    let commits = linear_history(&dir, [files(good), files(good), files(bad), files(bad)]).unwrap();
    let init = Command::new(bin())
        .args(["init", "-C"])
        .arg(&dir)
        .args(["--", "python3", "train_deep.py"])
        .output()
        .unwrap();
    let said =
        String::from_utf8_lossy(&init.stdout).into_owned() + &String::from_utf8_lossy(&init.stderr);
    println!("init: {said}");
    assert!(init.status.success(), "{said}");
    let started = std::time::Instant::now();
    let (r, text) = start_with_report(
        &dir,
        &["start", &format!("{}..main", commits[0]), "--no-triage"],
        &tmp.path().join("report.json"),
    );
    let s = crate::common::shrink_of(&r, &text);
    println!(
        "init + start: culprit {:?} (want {}) | {} | {:.1}s",
        first_bad(&r),
        commits[2],
        s.summary,
        started.elapsed().as_secs_f64()
    );
    assert_eq!(first_bad(&r), Some(commits[2].to_string()), "{text}");
    assert_eq!(
        s.status,
        cudabisect::report::record::ShrinkStatus::Minimal,
        "{text}"
    );
}

#[test]
#[ignore = "needs an NVIDIA GPU, compute-sanitizer, torch, triton, transformers and jax with CUDA: run with --include-ignored on the GPU machine"]
fn start_with_no_shrink_section_hands_over_a_minimal_repro_for_each_training_package() {
    let op_bug = (
        "BUG_OP_BWD_STRIDE = 1 << 22\n",
        "BUG_OP_BWD_STRIDE = 1 << 22\n",
    );
    let op_fixed = ("BUG_OP_BWD_STRIDE = 1 << 22\n", "BUG_OP_BWD_STRIDE = 1\n");
    let hf_bug = "BUG_CE_STRIDE = 1 << 22";
    let mut failures = Vec::new();
    for (case, script, good, bad, want) in [
        // A custom op's Triton backward, three modules deep under a forward FX cannot trace.
        (
            "custom op three modules deep",
            "train_deep.py",
            op_fixed,
            op_bug,
            "backward",
        ),
        // The same op under torch.compile: the capture replays the original module eagerly.
        (
            "torch.compile'd model",
            "train_compiled.py",
            op_fixed,
            op_bug,
            "backward",
        ),
        // A transformers GPT-2 in bf16 trained with the project's fused Triton cross-entropy.
        (
            "transformers model, fused Triton loss",
            "train_hf.py",
            op_fixed,
            op_fixed,
            "loss",
        ),
    ] {
        // `CUDABISECT_GPU_CASE=<words>` runs only the cases whose name holds them (a short device run).
        if std::env::var("CUDABISECT_GPU_CASE").is_ok_and(|c| !case.contains(c.as_str())) {
            continue;
        }
        let tmp = tempfile::tempdir().unwrap();
        let dir = tmp.path().join("repo");
        let config = format!("[repro]\ncommand = [\"python3\", \"{script}\"]\ntimeout = \"5m\"\n");
        let ce = |buggy: bool| {
            let text =
                std::fs::read_to_string(root().join("fixtures/torch/realistic_gpu/hfce/ce.py"))
                    .unwrap();
            let text = if buggy {
                text.replace("BUG_CE_STRIDE = 1", hf_bug)
            } else {
                text
            };
            vec![("hfce/ce.py", text)]
        };
        let hf = case.starts_with("transformers");
        let commits = linear_history(
            &dir,
            [
                default_shrink_files(&[good], &ce(false), &config),
                default_shrink_files(&[good], &ce(false), &config),
                default_shrink_files(&[bad], &ce(hf), &config),
                default_shrink_files(&[bad], &ce(hf), &config),
            ],
        )
        .unwrap();
        let started = std::time::Instant::now();
        let (r, text) = start_with_report(
            &dir,
            &["start", &format!("{}..main", commits[0])],
            &tmp.path().join("report.json"),
        );
        let Some(s) = r.shrink.as_ref() else {
            failures.push(format!("{case}: no shrink\n{text}"));
            continue;
        };
        let kept: Vec<&str> = s.kept.iter().map(|n| n.id.as_str()).collect();
        let bundle = r.bundle.as_deref().map(PathBuf::from);
        let bytes = bundle.as_deref().map_or(0, dir_bytes);
        println!(
            "{case}: culprit {:?} (want {}) | {} | path {:?} | alone {} | shrink stage {}s | captured step {:?} phase {:?} | kept {kept:?} | triage {:?} | bundle {} bytes | {:.1}s",
            first_bad(&r),
            commits[2],
            s.summary,
            s.path,
            json(&s.data.as_ref().and_then(|d| d.alone.as_ref())),
            s.duration_s,
            s.captured.as_ref().map(|c| c.step),
            s.captured.as_ref().map(|c| &c.phase),
            r.triage.as_ref().map(|t| &t.summary),
            bytes,
            started.elapsed().as_secs_f64()
        );
        let phase_ok = kept.len() == 1
            && s.kept[0].phase.as_deref() == Some(want)
            && !["model", "model__backward"].contains(&kept[0]);
        if first_bad(&r) != Some(commits[2].to_string())
            || s.status != cudabisect::report::record::ShrinkStatus::Minimal
            || !phase_ok
        {
            failures.push(format!("{case}: {}\n{text}", json(s)));
            continue;
        }
        match bundle {
            Some(b) => {
                let (code, sig, out) = reproduce_from_bundle(&b, &dir);
                println!("{case}: reproduce.sh: exit {code}, {}", sig.short());
                if code == 0 || bytes > 25 << 20 {
                    failures.push(format!(
                        "{case}: reproduce.sh exit {code}, bundle {bytes} bytes\n{out}"
                    ));
                }
            }
            None => failures.push(format!("{case}: no bundle\n{text}")),
        }
    }
    // A JAX script with no factories: the jitted step is captured, its Pallas kernel kept.
    if std::env::var("CUDABISECT_GPU_CASE").is_ok_and(|c| !"JAX script".contains(c.as_str())) {
        assert!(failures.is_empty(), "{}", failures.join("\n\n"));
        return;
    }
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("repo");
    let config = "[repro]\ncommand = [\"python3\", \"train.py\"]\ntimeout = \"300s\"\n";
    let commits = linear_history(
        &dir,
        [0, 0, -(1 << 28), -(1 << 28)].map(|o| jax_gpu_files(o, config)),
    )
    .unwrap();
    let started = std::time::Instant::now();
    let (r, text) = start_with_report(
        &dir,
        &["start", &format!("{}..main", commits[0])],
        &tmp.path().join("report.json"),
    );
    let s = crate::common::shrink_of(&r, &text);
    let bytes = r.bundle.as_deref().map_or(0, |b| dir_bytes(Path::new(b)));
    let captured = s.captured.as_ref();
    println!(
        "JAX script without factories: culprit ok {} | {:?} | captured {:?} | triage {:?} | bundle {} bytes | {:.1}s",
        first_bad(&r) == Some(commits[2].to_string()),
        s.summary,
        captured.and_then(|c| c.function.as_deref()),
        r.triage.as_ref().map(|t| &t.summary),
        bytes,
        started.elapsed().as_secs_f64()
    );
    if s.status != cudabisect::report::record::ShrinkStatus::Minimal
        || captured.and_then(|c| c.framework.as_deref()) != Some("jax")
    {
        failures.push(format!("JAX: {}\n{text}", json(s)));
    } else {
        standalone_repro_faults(s);
    }
    assert!(failures.is_empty(), "{}", failures.join("\n\n"));
}

use cudabisect::report::bundle::dir_bytes;

/// The layout package at one commit: `wide` is the fix.
fn layout_files(wide: bool, config: &str) -> Files {
    let base = root().join("fixtures/torch/layout_gpu");
    let mut f = Files::new();
    for p in ["wrapq/__init__.py", "score.py"] {
        put(
            &mut f,
            p,
            std::fs::read_to_string(base.join(p)).unwrap(),
            false,
        );
    }
    let kernel = std::fs::read_to_string(base.join("wrapq/score.py")).unwrap();
    let kernel = if wide {
        kernel
    } else {
        kernel.replace("WIDE_OFFSETS = True", "WIDE_OFFSETS = False")
    };
    put(&mut f, "wrapq/score.py", kernel, false);
    put(&mut f, "bisect.toml", config.to_string(), false);
    f
}

#[test]
#[ignore = "needs an NVIDIA GPU with 16 GB free, compute-sanitizer, torch and triton: run with --include-ignored on the GPU machine"]
fn start_hands_over_an_attachable_repro_for_an_int32_wrap_that_depends_on_the_layout() {
    // A Triton kernel's int32 row offset wraps on a 2.2 GB int8 matrix and reads 2 GB below it: the
    // fault needs the shape and the place of the buffer, not its values.
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("repo");
    let config = "[repro]\ncommand = [\"python3\", \"score.py\"]\ntimeout = \"5m\"\n";
    let commits = linear_history(
        &dir,
        [true, true, false, false].map(|wide| layout_files(wide, config)),
    )
    .unwrap();
    let started = std::time::Instant::now();
    let (r, text) = start_with_report(
        &dir,
        &["start", &format!("{}..main", commits[0])],
        &tmp.path().join("report.json"),
    );
    let s = crate::common::shrink_of(&r, &text);
    let bundle = r.bundle.as_deref().map(PathBuf::from);
    let bytes = bundle.as_deref().map_or(0, dir_bytes);
    println!(
        "int32 wrap: culprit ok {} | {} | path {:?} | data {} | shrink stage {}s | triage {:?} | bundle {} bytes | {:.1}s",
        first_bad(&r) == Some(commits[2].to_string()),
        s.summary,
        s.path,
        json(&s.data),
        s.duration_s,
        r.triage.as_ref().map(|t| &t.summary),
        bytes,
        started.elapsed().as_secs_f64()
    );
    assert_eq!(first_bad(&r), Some(commits[2].to_string()), "{text}");
    assert_eq!(
        s.status,
        cudabisect::report::record::ShrinkStatus::Minimal,
        "{s:?}\n{text}"
    );
    assert!(crate::common::data(s).generated, "{s:?}");
    let alone = crate::common::alone(s);
    assert_eq!(alone.reproduced, alone.runs, "{s:?}");
    assert!(bytes < 25 << 20, "bundle of {bytes} bytes");
    let bundle = bundle.unwrap();
    let report = std::fs::read_to_string(bundle.join("REPORT.md")).unwrap();
    assert!(report.contains("generated from their shape"), "{report}");
    let (code, sig, out) = reproduce_from_bundle(&bundle, &dir);
    println!("int32 wrap: reproduce.sh: exit {code}, {}", sig.short());
    assert_ne!(code, 0, "{out}");
    assert_eq!(
        sig.class,
        cudabisect::classify::FaultClass::IllegalAddress,
        "{out}"
    );
}

/// A Triton op whose store runs `slack` elements past its output: too few to fault anywhere but under
/// compute-sanitizer, which the repro command runs (as users run a repro whose fault only memcheck sees).
fn small_overrun_files(slack: u32) -> Files {
    let mut f = Files::new();
    put(&mut f, "pkg/__init__.py", String::new(), false);
    put(
        &mut f,
        "pkg/ops.py",
        format!(
            r#"import torch
import triton
import triton.language as tl

SLACK = {slack}


@triton.jit
def _scale_kernel(x_ptr, out_ptr, n, slack, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    x = tl.load(x_ptr + offs, mask=offs < n, other=0.0)
    tl.store(out_ptr + offs, x * 2.0, mask=offs < n + slack)


class Scale(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x):
        x = x.contiguous()
        out = torch.empty_like(x)
        n = x.numel()
        _scale_kernel[(triton.cdiv(n + SLACK, 1024),)](x, out, n, SLACK, BLOCK=1024)
        return out

    @staticmethod
    def backward(ctx, g):
        return g * 2.0
"#
        ),
        false,
    );
    put(
        &mut f,
        "train.py",
        r#"import torch
from pkg.ops import Scale

torch.manual_seed(0)
net = torch.nn.Sequential(torch.nn.Linear(128, 128), torch.nn.ReLU(), torch.nn.Linear(128, 128)).cuda()
opt = torch.optim.SGD(net.parameters(), lr=0.1)
for step in range(2):
    x = torch.randn(64, 128, device="cuda")
    h = Scale.apply(net(x))
    loss = h.pow(2).mean()
    opt.zero_grad()
    loss.backward()
    opt.step()
torch.cuda.synchronize()
print("ok", float(loss))
"#
        .to_string(),
        false,
    );
    put(
        &mut f,
        "bisect.toml",
        "[repro]\ncommand = \"compute-sanitizer --tool memcheck --error-exitcode 1 python3 train.py\"\n\
env = { PYTORCH_NO_CUDA_MEMORY_CACHING = \"1\" }\ntimeout = \"300s\"\n"
            .to_string(),
        false,
    );
    f
}

/// A small overrun that only compute-sanitizer sees (the repro runs under it): `start` with `[repro]` only
/// names the culprit, the harness's own runs show nothing, so the shrink runs them under memcheck, keeps
/// the op's node, and the bundle's `reproduce.sh` shows the overrun under memcheck from the bundle alone.
#[test]
#[ignore = "needs an NVIDIA GPU, compute-sanitizer, torch and triton: run with --include-ignored on the GPU machine"]
fn an_overrun_only_memcheck_sees_is_shrunk_under_memcheck_and_handed_off() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("repo");
    let files = [0, 0, 256, 256].map(small_overrun_files);
    let commits = linear_history(&dir, files).unwrap();
    let (r, text) = start_with_report(
        &dir,
        &["start", &format!("{}..main", commits[0])],
        &tmp.path().join("report.json"),
    );
    let shrink = crate::common::shrink_of(&r, &text);
    println!(
        "culprit {:?} (want {}) | target {:?} | shrink {} | memcheck {:?} | {}s | triage {:?}",
        first_bad(&r),
        commits[2],
        r.target.as_ref().map(|t| t.short()),
        shrink.summary,
        shrink.memcheck,
        shrink.duration_s,
        r.triage.as_ref().map(|t| &t.summary)
    );
    assert_eq!(first_bad(&r), Some(commits[2].to_string()), "{text}");
    assert_eq!(
        shrink.status,
        cudabisect::report::record::ShrinkStatus::Minimal,
        "{text}"
    );
    assert!(shrink.memcheck.is_some(), "{shrink:?}");
    let bundle = PathBuf::from(r.bundle.as_deref().expect("a bundle"));
    let (code, sig, out) = reproduce_from_bundle(&bundle, &dir);
    println!(
        "reproduce.sh: exit {code} | {}\n{}",
        sig.summary,
        out.lines().take(12).collect::<Vec<_>>().join("\n")
    );
    assert_ne!(code, 0, "{out}");
    assert!(out.contains("_scale_kernel"), "{out}");
}
