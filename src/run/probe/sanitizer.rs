//! compute-sanitizer triage: rerun a repro under memcheck (escalating to racecheck, initcheck and synccheck
//! when memcheck sees nothing but the fault persists), with the PyTorch caching allocator off and synchronous
//! launches, and fold what it reports into a few lines a maintainer can act on.

use crate::exec::executor::Session;
use std::path::Path;
use std::sync::atomic::{AtomicBool, Ordering};

use git2::Oid;

use crate::classify::sanitizer::{self, FoldedFinding};
use crate::classify::{classify, Exit, FaultClass, Signature};
use crate::config::{CommandLine, Config};
use crate::exec::child_env::{command_spec, ChildCommand, ChildContext, ChildPhase};
use crate::git::ProbeWorktree;

use crate::report::event::{Event, Reporter};
use crate::report::record::{FoldedLine, SanitizerTool, TriageResult, TriageStatus};

/// Exit status the sanitizer is told to use when it reports errors.
const SANITIZER_ERROR_EXIT: i32 = 86;

pub use crate::exec::tools::find_sanitizer;

/// How to install compute-sanitizer, for the "missing" message.
pub const INSTALL_HINT: &str = "compute-sanitizer was not found: it ships with the CUDA toolkit (<cuda>/bin/compute-sanitizer; \
     `apt install cuda-sanitizer-<version>` on NVIDIA's apt repository); put it on PATH or set [triage] sanitizer";

/// The message when compute-sanitizer is missing, naming the configured path when there is one.
pub fn missing_message(configured: Option<&str>) -> String {
    match configured {
        Some(path) => format!("[triage] sanitizer = {path:?} is not a file"),
        None => INSTALL_HINT.to_string(),
    }
}

/// Which call stacks compute-sanitizer records with each error it finds.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Backtraces {
    /// Host and device frames (compute-sanitizer's default): for a kernel launched from native code, the
    /// host frames name the library function that launched it, which a maintainer reads.
    HostAndDevice,
    /// Device frames only.
    DeviceOnly,
}

impl Backtraces {
    /// For a fault `seen` in the program's own output. A Triton kernel's host frames are the driver,
    /// Triton's generated launcher and the interpreter, which name nothing a maintainer can act on
    /// (its launch site is in the Python traceback the probe already read), and they cost: memcheck records
    /// them for every out-of-bounds thread, and a faulting launch has 10⁵ of them (0.12–0.15 ms an error
    /// with host frames, 0.08–0.09 ms without, measured on an H200). Anything else keeps both.
    pub fn for_fault(seen: Option<&Signature>) -> Self {
        match seen.and_then(|s| s.framework.as_deref()) {
            Some("triton") => Backtraces::DeviceOnly,
            _ => Backtraces::HostAndDevice,
        }
    }
}

/// Runs triage at `oid` in the probe worktree (already built by the probe that found it), recording
/// `backtraces`.
pub fn at_commit(
    session: &mut dyn Session,
    (config, backtraces): (&Config, Backtraces),
    worktree: &ProbeWorktree,
    oid: Oid,
    out_dir: &Path,
    cancel: &AtomicBool,
    reporter: &mut dyn Reporter,
) -> TriageResult {
    let command = config
        .triage
        .command
        .clone()
        .unwrap_or_else(|| config.repro.command.clone());
    let result = match worktree.checkout(oid, false) {
        Err(e) => TriageResult::failed(
            TriageStatus::Error,
            format!("checkout failed: {e}"),
            command.display(),
        ),
        Ok(()) => run_tools(
            session,
            config,
            (worktree.path(), &oid.to_string()),
            &command,
            out_dir,
            cancel,
            (&SanitizerTool::ESCALATION, backtraces),
        ),
    };
    reporter.event(&Event::TriageFinished {
        summary: result.summary.clone(),
        status: result.status,
        signature: result.signature.clone(),
    });
    result
}

/// Runs the escalation in `cwd` and writes logs into `out_dir`, host and device frames recorded (no
/// fault was seen before it).
pub fn run(
    session: &mut dyn Session,
    config: &Config,
    cwd: &Path,
    command: &CommandLine,
    commit: &str,
    out_dir: &Path,
    cancel: &AtomicBool,
) -> TriageResult {
    run_tools(
        session,
        config,
        (cwd, commit),
        command,
        out_dir,
        cancel,
        (&SanitizerTool::ESCALATION, Backtraces::HostAndDevice),
    )
}

