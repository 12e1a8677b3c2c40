//! The command-line definition (clap): every subcommand and option, with the exit codes in `--help`.

use std::path::PathBuf;

use clap::{Args, Parser, Subcommand, ValueEnum};

/// Finds the first commit that makes a GPU program fault, and says what the fault is.
#[derive(Parser, Debug)]
#[command(name = "cudabisect", version, about, after_help = super::exit_codes::HELP)]
pub struct Cli {
    /// The subcommand.
    #[command(subcommand)]
    pub command: Command,
}

/// How results are printed.
#[derive(Clone, Copy, Debug, ValueEnum, PartialEq, Eq)]
pub enum MessageFormat {
    /// Progress on stderr, summary on stdout.
    Human,
    /// JSON Lines on stdout.
    Json,
}

/// The subcommands.
#[derive(Subcommand, Debug)]
pub enum Command {
    /// Bisect GOOD..BAD: build and run the repro at probe commits, and report the first bad commit.
    #[command(after_help = super::exit_codes::HELP)]
    Start(StartArgs),
    /// Classify a saved log (a file, or - for standard input).
    #[command(after_help = super::exit_codes::HELP)]
    Classify(ClassifyArgs),
    /// Rerun the repro under compute-sanitizer and say which kernel did what to which allocation.
    Triage {
        /// Config file (default: bisect.toml at the repository root, else [tool.cudabisect] in its pyproject.toml).
        #[arg(long)]
        config: Option<PathBuf>,
        /// The repository (default: the current directory).
        #[arg(short = 'C', default_value = ".")]
        dir: PathBuf,
        /// Check out and build this revision in the probe worktree first.
        #[arg(long)]
        at: Option<String>,
        /// Output: human, or json (JSON Lines: progress events, then `triage_done` with the result).
        #[arg(long, value_enum, default_value = "human")]
        message_format: MessageFormat,
        /// The old spelling of `--message-format json`.
        #[arg(long, hide = true)]
        json: bool,
        /// The command to sanitize (default: the configured repro).
        #[arg(last = true)]
        command: Vec<String>,
    },
    #[command(after_help = super::exit_codes::HELP)]
    /// Shrink the model to the smallest subgraph that still faults the same way, through [shrink].
    Shrink {
        /// Check out and build this revision in the probe worktree first (default: run in the checkout as it is).
        #[arg(long)]
        at: Option<String>,
        /// The repository (default: the current directory).
        #[arg(short = 'C', default_value = ".")]
        dir: PathBuf,
        /// Config file (default: bisect.toml at the repository root, else [tool.cudabisect] in its pyproject.toml).
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
        backend: BackendArg,
        #[command(subcommand)]
        command: HarnessCommand,
    },
    /// Write a commented bisect.toml (or `[tool.cudabisect]` in pyproject.toml) from a repro command:
    /// detects a Python package, the framework and the GPUs; never overwrites a config.
    #[command(after_help = super::exit_codes::HELP)]
    Init {
        /// The repro command, after `--` (one shell string, or its words): `-- python3 train.py --steps 20`.
        #[arg(last = true, required = true)]
        repro: Vec<String>,
        /// The build command (default: none for a pure-Python package importable from its root, else an
        /// install into the per-worktree virtual environment).
        #[arg(long, value_name = "COMMAND")]
        build: Option<String>,
        /// Add `[tool.cudabisect]` to the repository's pyproject.toml instead of writing bisect.toml.
        #[arg(long)]
        pyproject: bool,
        /// The repository (default: the current directory).
        #[arg(short = 'C', default_value = ".")]
        dir: PathBuf,
        /// Output: human (what was written), or json (a `config_written` JSON line).
        #[arg(long, value_enum, default_value = "human")]
        message_format: MessageFormat,
    },
    /// Show the whole pipeline on a generated sample repository.
    Demo {
        /// Keep the sample repository here instead of a temporary directory.
        #[arg(long)]
        dir: Option<PathBuf>,
        /// Output: human (progress on stderr, summary on stdout) or json (JSON Lines on stdout).
        #[arg(long, value_enum, default_value = "human")]
        message_format: MessageFormat,
    },
    /// Print a finished run's probes: for people, as JSON, or as a log `git bisect replay` accepts.
    Log {
        /// The run (its directory name under .git/cudabisect/runs, or a path to it); default the latest.
        run: Option<String>,
        /// The repository (default: the current directory).
        #[arg(short = 'C', default_value = ".")]
        dir: PathBuf,
        /// human, json (one JSON line: the run's `finished` event, its report), or git (for `git bisect
        /// replay`). `--format` is the old spelling.
        #[arg(
            long = "message-format",
            alias = "format",
            value_enum,
            default_value = "human"
        )]
        format: LogFormat,
    },
    /// The nightly regression job: test the branch head, bisect a new fault from the last good commit,
    /// keep the state between nights.
    #[command(after_help = super::exit_codes::HELP)]
    Nightly(NightlyArgs),
    /// Hand-off bundles.
    Bundle {
        #[command(subcommand)]
        command: BundleCommand,
    },
    /// Print a shell completion script (bash, zsh, fish, elvish, powershell) generated from this CLI.
    Completions {
        /// The shell.
        shell: clap_complete::Shell,
    },
    /// Print the man page (roff) generated from this CLI, or with --markdown the command reference.
    Man {
        /// The command reference as Markdown (docs/reference/commands.md) instead of roff.
        #[arg(long)]
        markdown: bool,
    },
}

