//! Asks for the environment a maintainer wants to see (GPU, driver and CUDA versions, compute-sanitizer,
//! the OS, PyTorch's own `collect_env` report when the run used torch), running the tools that know where
//! the probes ran: on this machine, or through the run's executor on a scheduler's node.

use std::sync::atomic::AtomicBool;
use std::time::Duration;

use crate::classify::Exit;
use crate::config::CommandLine;
use crate::exec::executor::{Executor, Session};
use crate::exec::process::CommandSpec;
use crate::exec::tools::find_program;
pub use crate::report::environment::Environment;

fn capture(argv: &[&str], timeout: Duration, cancel: &AtomicBool) -> Option<String> {
    ask(&mut crate::exec::executor::Local, argv, timeout, cancel)
}

/// One question, run in `session`: its output when it exited 0.
fn ask(
    session: &mut dyn Session,
    argv: &[&str],
    timeout: Duration,
    cancel: &AtomicBool,
) -> Option<String> {
    let spec = CommandSpec {
        command: CommandLine::Argv(argv.iter().map(|s| s.to_string()).collect()),
        cwd: std::env::temp_dir(),
        env: vec![],
        timeout,
        grace: Duration::from_secs(1),
        stack_dump: None,
    };
    let run = session.run(&spec, cancel).ok()?;
    (run.exit == Exit::Code(0)).then(|| run.output.trim().to_string())
}

/// A tool to ask, by the path `found` here; on another machine (a scheduler's node), by its `name` when
/// this machine does not have it, for the node's own `PATH` to find.
fn tool(found: Option<std::path::PathBuf>, name: &str, local: bool) -> Option<String> {
    match found {
        Some(path) => Some(path.display().to_string()),
        None => (!local).then(|| name.to_string()),
    }
}

/// One line naming the machine's GPUs and driver (and the devices the run may see), cheap enough to ask
/// at every start: a journaled verdict is reused only on a machine with the same line.
pub fn fingerprint(cancel: &AtomicBool) -> String {
    let visible = std::env::var("CUDA_VISIBLE_DEVICES").unwrap_or_else(|_| "all".into());
    let gpus = find_program("nvidia-smi", &["/usr/bin/nvidia-smi"])
        .and_then(|smi| {
            capture(
                &[
                    &smi.display().to_string(),
                    "--query-gpu=name,driver_version",
                    "--format=csv,noheader",
                ],
                Duration::from_secs(20),
                cancel,
            )
        })
        .map(|q| q.lines().map(str::trim).collect::<Vec<_>>().join("; "))
        .unwrap_or_else(|| "no GPU seen".into());
    format!("{gpus} | visible: {visible}")
}

/// Gathers the environment (named apart from `Iterator::collect`, which reads alike at its call sites); PyTorch's `collect_env` only when the run used `torch`. Each probe is bounded
/// in time and announced through `progress` (some take a minute); what is missing is left out, and once
/// `cancel` is set the rest is skipped.
pub fn gather(
    at: &dyn Executor,
    cancel: &AtomicBool,
    torch: bool,
    progress: &mut dyn FnMut(&str),
) -> Environment {
    let short = Duration::from_secs(20);
    // One session for every question: under a scheduler, one allocation on a node like the probes'.
    let local = at.is_local();
    let mut session = at.session();
    let mut capture = |argv: &[&str], timeout| ask(session.as_mut(), argv, timeout, cancel);
    let mut env = Environment {
        cudabisect: format!("cudabisect {}", env!("CARGO_PKG_VERSION")),
        host: capture(&["uname", "-n"], short),
        elsewhere: !local,
        os: capture(&["uname", "-srm"], short),
        ..Environment::default()
    };
    let cancelled = || cancel.load(std::sync::atomic::Ordering::SeqCst);
    progress("nvidia-smi");
    let smi = find_program("nvidia-smi", &["/usr/bin/nvidia-smi"]);
    if let Some(smi) = tool(smi, "nvidia-smi", local).filter(|_| !cancelled()) {
        if let Some(q) = capture(
            &[
                smi.as_str(),
                "--query-gpu=name,driver_version,memory.total",
                "--format=csv,noheader",
            ],
            short,
        ) {
            env.gpus = q.lines().map(|l| l.trim().to_string()).collect();
        }
        env.cuda_driver = capture(&[smi.as_str()], short).and_then(|out| {
            let at = out.find("CUDA Version:")?;
            Some(out[at + 13..].split_whitespace().next()?.to_string())
        });
    }
    if cancelled() {
        return env;
    }
    if local {
        // Asked in this process, so only of this machine's driver.
        progress("the CUDA driver");
        env.driver_api = crate::harness::cuda::driver_summary();
    }
    progress("nvcc and compute-sanitizer");
    let nvcc = find_program("nvcc", &["/usr/local/cuda/bin/nvcc"]);
    if let Some(nvcc) = tool(nvcc, "nvcc", local) {
        env.nvcc = capture(&[nvcc.as_str(), "--version"], short)
            .and_then(|v| v.lines().last().map(str::to_string));
    }
    let sanitizer = crate::exec::tools::find_sanitizer(None);
    if let Some(cs) = tool(sanitizer, "compute-sanitizer", local) {
        env.compute_sanitizer = capture(&[cs.as_str(), "--version"], short)
            .and_then(|v| v.lines().last().map(str::to_string));
    }
    if cancelled() {
        return env;
    }
    let Some(py) = python(local) else {
        return env;
    };
    progress("python");
    env.python = capture(&[py.as_str(), "--version"], short);
    if torch && !cancelled() {
        progress("torch.utils.collect_env");
        env.torch_collect_env = torch_report(session.as_mut(), &py, cancel);
    }
    env
}