/// Runs the given sanitizer tools in order (stopping at the first that finds something) in `cwd`, each
/// recording `backtraces`.
pub fn run_tools(
    session: &mut dyn Session,
    config: &Config,
    (cwd, commit): (&Path, &str),
    command: &CommandLine,
    out_dir: &Path,
    cancel: &AtomicBool,
    (tools, backtraces): (&[SanitizerTool], Backtraces),
) -> TriageResult {
    let mut result = TriageResult::failed(TriageStatus::Clean, String::new(), command.display());
    let configured = config.triage.sanitizer.as_deref();
    let Some(sanitizer) = find_sanitizer(configured) else {
        result.status = TriageStatus::Unavailable;
        result.summary = missing_message(configured);
        return result;
    };
    for &tool in tools {
        if cancel.load(Ordering::SeqCst) {
            result.status = TriageStatus::Interrupted;
            result.summary = "interrupted".into();
            return result;
        }
        let place = (cwd, commit);
        match run_tool(
            session,
            config,
            place,
            command,
            (&sanitizer, (tool, backtraces), out_dir),
            cancel,
        ) {
            Ok((interpreted, files)) => {
                result.files.extend(files);
                result.tools_run.push(tool);
                if settle(&mut result, tool, interpreted) {
                    return result;
                }
            }
            Err((status, summary)) => {
                result.status = status;
                result.summary = summary;
                return result;
            }
        }
    }
    result
}

/// One tool's run of `command` under compute-sanitizer, its log and XML report written into `out_dir`:
/// what it says and the files it left. `Err`: the triage ends here, with that status and summary.
fn run_tool(
    session: &mut dyn Session,
    config: &Config,
    (cwd, commit): (&Path, &str),
    command: &CommandLine,
    (sanitizer, (tool, backtraces), out_dir): (&Path, (SanitizerTool, Backtraces), &Path),
    cancel: &AtomicBool,
) -> Result<(Interpretation, Vec<String>), (TriageStatus, String)> {
    let xml = out_dir.join(format!("sanitizer-{tool}.xml"));
    let log = out_dir.join(format!("sanitizer-{tool}.log"));
    let _ = std::fs::remove_file(&xml);
    let wrapped = wrap(sanitizer, (tool, backtraces), &xml, command);
    let env = sanitizer_env(&triage_env(config));
    let spec = command_spec(
        config,
        ChildCommand {
            command: &wrapped,
            timeout: config.triage.timeout,
            env: &env,
        },
        &ChildContext {
            worktree: cwd,
            commit,
            phase: ChildPhase::Triage,
            attempt: 1,
            slot: None,
            side_by_side: false,
        },
    );
    let run = session.run(&spec, cancel).map_err(|e| {
        (
            TriageStatus::Error,
            format!("cannot run compute-sanitizer: {e}"),
        )
    })?;
    if run.interrupted {
        return Err((TriageStatus::Interrupted, "interrupted".into()));
    }
    let _ = std::fs::write(&log, &run.output);
    let mut files = vec![log.display().to_string()];
    // Bytes that are not text still go to the parser, which then says the report is unreadable (read
    // as absent, they looked like a run that found nothing).
    let xml_text = std::fs::read(&xml)
        .ok()
        .map(|bytes| String::from_utf8_lossy(&bytes).into_owned());
    if xml_text.is_some() {
        files.push(xml.display().to_string());
    }
    Ok((
        interpret(tool, run.exit, &run.output, xml_text.as_deref()),
        files,
    ))
}

/// Puts what one tool said into `result`: true when the triage is settled (a finding, a broken report,
/// a clean run, a program the tool could not run), false to go on with the next tool.
fn settle(result: &mut TriageResult, tool: SanitizerTool, interpreted: Interpretation) -> bool {
    let still_faults = interpreted.program.class != FaultClass::None;
    if !interpreted.findings.is_empty() {
        result.status = TriageStatus::Found;
        result.tool = Some(tool);
        result.signature = interpreted
            .signature
            .map(|s| refine(s, &interpreted.program));
        result.error_count = interpreted.error_count;
        result.summary = format!("{tool}: {}", interpreted.findings[0].line());
        result.findings = interpreted
            .findings
            .into_iter()
            .map(|f| FoldedLine {
                line: f.line(),
                folded: f,
            })
            .collect();
        return true;
    }
    if let Some(reason) = &interpreted.xml_error {
        // Nothing found and the structured report is broken: say so rather than guess.
        result.status = TriageStatus::Error;
        result.summary = format!("{tool}: {reason}; the text report shows no finding");
        result.signature = Some(Signature::new(FaultClass::Other, result.summary.clone()));
        return true;
    }
    if !still_faults {
        result.summary = format!("{tool} found nothing and the program ran clean under it");
        return true;
    }
    result.summary = format!(
        "no sanitizer tool found the fault ({})",
        interpreted.program.short()
    );
    if matches!(interpreted.program.class, FaultClass::Infra) {
        result.status = TriageStatus::Error;
        result.summary = format!(
            "compute-sanitizer could not run the program: {}",
            interpreted.program.summary
        );
        return true;
    }
    false
}

