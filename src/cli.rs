//! The command line: clap definitions, dispatch to the library, and the mapping of errors to exit codes.

use std::io::Read;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use clap::{Parser, Subcommand, ValueEnum};

use crate::classify::{classify, Exit, FaultClass};
use crate::config::{CommandLine, Config};
use crate::events::Reporter;
use crate::exit_codes;
use crate::report::RunResult;
use crate::reporter::{HumanReporter, JsonReporter};
use crate::start::{start, StartOptions};

/// Finds the first commit that makes a GPU program fault, and says what the fault is.
#[derive(Parser, Debug)]
#[command(name = "cudabisect", version, about)]
pub struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Clone, Copy, Debug, ValueEnum, PartialEq, Eq)]
enum MessageFormat {
    Human,
    Json,
}

#[derive(Subcommand, Debug)]
enum Command {
    /// Bisect GOOD..BAD: build and run the repro at probe commits, and report the first bad commit.
    Start {
        /// The range, as GOOD..BAD.
        range: String,
        /// The repository (default: the current directory).
        #[arg(short = 'C', default_value = ".")]
        dir: PathBuf,
        /// Config file (default: bisect.toml at the repository root).
        #[arg(long)]
        config: Option<PathBuf>,
        /// Write the JSON report here.
        #[arg(long)]
        report: Option<PathBuf>,
        /// Another known-good revision (repeatable).
        #[arg(long = "good")]
        goods: Vec<String>,
        /// Keep the probe worktree registered after the run.
        #[arg(long)]
        keep_worktree: bool,
        /// Remove untracked and ignored files in the worktree before each build.
        #[arg(long)]
        clean: bool,
        /// Do not run compute-sanitizer at the first bad commit.
        #[arg(long)]
        no_triage: bool,
        /// Do not shrink the model at the first bad commit.
        #[arg(long)]
        no_shrink: bool,
        /// Write the hand-off bundle under this directory (default: [bundle] dir, cudabisect-out).
        #[arg(long)]
        bundle_dir: Option<PathBuf>,
        /// Output: human (progress on stderr, summary on stdout) or json (JSON Lines on stdout).
        #[arg(long, value_enum, default_value = "human")]
        message_format: MessageFormat,
    },
    /// Classify a saved log (a file, or - for standard input).
    Classify {
        /// The log.
        log: String,
        /// The process's exit status; when absent, a final `exit=N` line in the log is used.
        #[arg(long)]
        exit_code: Option<i32>,
        /// Print {"class","code","kernel","site","framework","summary"}.
        #[arg(long)]
        json: bool,
    },
    /// Rerun the repro under compute-sanitizer and say which kernel did what to which allocation.
    Triage {
        /// Config file (default: bisect.toml at the repository root).
        #[arg(long)]
        config: Option<PathBuf>,
        /// The repository (default: the current directory).
        #[arg(short = 'C', default_value = ".")]
        dir: PathBuf,
        /// Check out and build this revision in the probe worktree first.
        #[arg(long)]
        at: Option<String>,
        /// Print the result as JSON.
        #[arg(long)]
        json: bool,
        /// The command to sanitize (default: the configured repro).
        #[arg(last = true)]
        command: Vec<String>,
    },
    /// Shrink the model to the smallest subgraph that still faults the same way, through [shrink].
    Shrink {
        /// Check out and build this revision in the probe worktree first (default: run in the checkout as it is).
        #[arg(long)]
        at: Option<String>,
        /// The repository (default: the current directory).
        #[arg(short = 'C', default_value = ".")]
        dir: PathBuf,
        /// Config file (default: bisect.toml at the repository root).
        #[arg(long)]
        config: Option<PathBuf>,
        /// Output: human (progress on stderr, summary on stdout) or json (JSON Lines on stdout).
        #[arg(long, value_enum, default_value = "human")]
        message_format: MessageFormat,
    },
    /// The native harness: run a model file node by node on CUDA or the CPU reference.
    Harness {
        /// The model file, for every subcommand (or give it after the subcommand).
        #[arg(long, global = true)]
        model: Option<PathBuf>,
        /// cuda, cpu (the bounds-checked reference) or auto (cuda when a device is usable).
        #[arg(long, value_enum, default_value = "auto", global = true)]
        backend: Backend,
        #[command(subcommand)]
        command: HarnessCommand,
    },
    /// Show the whole pipeline on a generated sample repository.
    Demo {
        /// Keep the sample repository here instead of a temporary directory.
        #[arg(long)]
        dir: Option<PathBuf>,
    },
}

