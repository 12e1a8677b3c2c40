//! Parses the arguments, installs the Ctrl-C handler, runs the subcommand and turns its result into the
//! process's exit code.

use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use clap::Parser;

use cudabisect::backend::BackendChoice;
use cudabisect::report::event::Reporter;
use cudabisect::report::human::HumanReporter;
use cudabisect::report::json::JsonReporter;
use cudabisect::run::plan::StartOptions;

use super::args::{
    BackendArg, BundleCommand, ClassifyArgs, Cli, Command, HarnessCommand, MessageFormat,
    NightlyArgs, StartArgs,
};
use super::error::CommandResult;

fn reporter(format: MessageFormat) -> Box<dyn Reporter> {
    match format {
        MessageFormat::Human => Box::new(HumanReporter::new()),
        MessageFormat::Json => Box::new(JsonReporter::new()),
    }
}

/// Runs the command line and returns the exit code.
pub fn main() -> ExitCode {
    let cli = Cli::parse();
    let cancel = Arc::new(AtomicBool::new(false));
    let flag = Arc::clone(&cancel);
    // Ctrl-C or SIGTERM: stop the running process group and clean up, rather than dying with orphans.
    let _ = ctrlc::set_handler(move || flag.store(true, Ordering::SeqCst));
    // The signals a batch system sends before it ends a job (Slurm's `--signal=USR1@…`) stop a run the
    // same clean way; a file-size limit makes a write fail (an error cudabisect reports) instead of
    // killing it. Handlers, unlike an ignored signal, are not inherited by the commands it starts.
    for sig in [
        signal_hook::consts::SIGUSR1,
        signal_hook::consts::SIGUSR2,
        signal_hook::consts::SIGALRM,
    ] {
        let _ = signal_hook::flag::register(sig, Arc::clone(&cancel));
    }
    let _ = signal_hook::flag::register(
        signal_hook::consts::SIGXFSZ,
        Arc::new(AtomicBool::new(false)),
    );
    let result = run(cli.command, &cancel);
    match result {
        // Whatever a stopped command returns, it was stopped: 130, as documented.
        Err(e) if cancel.load(Ordering::SeqCst) => {
            eprintln!("{}", interrupted_line(&e));
            ExitCode::from(super::exit_codes::INTERRUPTED)
        }
        Ok(code) => ExitCode::from(code),
        Err(e) => {
            eprintln!("error: {e}");
            ExitCode::from(e.exit_code())
        }
    }
}

/// The one line a stopped command's error prints: said once, whether or not the error already says it
/// was interrupted.
fn interrupted_line(e: &super::error::CommandError) -> String {
    if e.kind == super::error::ErrorKind::Interrupted {
        format!("error: {e}")
    } else {
        format!("error: interrupted: {e}")
    }
}

fn run(command: Command, cancel: &AtomicBool) -> CommandResult {
    match command {
        Command::Start(args) => start(args, cancel),
        Command::Classify(args) => classify(args),
        Command::Triage {
            config,
            dir,
            at,
            message_format,
            json,
            command,
        } => super::triage::run(
            &dir,
            config.as_deref(),
            at.as_deref(),
            command,
            json || message_format == MessageFormat::Json,
            cancel,
        ),
        Command::Shrink {
            at,
            dir,
            config,
            message_format,
        } => super::shrink::run(
            &dir,
            config.as_deref(),
            at.as_deref(),
            reporter(message_format).as_mut(),
            cancel,
        ),
        Command::Harness {
            model,
            backend,
            command,
        } => harness(model, backend, command),
        Command::Init {
            repro,
            build,
            pyproject,
            dir,
            message_format,
        } => super::init::run(
            dir,
            repro,
            build,
            pyproject,
            message_format == MessageFormat::Json,
            cancel,
        ),
        Command::Demo {
            dir,
            message_format,
        } => super::demo::run(dir, reporter(message_format).as_mut(), cancel),
        Command::Bundle {
            command:
                BundleCommand::Pack {
                    dir,
                    out,
                    include_binary,
                    message_format,
                },
        } => super::bundle::pack(
            &dir,
            out.as_deref(),
            include_binary,
            message_format == MessageFormat::Json,
        ),
        Command::Nightly(args) => nightly(args, cancel),
        Command::Log { run, dir, format } => super::log::run(&dir, run.as_deref(), format),
        Command::Completions { shell } => super::shell::completions(shell),
        Command::Man { markdown: true } => {
            super::common::print_stdout(&super::reference::markdown());
            Ok(super::exit_codes::OK)
        }
        Command::Man { markdown: false } => super::shell::man(),
    }
}