/// `python -m torch.utils.collect_env`, when torch imports (seconds: it imports torch).
fn torch_report(session: &mut dyn Session, py: &str, cancel: &AtomicBool) -> Option<String> {
    ask(
        session,
        // runpy warns that torch.utils imported collect_env already: noise at the top of the report.
        &[
            py,
            "-W",
            "ignore::RuntimeWarning",
            "-m",
            "torch.utils.collect_env",
        ],
        Duration::from_secs(120),
        cancel,
    )
}

/// PyTorch's report for an environment collected without it, when the run turned out to use torch: asked
/// where the rest was (`at`).
pub fn add_torch_report(env: &mut Environment, at: &dyn Executor, cancel: &AtomicBool) {
    if let Some(py) = python(at.is_local()) {
        env.torch_collect_env = torch_report(at.session().as_mut(), &py, cancel);
    }
}

/// The Python the environment record asks: `python3`, else `python` (on a scheduler's node, `python3`
/// as its `PATH` finds it, when this machine has none).
fn python(local: bool) -> Option<String> {
    let found = find_program("python3", &[]).or_else(|| find_program("python", &[]));
    tool(found, "python3", local)
}

#[cfg(test)]
mod tests {
    use std::sync::{Arc, Mutex};
    use std::time::Duration;

    use super::*;
    use crate::exec::process::{ProcessError, RunOutput};

    /// A scheduler's node, as a fake: every command goes through its sessions, and it answers as a node
    /// named `gpu-node-7` with one H200 would.
    struct Node {
        asked: Arc<Mutex<Vec<String>>>,
    }

    struct NodeSession(Arc<Mutex<Vec<String>>>);

    impl Executor for Node {
        fn session(&self) -> Box<dyn Session> {
            Box::new(NodeSession(self.asked.clone()))
        }
        fn is_local(&self) -> bool {
            false
        }
    }

    impl Session for NodeSession {
        fn run(&mut self, spec: &CommandSpec, _: &AtomicBool) -> Result<RunOutput, ProcessError> {
            let CommandLine::Argv(argv) = &spec.command else {
                panic!("a shell line: {:?}", spec.command);
            };
            let line = argv.join(" ");
            self.0.lock().unwrap().push(line.clone());
            let output = match line.as_str() {
                "uname -n" => "gpu-node-7",
                "uname -srm" => "Linux 6.8.0 x86_64",
                l if l.ends_with("--format=csv,noheader") => "NVIDIA H200, 580.82.07, 143771 MiB",
                l if l.ends_with("--version") && l.contains("python") => "Python 3.12.3",
                _ => "",
            };
            Ok(RunOutput {
                exit: Exit::Code(0),
                duration: Duration::ZERO,
                output: output.into(),
                total_bytes: output.len() as u64,
                interrupted: false,
                lingering: vec![],
                job: None,
                ended_by: None,
            })
        }
    }

    #[test]
    fn on_a_schedulers_node_every_question_goes_through_the_executor_and_the_record_names_the_node()
    {
        let asked = Arc::new(Mutex::new(Vec::new()));
        let node = Node {
            asked: asked.clone(),
        };
        let env = gather(&node, &AtomicBool::new(false), false, &mut |_| {});
        assert_eq!(env.host.as_deref(), Some("gpu-node-7"));
        assert!(env.elsewhere);
        assert_eq!(env.gpus, ["NVIDIA H200, 580.82.07, 143771 MiB"]);
        assert_eq!(env.python.as_deref(), Some("Python 3.12.3"));
        // The driver API is asked in this process: of this machine, so not at all for a node.
        assert_eq!(env.driver_api, None);
        let asked = asked.lock().unwrap();
        // Tools this machine lacks are asked by name, for the node's PATH to find.
        for tool in ["nvidia-smi", "nvcc", "compute-sanitizer", "python"] {
            assert!(
                asked.iter().any(|l| l.contains(tool)),
                "{tool} never asked: {asked:?}"
            );
        }
        let md = env.markdown();
        assert!(
            md.contains("- Machine: gpu-node-7 (a node the scheduler gave"),
            "{md}"
        );
        assert!(!md.contains("driver API"), "{md}");
    }
}