/// How `nightly` maps its night to an exit code.
#[derive(Clone, Copy, Debug, ValueEnum, PartialEq, Eq)]
pub enum NightlyExitCodes {
    /// A code per status: 0 clean, 10 baseline, 11 fixed, 12 regression, 13 still failing.
    Detailed,
    /// Every good night exits 0, so a CI step passes; a regression 12, still failing 13.
    Ci,
}

impl NightlyExitCodes {
    /// `ci` when the environment says CI (`CI` set to anything but `false`/`0`/empty), else `detailed`.
    pub fn from_env() -> Self {
        match std::env::var("CI") {
            Ok(v) if !matches!(v.trim().to_ascii_lowercase().as_str(), "" | "0" | "false") => {
                Self::Ci
            }
            _ => Self::Detailed,
        }
    }
}

/// `log --format` values.
#[derive(Clone, Copy, Debug, ValueEnum, PartialEq, Eq)]
pub enum LogFormat {
    /// One line per probe.
    Human,
    /// One JSON line: the run's `finished` event (its report).
    Json,
    /// `git bisect start/good/bad/skip` lines for `git bisect replay`.
    Git,
}

/// `bundle` subcommands.
#[derive(Subcommand, Debug)]
pub enum BundleCommand {
    /// Pack a bundle directory into a .tar.gz to attach to an issue, and print its path and size.
    Pack {
        /// The bundle directory (the one holding REPORT.md).
        dir: PathBuf,
        /// Where to write the archive (default: <DIR>.tar.gz beside the bundle).
        #[arg(long, short = 'o')]
        out: Option<PathBuf>,
        /// Also pack bin/ (the cudabisect binary a native-harness bundle may carry).
        #[arg(long)]
        include_binary: bool,
        /// Output: human (one line), or json (a `bundle_packed` JSON line).
        #[arg(long, value_enum, default_value = "human")]
        message_format: MessageFormat,
    },
}

/// The `--backend` values.
#[derive(Clone, Copy, Debug, ValueEnum, PartialEq, Eq)]
pub enum BackendArg {
    /// CUDA.
    Cuda,
    /// The CPU reference.
    Cpu,
    /// CUDA when usable.
    Auto,
}