/// A warp-level assert record names only `__assertfail`; the program's own assertion line names the kernel,
/// the source line and the condition, so those win.
fn refine(mut finding: Signature, program: &Signature) -> Signature {
    if finding.class == program.class
        && (finding.kernel.as_deref() == Some("__assertfail") || finding.kernel.is_none())
    {
        finding.kernel = program.kernel.clone().or(finding.kernel);
        finding.site = program.site.clone().or(finding.site);
        finding.detail = program.detail.clone().or(finding.detail);
    }
    finding
}

/// What a sanitized run adds to the child environment: the repro's `env` (the run is of the repro, as the
/// probes ran it: its `PYTHONPATH`, its data paths, the switch that makes it fault), then `[triage] env`
/// over it.
fn triage_env(config: &Config) -> std::collections::BTreeMap<String, String> {
    config.repro_env_under(&config.triage.env)
}

/// The environment of a run under compute-sanitizer: the frameworks' pooling allocators off, so memcheck
/// sees each buffer as its own allocation and names the kernel and access of a small overrun (PyTorch's
/// caching allocator; XLA's preallocated pool, one big allocation otherwise). `[triage] env` may set the
/// XLA ones otherwise.
pub fn sanitizer_env(
    configured: &std::collections::BTreeMap<String, String>,
) -> std::collections::BTreeMap<String, String> {
    let mut env = configured.clone();
    for (k, v, always) in crate::exec::tools::POOLS_OFF {
        if always {
            env.insert(k.into(), v.into());
        } else {
            env.entry(k.into()).or_insert_with(|| v.into());
        }
    }
    env
}

fn wrap(
    sanitizer: &Path,
    (tool, backtraces): (SanitizerTool, Backtraces),
    xml: &Path,
    command: &CommandLine,
) -> CommandLine {
    let (program, args) = command.argv();
    let mut argv = vec![
        sanitizer.display().to_string(),
        "--tool".into(),
        tool.as_str().into(),
        "--xml".into(),
        "--save".into(),
        xml.display().to_string(),
        "--print-limit".into(),
        "1000".into(),
        "--error-exitcode".into(),
        SANITIZER_ERROR_EXIT.to_string(),
    ];
    if backtraces == Backtraces::DeviceOnly {
        argv.extend(["--show-backtrace".into(), "device".into()]);
    }
    argv.push(program);
    argv.extend(args);
    CommandLine::Argv(argv)
}

/// What one sanitizer run says.
pub struct Interpretation {
    /// Findings folded by (kernel, pc, kind).
    pub findings: Vec<FoldedFinding>,
    /// The signature of the first finding.
    pub signature: Option<Signature>,
    /// What the program itself showed (ignoring sanitizer records).
    pub program: Signature,
    /// Errors counted by the summary line.
    pub error_count: Option<u64>,
    /// Why the XML report could not be read, when it could not.
    pub xml_error: Option<String>,
}