/// `start`: its options from the arguments.
fn start(args: StartArgs, cancel: &AtomicBool) -> CommandResult {
    let StartArgs {
        range,
        pathspec,
        first_parent,
        find_fix,
        term_old,
        term_new,
        dir,
        config,
        report,
        goods,
        keep_worktree,
        clean,
        no_triage,
        no_shrink,
        fresh,
        jobs,
        junit,
        bundle_dir,
        message_format,
    } = args;
    let opts = StartOptions {
        dir,
        range,
        goods,
        pathspec,
        first_parent,
        config,
        report,
        keep_worktree,
        clean,
        no_triage,
        no_shrink,
        fresh,
        junit,
        goods_may_show_other_bugs: false,
        journal: None,
        bundle_dir,
        jobs,
        state_locked: false,
        find_fix,
        terms: cudabisect::report::record::Terms::from_flags(find_fix, term_old, term_new)
            .map_err(super::error::CommandError::usage)?,
    };
    super::start::run(&opts, reporter(message_format).as_mut(), cancel)
}

/// `harness`: the native harness's subcommands, on the model file given to each (else to `harness`).
fn harness(model: Option<PathBuf>, backend: BackendArg, command: HarnessCommand) -> CommandResult {
    let backend = match backend {
        BackendArg::Cuda => BackendChoice::Cuda,
        BackendArg::Cpu => BackendChoice::Cpu,
        BackendArg::Auto => BackendChoice::Auto,
    };
    let pick = |file: Option<PathBuf>| file.or(model.clone());
    match command {
        HarnessCommand::Run {
            file,
            keep,
            record,
            recording,
            no_cache,
        } => super::harness::run(pick(file), backend, keep, record, recording, no_cache),
        HarnessCommand::Describe { file, out } => super::harness::describe(pick(file), out),
        HarnessCommand::Build { file, no_cache } => {
            super::harness::build(pick(file), backend, no_cache)
        }
        HarnessCommand::Extract {
            file,
            keep,
            recording,
            out,
        } => super::harness::extract(pick(file), &keep, recording, &out),
    }
}

/// `nightly`: its options from the arguments, and the exit-code style (given, else from the environment).
fn nightly(args: NightlyArgs, cancel: &AtomicBool) -> CommandResult {
    let NightlyArgs {
        dir,
        config,
        branch,
        state,
        report,
        junit,
        since,
        no_stages,
        exit_codes,
        message_format,
    } = args;
    let opts = cudabisect::run::jobs::nightly::NightlyOptions {
        dir,
        config,
        branch,
        state,
        since,
        no_stages,
        report,
        junit,
    };
    let style = exit_codes.unwrap_or_else(super::args::NightlyExitCodes::from_env);
    super::nightly::run(&opts, style, reporter(message_format).as_mut(), cancel)
}

/// `classify`: the exit the log's process had, given on the command line (else read from the log).
fn classify(args: ClassifyArgs) -> CommandResult {
    let given = super::classify::GivenExit {
        code: args.exit_code,
        signal: args.signal,
        timed_out: args.timed_out,
    };
    let json = args.json || args.message_format == MessageFormat::Json;
    super::classify::run(&args.log, given, json)
}