#[derive(Clone, Copy, Debug, ValueEnum, PartialEq, Eq)]
enum Backend {
    Cuda,
    Cpu,
    Auto,
}

#[derive(Subcommand, Debug)]
enum HarnessCommand {
    /// Run the model (or the kept nodes), printing a marker around each node.
    Run {
        /// The model file (TOML).
        file: Option<PathBuf>,
        /// Run only these nodes (comma-separated ids); their other inputs come from --inputs.
        #[arg(long)]
        keep: Option<String>,
        /// Save every node output here as <tensor>.npy, with manifest.json.
        #[arg(long)]
        record: Option<PathBuf>,
        /// A recording to take boundary inputs from.
        #[arg(long)]
        inputs: Option<PathBuf>,
        /// Compile kernels without reading or writing the kernel cache.
        #[arg(long)]
        no_cache: bool,
    },
    /// Check the model and compile the kernels it needs into the cache (a build step for bisect.toml).
    Build {
        /// The model file (TOML).
        file: Option<PathBuf>,
        /// Compile without reading or writing the kernel cache.
        #[arg(long)]
        no_cache: bool,
    },
    /// Print the graph (nodes, ops, kernels, tensor shapes and producers) as JSON.
    Describe {
        /// The model file (TOML).
        file: Option<PathBuf>,
    },
    /// Write the kept nodes as a standalone model with their recorded inputs.
    Extract {
        /// The model file (TOML).
        file: Option<PathBuf>,
        /// The nodes to keep (comma-separated ids).
        #[arg(long)]
        keep: String,
        /// The recording boundary inputs come from.
        #[arg(long)]
        inputs: Option<PathBuf>,
        /// The directory to write model.toml and inputs/ into.
        #[arg(long)]
        out: PathBuf,
    },
}

/// Parses the arguments, runs the command, and returns the process exit code.
pub fn main() -> i32 {
    let cli = Cli::parse();
    let cancel = Arc::new(AtomicBool::new(false));
    let flag = Arc::clone(&cancel);
    // Ctrl-C or SIGTERM: stop the running process group and clean up, rather than dying with orphans.
    let _ = ctrlc::set_handler(move || flag.store(true, Ordering::SeqCst));
    match cli.command {
        Command::Start {
            range,
            dir,
            config,
            report,
            goods,
            keep_worktree,
            clean,
            no_triage,
            no_shrink,
            bundle_dir,
            message_format,
        } => {
            let opts = StartOptions {
                dir,
                range,
                goods,
                config,
                report,
                keep_worktree,
                clean,
                no_triage,
                no_shrink,
                bundle_dir,
            };
            let mut reporter: Box<dyn Reporter> = match message_format {
                MessageFormat::Human => Box::new(HumanReporter::new()),
                MessageFormat::Json => Box::new(JsonReporter),
            };
            cmd_start(&opts, reporter.as_mut(), &cancel)
        }
        Command::Classify {
            log,
            exit_code,
            json,
        } => cmd_classify(&log, exit_code, json),
        Command::Triage {
            config,
            dir,
            at,
            json,
            command,
        } => crate::triage_cmd::run(&dir, config, at.as_deref(), command, json, &cancel),
        Command::Shrink {
            at,
            dir,
            config,
            message_format,
        } => {
            let mut reporter: Box<dyn Reporter> = match message_format {
                MessageFormat::Human => Box::new(HumanReporter::new()),
                MessageFormat::Json => Box::new(JsonReporter),
            };
            crate::shrink_cmd::run(&dir, config, at.as_deref(), reporter.as_mut(), &cancel)
        }
        Command::Harness {
            model,
            backend,
            command,
        } => {
            let backend = match backend {
                Backend::Cuda => crate::harness::BackendChoice::Cuda,
                Backend::Cpu => crate::harness::BackendChoice::Cpu,
                Backend::Auto => crate::harness::BackendChoice::Auto,
            };
            let pick = |file: Option<PathBuf>| file.or(model.clone());
            match command {
                HarnessCommand::Run {
                    file,
                    keep,
                    record,
                    inputs,
                    no_cache,
                } => crate::harness_cmd::run(pick(file), backend, keep, record, inputs, no_cache),
                HarnessCommand::Describe { file } => crate::harness_cmd::describe(pick(file)),
                HarnessCommand::Build { file, no_cache } => {
                    crate::harness_cmd::build(pick(file), backend, no_cache)
                }
                HarnessCommand::Extract {
                    file,
                    keep,
                    inputs,
                    out,
                } => crate::harness_cmd::extract(pick(file), &keep, inputs, &out),
            }
        }
        Command::Demo { dir } => crate::demo::run(dir, &cancel),
    }
}