/// Reads one sanitizer run: XML when present (enriched by the text's allocation relations), text otherwise.
/// Broken XML falls back to the text.
pub fn interpret(
    tool: SanitizerTool,
    exit: Exit,
    output: &str,
    xml: Option<&str>,
) -> Interpretation {
    let lines: Vec<&str> = output.lines().collect();
    let text_findings = sanitizer::parse_text(&lines);
    let mut xml_error = None;
    let mut findings = match xml.map(sanitizer::parse_xml) {
        Some(Ok(mut f)) if !f.is_empty() => {
            sanitizer::attach_relations(&mut f, &text_findings);
            f
        }
        Some(Err(e)) => {
            xml_error = Some(e.to_string());
            text_findings
        }
        _ => text_findings,
    };
    if tool == SanitizerTool::Initcheck {
        // initcheck reports uninitialised reads; anything else it prints is memcheck's business.
        findings.retain(|f| f.kind == Some(sanitizer::FindingKind::Uninitialized));
    }
    let signature = findings.first().map(sanitizer::signature_of);
    let program_text: String = lines
        .iter()
        .filter(|l| !l.starts_with("========="))
        .map(|l| format!("{l}\n"))
        .collect();
    let program_exit = match exit {
        Exit::Code(SANITIZER_ERROR_EXIT) => Exit::Code(1),
        other => other,
    };
    Interpretation {
        findings: sanitizer::fold(&findings),
        signature,
        program: classify(program_exit, &program_text),
        error_count: sanitizer::error_summary(&lines),
        xml_error,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_sanitizer_runs_in_the_repros_environment_with_the_pooling_allocators_off_unless_triage_env_says_otherwise(
    ) {
        let config = crate::config::Config::parse(
            Path::new("bisect.toml"),
            "[repro]\ncommand = \"python3 train.py\"\nenv = { PYTHONPATH = \"src\", MODE = \"a\" }\n[triage]\nenv = { MODE = \"b\" }\n",
        )
        .expect("config");
        // The repro's environment, with `[triage] env` over it.
        let mine = triage_env(&config);
        assert_eq!(mine["PYTHONPATH"], "src");
        assert_eq!(mine["MODE"], "b");
        let env = sanitizer_env(&Default::default());
        assert_eq!(env["PYTORCH_NO_CUDA_MEMORY_CACHING"], "1");
        assert_eq!(env["XLA_PYTHON_CLIENT_PREALLOCATE"], "false");
        assert_eq!(env["XLA_PYTHON_CLIENT_ALLOCATOR"], "platform");
        let mut mine = std::collections::BTreeMap::new();
        mine.insert("XLA_PYTHON_CLIENT_ALLOCATOR".to_string(), "bfc".to_string());
        assert_eq!(sanitizer_env(&mine)["XLA_PYTHON_CLIENT_ALLOCATOR"], "bfc");
    }

    #[test]
    fn the_program_side_is_read_without_sanitizer_lines() {
        let out = "========= Invalid __global__ write of size 4 bytes\n=========     at k+0x10\n========= \nRuntimeError: CUDA error: unspecified launch failure\n";
        let i = interpret(
            SanitizerTool::Memcheck,
            Exit::Code(SANITIZER_ERROR_EXIT),
            out,
            None,
        );
        assert_eq!(i.program.class, FaultClass::LaunchFailure);
        assert_eq!(i.signature.unwrap().class, FaultClass::IllegalAddress);
        assert_eq!(i.findings[0].count, 1);
    }

    #[test]
    fn truncated_xml_is_reported_not_guessed() {
        let i = interpret(
            SanitizerTool::Memcheck,
            Exit::Code(1),
            "RuntimeError: CUDA error: unspecified launch failure\n",
            Some("<ComputeSanitizerOutput><rec"),
        );
        assert!(i.findings.is_empty());
        assert!(i
            .xml_error
            .unwrap()
            .contains("unreadable compute-sanitizer XML"));
    }

    #[test]
    fn the_wrapped_command_keeps_the_argv() {
        let w = wrap(
            Path::new("/cs"),
            (SanitizerTool::Memcheck, Backtraces::HostAndDevice),
            Path::new("/o/m.xml"),
            &CommandLine::Shell("python x.py".into()),
        );
        let (p, args) = w.argv();
        assert_eq!(p, "/cs");
        assert_eq!(&args[args.len() - 3..], ["sh", "-c", "python x.py"]);
        assert!(args.contains(&"--xml".to_string()) && args.contains(&"memcheck".to_string()));
        assert!(!args.contains(&"--show-backtrace".to_string()), "{args:?}");
    }

    #[test]
    fn a_triton_kernels_fault_is_sanitized_with_device_frames_only_and_any_other_with_both() {
        let seen = |framework: Option<&str>| {
            let mut s = Signature::new(FaultClass::IllegalAddress, "x");
            s.framework = framework.map(Into::into);
            s
        };
        let triton = seen(Some("triton"));
        assert_eq!(Backtraces::for_fault(Some(&triton)), Backtraces::DeviceOnly);
        for other in [seen(Some("pytorch")), seen(Some("jax")), seen(None)] {
            assert_eq!(
                Backtraces::for_fault(Some(&other)),
                Backtraces::HostAndDevice
            );
        }
        assert_eq!(Backtraces::for_fault(None), Backtraces::HostAndDevice);
        let w = wrap(
            Path::new("/cs"),
            (
                SanitizerTool::Memcheck,
                Backtraces::for_fault(Some(&triton)),
            ),
            Path::new("/o/m.xml"),
            &CommandLine::Argv(vec!["python3".into(), "t.py".into()]),
        );
        let (_, args) = w.argv();
        let at = args
            .iter()
            .position(|a| a == "--show-backtrace")
            .expect("asked");
        assert_eq!(args[at + 1], "device");
        assert!(
            at < args.iter().position(|a| a == "python3").unwrap(),
            "before the program: {args:?}"
        );
    }
}