/// `harness` subcommands.
#[derive(Subcommand, Debug)]
pub enum HarnessCommand {
    /// Run the model (or the kept nodes), printing a marker around each node.
    Run {
        /// The model file (TOML).
        file: Option<PathBuf>,
        /// Run only these nodes (comma-separated ids); their other inputs come from --recording.
        #[arg(long)]
        keep: Option<String>,
        /// Save every node output here as <tensor>.npy, with manifest.json.
        #[arg(long)]
        record: Option<PathBuf>,
        /// A recording to take boundary inputs from.
        #[arg(long, alias = "inputs")]
        recording: Option<PathBuf>,
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
    /// Write the graph (nodes, ops, kernels, tensor shapes and producers) as JSON: to --out, or stdout.
    Describe {
        /// The model file (TOML).
        file: Option<PathBuf>,
        /// Write the description here (the harness protocol's channel) instead of stdout.
        #[arg(long)]
        out: Option<PathBuf>,
    },
    /// Write the kept nodes as a standalone model with their recorded inputs.
    Extract {
        /// The model file (TOML).
        file: Option<PathBuf>,
        /// The nodes to keep (comma-separated ids).
        #[arg(long)]
        keep: String,
        /// The recording boundary inputs come from.
        #[arg(long, alias = "inputs")]
        recording: Option<PathBuf>,
        /// The directory to write model.toml and inputs/ into.
        #[arg(long)]
        out: PathBuf,
    },
}

fn parse_jobs(text: &str) -> Result<cudabisect::config::Jobs, String> {
    cudabisect::config::Jobs::parse(text)
}

// The arguments of `start` (its help is the variant's doc comment).
#[derive(Args, Debug)]
pub struct StartArgs {
    /// The range, as GOOD..BAD (GOOD need not be an ancestor of BAD: its merge base is tested first).
    pub range: String,
    /// Only commits that touch these paths are probed (after `--`).
    #[arg(last = true)]
    pub pathspec: Vec<String>,
    /// Follow only the first parent of merge commits.
    #[arg(long)]
    pub first_parent: bool,
    /// Find the fix instead: the range is OLD..NEW, the fault shows at OLD and is gone at NEW, and
    /// the answer is the first commit where it is gone (the one to backport).
    #[arg(long)]
    pub find_fix: bool,
    /// The name of the older state in the output and `log --message-format git` (git's `--term-old`;
    /// default `good`, or `broken` with --find-fix).
    #[arg(long, value_name = "TERM")]
    pub term_old: Option<String>,
    /// The name of the newer state (git's `--term-new`; default `bad`, or `fixed` with --find-fix).
    #[arg(long, value_name = "TERM")]
    pub term_new: Option<String>,
    /// The repository (default: the current directory).
    #[arg(short = 'C', default_value = ".")]
    pub dir: PathBuf,
    /// Config file (default: bisect.toml at the repository root, else [tool.cudabisect] in its pyproject.toml).
    #[arg(long)]
    pub config: Option<PathBuf>,
    /// Write the JSON report here.
    #[arg(long)]
    pub report: Option<PathBuf>,
    /// Another known-good revision (repeatable).
    #[arg(long = "good")]
    pub goods: Vec<String>,
    /// Keep the probe worktree registered after the run.
    #[arg(long)]
    pub keep_worktree: bool,
    /// Remove untracked and ignored files in the worktree before each build.
    #[arg(long)]
    pub clean: bool,
    /// Do not run compute-sanitizer at the first bad commit.
    #[arg(long)]
    pub no_triage: bool,
    /// Do not shrink the model at the first bad commit.
    #[arg(long)]
    pub no_shrink: bool,
    /// Probe every commit again, ignoring the journal of earlier runs with the same config (after
    /// changing something the config does not name: a driver, a library, the machine's setup).
    #[arg(long)]
    pub fresh: bool,
    /// Probes at once: at most N, or `auto` (the default: as many on each visible GPU as its memory
    /// holds, measured in the first round). Overrides `[search] jobs`. Each worker has its own
    /// worktree; workers share a GPU when there are more of them than GPUs.
    #[arg(long, short = 'j', value_parser = parse_jobs, value_name = "N|auto")]
    pub jobs: Option<cudabisect::config::Jobs>,
    /// Write the result as JUnit XML here (a first bad commit is a failed test case whose body is
    /// REPORT.md).
    #[arg(long)]
    pub junit: Option<PathBuf>,
    /// Write the hand-off bundle under this directory (default: [bundle] dir, else the state directory).
    #[arg(long)]
    pub bundle_dir: Option<PathBuf>,
    /// Output: human (progress on stderr, summary on stdout) or json (JSON Lines on stdout).
    #[arg(long, value_enum, default_value = "human")]
    pub message_format: MessageFormat,
}

// The arguments of `nightly` (its help is the variant's doc comment).
#[derive(Args, Debug)]
pub struct NightlyArgs {
    /// The repository (default: the current directory).
    #[arg(short = 'C', default_value = ".")]
    pub dir: PathBuf,
    /// Config file (default: bisect.toml at the repository root, else [tool.cudabisect] in its pyproject.toml).
    #[arg(long)]
    pub config: Option<PathBuf>,
    /// The branch to test (default: the checkout's current branch).
    #[arg(long)]
    pub branch: Option<String>,
    /// The state directory (default: nightly/ in cudabisect's state under the git directory; CI passes
    /// a cached directory).
    #[arg(long)]
    pub state: Option<PathBuf>,
    /// Write the JSON report here.
    #[arg(long)]
    pub report: Option<PathBuf>,
    /// Write JUnit XML here.
    #[arg(long)]
    pub junit: Option<PathBuf>,
    /// The last good commit, for the first night.
    #[arg(long)]
    pub since: Option<String>,
    /// Bisect only: no triage or shrinking at the first bad commit.
    #[arg(long)]
    pub no_stages: bool,
    /// Exit codes: `detailed` (10 baseline, 11 fixed, 12 regression, 13 still failing) or `ci` (a good
    /// night, clean, baseline or fixed, exits 0; a regression 12, still failing 13). Default: `ci` when
    /// the environment says CI (`CI=true`, as GitHub Actions, GitLab CI and most others set it), else
    /// `detailed`.
    #[arg(long, value_enum, value_name = "STYLE")]
    pub exit_codes: Option<NightlyExitCodes>,
    /// Output: human (progress on stderr, summary on stdout) or json (JSON Lines on stdout).
    #[arg(long, value_enum, default_value = "human")]
    pub message_format: MessageFormat,
}

// The arguments of `classify` (its help is the variant's doc comment).
#[derive(Args, Debug)]
pub struct ClassifyArgs {
    /// The log.
    pub log: String,
    /// The process's exit status (128+N and negative values mean killed by signal N); when absent, the
    /// log's own trailer (`[cudabisect] exit=N …` or a final `exit=N` line) is used.
    #[arg(long, allow_negative_numbers = true)]
    pub exit_code: Option<i32>,
    /// The process was killed by this signal.
    #[arg(long, conflicts_with_all = ["exit_code", "timed_out"])]
    pub signal: Option<i32>,
    /// The process ran past its timeout.
    #[arg(long, conflicts_with = "exit_code")]
    pub timed_out: bool,
    /// Output: human, or json ({"class","code","kernel","site","framework","rank","summary"}).
    #[arg(long, value_enum, default_value = "human")]
    pub message_format: MessageFormat,
    /// The old spelling of `--message-format json`.
    #[arg(long, hide = true)]
    pub json: bool,
}