/// Runs `start` and maps its outcome to an exit code.
pub fn cmd_start(opts: &StartOptions, reporter: &mut dyn Reporter, cancel: &AtomicBool) -> i32 {
    match start(opts, reporter, cancel) {
        Ok(report) if cancel.load(Ordering::SeqCst) && report.result == RunResult::Inconclusive => {
            exit_codes::INTERRUPTED
        }
        Ok(report) => match report.result {
            RunResult::Found => exit_codes::FOUND,
            RunResult::EndpointsInvalid => exit_codes::ENDPOINTS_INVALID,
            RunResult::Ambiguous | RunResult::Inconclusive => exit_codes::INCONCLUSIVE,
        },
        Err(e) => {
            eprintln!("error: {e}");
            if e.is_usage() {
                exit_codes::USAGE
            } else {
                exit_codes::INTERNAL
            }
        }
    }
}

fn cmd_classify(log: &str, exit_code: Option<i32>, json: bool) -> i32 {
    let bytes = if log == "-" {
        let mut buf = Vec::new();
        std::io::stdin().read_to_end(&mut buf).map(|_| buf)
    } else {
        std::fs::read(log)
    };
    let bytes = match bytes {
        Ok(b) => b,
        Err(e) => {
            eprintln!("error: cannot read {log}: {e}");
            return exit_codes::USAGE;
        }
    };
    let text = String::from_utf8_lossy(&bytes);
    let (exit, body) = split_exit_trailer(&text, exit_code);
    let signature = classify(exit, body);
    if json {
        println!("{}", signature.to_classify_json());
    } else {
        println!("{}", signature.short());
        println!("{}", signature.summary);
        for (k, v) in [
            ("framework", &signature.framework),
            ("detail", &signature.detail),
        ] {
            if let Some(v) = v {
                println!("{k}: {v}");
            }
        }
    }
    if signature.class == FaultClass::None {
        exit_codes::FOUND
    } else {
        exit_codes::CLASSIFIED_FAILURE
    }
}

/// Uses `--exit-code` when given, else a final `exit=N` line (as capture scripts append), else unknown.
fn split_exit_trailer(text: &str, given: Option<i32>) -> (Exit, &str) {
    if let Some(code) = given {
        return (Exit::Code(code), text);
    }
    let trimmed = text.trim_end();
    if let Some((body, last)) = trimmed.rsplit_once('\n') {
        if let Some(code) = last
            .strip_prefix("exit=")
            .and_then(|c| c.trim().parse().ok())
        {
            return (Exit::Code(code), body);
        }
    }
    (Exit::Unknown, text)
}

/// Loads a config for commands that take `--config`, defaulting to the repository's bisect.toml.
pub fn load_config(
    dir: &std::path::Path,
    config: Option<PathBuf>,
) -> Result<(crate::git::Repo, Config), String> {
    let repo = crate::git::Repo::open(dir).map_err(|e| e.to_string())?;
    let path = config.unwrap_or_else(|| repo.workdir().join("bisect.toml"));
    let config = Config::load(&path).map_err(|e| e.to_string())?;
    Ok((repo, config))
}

/// Turns `-- cmd args…` into a command, when given.
pub fn command_from_args(args: Vec<String>) -> Option<CommandLine> {
    (!args.is_empty()).then_some(CommandLine::Argv(args))
}
