//! The text classifier: reads what PyTorch, Triton, CuPy, JAX, TensorFlow, cuBLAS/cuDNN, NCCL, compute-sanitizer
//! and the raw CUDA APIs print, and names the first fault.
//!
//! Rules: the earliest recognised fault line wins (a later error is usually fallout of the first), except that
//! a compute-sanitizer finding beats what the program itself saw, because under the sanitizer the program only
//! sees `unspecified launch failure`. Lines that quote source code in a Python traceback are never read as
//! errors, so a traceback that merely mentions CUDA does not count.

use std::sync::LazyLock;

use regex::Regex;

use super::kernel_name::short_kernel_name;
use super::sanitizer;
use super::signature::{Exit, FaultClass, Signature};
use crate::marker::{Marker, MarkerPhase};

/// CUDA error names with their codes and classes, for both the driver and the runtime spelling.
const CODE_NAMES: &[(&str, &str, u32, FaultClass)] = &[
    (
        "CUDA_ERROR_ILLEGAL_ADDRESS",
        "cudaErrorIllegalAddress",
        700,
        FaultClass::IllegalAddress,
    ),
    (
        "CUDA_ERROR_ASSERT",
        "cudaErrorAssert",
        710,
        FaultClass::DeviceAssert,
    ),
    (
        "CUDA_ERROR_HARDWARE_STACK_ERROR",
        "cudaErrorHardwareStackError",
        714,
        FaultClass::HardwareStackError,
    ),
    (
        "CUDA_ERROR_ILLEGAL_INSTRUCTION",
        "cudaErrorIllegalInstruction",
        715,
        FaultClass::IllegalInstruction,
    ),
    (
        "CUDA_ERROR_MISALIGNED_ADDRESS",
        "cudaErrorMisalignedAddress",
        716,
        FaultClass::MisalignedAddress,
    ),
    (
        "CUDA_ERROR_INVALID_ADDRESS_SPACE",
        "cudaErrorInvalidAddressSpace",
        717,
        FaultClass::InvalidAddressSpace,
    ),
    (
        "CUDA_ERROR_LAUNCH_FAILED",
        "cudaErrorLaunchFailure",
        719,
        FaultClass::LaunchFailure,
    ),
    (
        "CUDA_ERROR_OUT_OF_MEMORY",
        "cudaErrorMemoryAllocation",
        2,
        FaultClass::OutOfMemory,
    ),
    (
        "CUDA_ERROR_NO_DEVICE",
        "cudaErrorNoDevice",
        100,
        FaultClass::Infra,
    ),
    (
        "CUDA_ERROR_NOT_INITIALIZED",
        "cudaErrorInitializationError",
        3,
        FaultClass::Infra,
    ),
    (
        "CUDA_ERROR_SYSTEM_DRIVER_MISMATCH",
        "cudaErrorSystemDriverMismatch",
        803,
        FaultClass::Infra,
    ),
    (
        "CUDA_ERROR_COMPAT_NOT_SUPPORTED_ON_DEVICE",
        "cudaErrorCompatNotSupportedOnDevice",
        804,
        FaultClass::Infra,
    ),
    (
        "CUDA_ERROR_DEVICE_UNAVAILABLE",
        "cudaErrorDevicesUnavailable",
        46,
        FaultClass::Infra,
    ),
    (
        "CUDA_ERROR_ECC_UNCORRECTABLE",
        "cudaErrorECCUncorrectable",
        214,
        FaultClass::Infra,
    ),
    (
        "CUDA_ERROR_INSUFFICIENT_DRIVER",
        "cudaErrorInsufficientDriver",
        35,
        FaultClass::Infra,
    ),
    (
        "CUDA_ERROR_DEVICE_NOT_LICENSED",
        "cudaErrorDeviceNotLicensed",
        102,
        FaultClass::Infra,
    ),
];

/// One text rule: a pattern and the class it names.
struct Rule {
    class: FaultClass,
    regex: Regex,
}

fn rule(class: FaultClass, pattern: &str) -> Rule {
    Rule {
        class,
        regex: Regex::new(pattern).expect("built-in pattern compiles"),
    }
}

/// Rules in priority order: within one line the first rule that matches wins.
static RULES: LazyLock<Vec<Rule>> = LazyLock::new(|| {
    use FaultClass::*;
    vec![
        rule(
            DeviceAssert,
            r"(?i)device-side assert(ion)? triggered|\bcudaErrorAssert\b|\bCUDA_ERROR_ASSERT\b",
        ),
        rule(
            IllegalAddress,
            r"(?i)illegal memory access was encountered|\bCUDA_ERROR_ILLEGAL_ADDRESS\b|\bcudaErrorIllegalAddress\b|Warp Illegal Address|Warp Out-of-range Address",
        ),
        rule(
            MisalignedAddress,
            r"(?i)\bmisaligned address\b|\bCUDA_ERROR_MISALIGNED_ADDRESS\b|\bcudaErrorMisalignedAddress\b|Warp Misaligned Address",
        ),
        rule(
            InvalidAddressSpace,
            r"(?i)operation not supported on global/shared address space|\bCUDA_ERROR_INVALID_ADDRESS_SPACE\b|\bcudaErrorInvalidAddressSpace\b",
        ),
        rule(
            IllegalInstruction,
            r"(?i)an illegal instruction was encountered|\bCUDA_ERROR_ILLEGAL_INSTRUCTION\b|\bcudaErrorIllegalInstruction\b",
        ),
        rule(
            HardwareStackError,
            r"(?i)hardware stack error|Warp Hardware Stack Overflow|\bCUDA_ERROR_HARDWARE_STACK_ERROR\b|\bcudaErrorHardwareStackError\b",
        ),
        rule(
            LaunchFailure,
            r"(?i)unspecified launch failure|\bCUDA_ERROR_LAUNCH_FAILED\b|\bcudaErrorLaunchFailure\b|CUBLAS_STATUS_EXECUTION_FAILED|CUDNN_STATUS_EXECUTION_FAILED|\bcublas\w*\s+(error|status|failure)\W{0,3}13\b|\bcudnn\w*\s+(error|status|failure)\W{0,3}8\b|kernel execution error\. \(.*\berror: 13\)",
        ),
        rule(
            Nccl,
            r"NCCL error|\bnccl(UnhandledCudaError|SystemError|InternalError|InvalidUsage|InvalidArgument|RemoteError)\b|Watchdog caught collective operation timeout|DistBackendError|NCCL WARN",
        ),
        rule(
            OutOfMemory,
            r"(?i)CUDA out of memory|OutOfMemoryError|\bCUDA_ERROR_OUT_OF_MEMORY\b|\bcudaErrorMemoryAllocation\b|RESOURCE_EXHAUSTED|Resource exhausted: Out of memory|OOM when allocating|CUBLAS_STATUS_ALLOC_FAILED|CUDNN_STATUS_ALLOC_FAILED",
        ),
        rule(
            DeviceMismatch,
            r"Expected all tensors to be on the same device|Expected .{1,80} to be on the same device|is on cpu, different from other tensors on cuda|(?i)device mismatch|must be on the same device",
        ),
        rule(
            Nan,
            r"(?i)returned nan values|Tensor had (NaN|Inf) values|CheckNumerics|check_numerics|NaN or Inf found|anomaly detected.*nan|invalid value \((nan|inf)\) encountered|Invalid (nan|inf) value encountered",
        ),
        rule(
            Infra,
            concat!(
                r"(?i)no CUDA-capable device is detected|CUDA driver version is insufficient|driver/library version mismatch",
                r"|unsupported display driver / cuda driver combination|forward compatibility was attempted on non supported HW",
                r"|\bcuInit\b[^\n]*\b(failed|returned (CUDA_ERROR|[1-9]))|busy or unavailable",
                r"|uncorrectable ECC error (was )?encountered|fallen off the bus",
                r"|NVRM: Xid|\bXid \(PCI:|\bXid[: ]+\d+,|Found no NVIDIA driver|NVIDIA driver on your system is too old",
                r"|unable to dynamically load the .cuda. shared library|no CUDA driver found|no CUDA device found",
                r"|NVRTC \(libnvrtc\.so\) could not be loaded|NVIDIA-SMI has failed because",
                // Built for other GPUs than this one: the machine the run landed on, not the code.
                r"|No visible GPU devices|Unable to initialize backend '(cuda|gpu|rocm)'|CUDA driver initialization failed",
                r"|no kernel image is available for execution on the device|\bCUDA_ERROR_NO_BINARY_FOR_GPU\b|\bcudaErrorNoKernelImageForDevice\b",
                r"|\bCUDA_ERROR_(NO_DEVICE|NOT_INITIALIZED|SYSTEM_DRIVER_MISMATCH|COMPAT_NOT_SUPPORTED_ON_DEVICE|DEVICE_UNAVAILABLE|ECC_UNCORRECTABLE|INSUFFICIENT_DRIVER|DEVICE_NOT_LICENSED)\b",
                r"|\bcudaError(NoDevice|InitializationError|SystemDriverMismatch|DevicesUnavailable|ECCUncorrectable|InsufficientDriver)\b",
                // Slurm ending a job, not the job failing: its memory or time limit, node failure,
                // preemption; and the line cudabisect adds when the job's final state says so.
                r"|^slurmstepd\S*: error: .*(exceeded (job )?memory limit|DUE TO (TIME LIMIT|NODE FAILURE|PREEMPTION))",
                r"|^srun: error: (Unable to create step for job|Node failure on|Task launch for .* failed)",
                r"|^\[cudabisect\] slurm job \S+ on .*: (NODE_FAIL|PREEMPTED|BOOT_FAIL|DEADLINE|OUT_OF_MEMORY|TIMEOUT|REVOKED|STUCK|ENDED|LOST)",
            ),
        ),
        rule(
            // A stack dump taken of a process that stopped making progress (py-spy dump): a hang.
            Hang,
            r#"^Thread (0x)?[0-9a-fA-F]+ \((active|idle)[^)]*\): ""#,
        ),
        rule(
            Signal,
            concat!(
                r"Fatal Python error: (Segmentation fault|Aborted|Bus error|Floating point exception)|received signal SIG[A-Z]+|^(\S+: )?(Segmentation fault|Aborted|Bus error|Floating point exception|Illegal instruction|Trace/breakpoint trap)( \(core dumped\))?$",
                // The kernel's OOM killer, as the shell reports it (`Killed`, or a job line
                // `script: line 6:  3305 Killed   cmd`), and a DataLoader worker it took.
                r"|^Killed\s*$|is killed by signal: \w+",
                // bash's job line for a command a signal ended (`./run.sh: line 3:  1234 Segmentation
                // fault (core dumped) python train.py`).
                r"|: line \d+:\s+\d+ (Killed|Segmentation fault|Aborted|Bus error|Floating point exception|Illegal instruction|Terminated)\s",
                // A fatal check (glog's, TensorFlow's) aborts; Abseil's handler names the signal it caught.
                r"|^\*\*\* Check failure stack trace: \*\*\*|^\*\*\* SIG[A-Z]+ received at time=",
                // A DataLoader worker's SIGBUS, as PyTorch words it (shared memory ran out under it).
                r"|Unexpected bus error encountered in worker",
                // zsh's words for the same (`zsh: killed  cmd`, a job line `[1]  4242 killed  cmd`),
                // and the kernel's own line when the log carries it.
                r"|^zsh: killed\s|^\[\d+\]\s+[+-]?\s*\d+ killed\s|Out of memory: Killed process \d+",
            ),
        ),
        rule(
            BuildFailure,
            concat!(
                r"ninja: build stopped: subcommand failed|^nvcc fatal|Error compiling objects for extension|Error building extension|error: command '[^']*nvcc' failed|^CMake Error|^make(\[\d+\])?: \*\*\* .*Error \d+|collect2: error: ld returned|^nvlink error",
                // A compiled extension that does not link against what it runs with: built against
                // another torch or CUDA, or a device function the link never resolved.
                r"|^ImportError: \S+\.so(\.\d+)*: undefined symbol: |undefined reference to `|^ptxas fatal|Unresolved extern function",
            ),
        ),
    ]
});

static CUDA_FAILURE_CODE: LazyLock<Regex> = LazyLock::new(|| {
    // TensorFlow's and Abseil's checks print the code against success: `Check failed: err == cudaSuccess
    // (700 vs. 0)`.
    Regex::new(r"Cuda failure (\d+)|\(error (\d+)\)|CUDA error (\d+)|cudaSuccess \((\d+) vs\. 0\)")
        .expect("pattern")
});
static CODE_NAME: LazyLock<Regex> =
    LazyLock::new(|| Regex::new(r"\b(CUDA_ERROR_[A-Z_]+|cudaError[A-Za-z]+)\b").expect("pattern"));
static GENERIC_CUDA_ERROR: LazyLock<Regex> = LazyLock::new(|| {
    Regex::new(r"CUDA error: (.+)|\b(CUDA_ERROR_[A-Z_]+)\b|\bcudaError[A-Z]\w+|\bCU(DNN|BLAS)_STATUS_[A-Z_]+|cuDNN error").expect("pattern")
});
static ASSERT_LINE: LazyLock<Regex> = LazyLock::new(|| {
    // Windows paths (drive letters, backslashes), no function, a `[with T = …]` clause, no backticks.
    Regex::new(r"(?P<file>[^\s]+?\.(?:cu|cuh|h|hpp|cpp|cc|c)):(?P<line>\d+): (?:(?P<func>.*?):? )?block: \[[\d, ]+\], thread: \[[\d, ]+\] Assertion (?:`(?P<expr>.*)` )?failed")
        .expect("pattern")
});
/// The kernel a debugger names by its launch: `… in void k<float>(int*)<<<(80,64,1),(16,16,1)>>> ()`.
static LAUNCH_FRAME: LazyLock<Regex> = LazyLock::new(|| {
    Regex::new(r"(?:^|\sin |^#\d+\s+)(?P<func>[^<\s][^\n]*?)<<<\(").expect("pattern")
});
static PY_FRAME: LazyLock<Regex> = LazyLock::new(|| {
    Regex::new(r#"^\s*File "(?P<path>[^"]+)", line (?P<line>\d+), in (?P<func>.+)$"#)
        .expect("pattern")
});
static PY_EXCEPTION: LazyLock<Regex> = LazyLock::new(|| {
    Regex::new(
        r"^(?P<name>[A-Za-z_][\w.]*(Error|Exception|Exit|Interrupt|Warning))(:( (?P<msg>.*))?)?$",
    )
    .expect("pattern")
});
/// The line that ends a traceback, whatever the exception is called (`triton.runtime.errors.OutOfResources:
/// …`, `StopIteration`): consulted only inside a traceback, where nothing else is written unindented.
static PY_TRACEBACK_END: LazyLock<Regex> =
    LazyLock::new(|| Regex::new(r"^(?P<name>[A-Za-z_][\w.]*)(: (?P<msg>.*))?$").expect("pattern"));
static RANK: LazyLock<Regex> =
    LazyLock::new(|| Regex::new(r"(?i)\brank[ :=\[]*(\d+)").expect("pattern"));
static RUST_PANIC: LazyLock<Regex> =
    LazyLock::new(|| Regex::new(r"^thread '.*' panicked at (?P<site>\S+?):?$").expect("pattern"));

/// `text` without terminal escape sequences (colours, cursor moves, window titles); borrowed as it is
/// when it holds none.
pub fn strip_ansi(text: &str) -> std::borrow::Cow<'_, str> {
    static ESCAPE: LazyLock<Regex> = LazyLock::new(|| {
        Regex::new(r"\x1b\[[0-?]*[ -/]*[@-~]|\x1b\][^\x07\x1b]*(?:\x07|\x1b\\)?|\x1b[@-Z\\-_]")
            .expect("pattern")
    });
    if !text.contains('\x1b') {
        return std::borrow::Cow::Borrowed(text);
    }
    ESCAPE.replace_all(text, "")
}

/// True for a line that names a fault the classifier reads (a CUDA error, a device assert, a sanitizer
/// record, an NCCL or infrastructure failure): the lines worth keeping from the middle of a huge output.
pub fn is_fault_line(line: &str) -> bool {
    // One automaton for every pattern: this runs on every line of gigabyte outputs.
    static ANY_FAULT: LazyLock<regex::RegexSet> = LazyLock::new(|| {
        let patterns = RULES.iter().map(|r| r.regex.as_str().to_string()).chain([
            ASSERT_LINE.as_str().to_string(),
            GENERIC_CUDA_ERROR.as_str().to_string(),
            "^========= ".to_string(),
        ]);
        regex::RegexSet::new(patterns).expect("built-in patterns compile")
    });
    ANY_FAULT.is_match(line)
}

/// Classifies one stream of output (one process, or one rank's lines) from how it ended and what it printed.
pub fn classify_stream(exit: Exit, output: &str) -> Signature {
    let lines: Vec<&str> = output.lines().collect();
    let context = Context::read(&lines);
    if let Some(mut finding) = sanitizer::first_finding(&lines) {
        context.fill(&mut finding, &lines);
        return finding;
    }
    // A stack dump read as a hang is for logs without an exit status; a run that timed out is a hang
    // already, and its dumps are read per rank.
    let finding = first_text_finding(&lines)
        .filter(|f| !(f.class == FaultClass::Hang && exit == Exit::Timeout));
    let mut signature = match (finding, exit) {
        // At exit 0 an infrastructure line stands only when the host ended the job (a scheduler's line:
        // the job's own status may read 0); a driver message the program survived is not a failure.
        (Some(f), Exit::Code(0)) if f.class != FaultClass::Infra || !host_ended(&f.summary) => {
            // The program says it succeeded; what it printed was handled.
            Signature::new(
                FaultClass::None,
                format!("exited 0 (it printed, and survived: {})", f.summary),
            )
        }
        (Some(f), _) => f,
        (None, Exit::Timeout) => {
            Signature::new(FaultClass::Hang, "ran past its timeout and was killed")
        }
        (None, Exit::Signal(sig)) => {
            let mut s = Signature::new(
                FaultClass::Signal,
                format!("killed by {}", signal_name(sig)),
            );
            s.detail = Some(signal_name(sig));
            s
        }
        (None, Exit::Code(0)) => Signature::new(FaultClass::None, "exited 0"),
        (None, Exit::Code(code @ (126 | 127))) if cannot_start(&lines).is_some() => {
            // The shell could not start the program: the machine's failure (as a spawn that fails),
            // never the commit's.
            let line = cannot_start(&lines).unwrap_or_default();
            Signature::new(
                FaultClass::ExecFailure,
                format!("the command could not start (exit {code}): {line}"),
            )
        }
        (None, Exit::Code(code @ (4 | 5))) if pytest_ran_nothing(&lines).is_some() => {
            // pytest selected no test (a test id this commit does not have, a usage error): the
            // commit was never tried, so it says nothing about the fault.
            let line = pytest_ran_nothing(&lines).unwrap_or_default();
            Signature::new(
                FaultClass::ExecFailure,
                format!("the repro ran no test (pytest exit {code}): {line}"),
            )
        }
        (None, Exit::Code(code)) => other(code, &context),
        (None, Exit::Unknown) => match &context.exception {
            Some(e) => Signature::new(FaultClass::Other, e.clone()),
            None => Signature::new(FaultClass::None, "no failure found in the log"),
        },
    };
    if signature.class != FaultClass::None {
        context.fill(&mut signature, &lines);
    }
    signature
}

/// Whether an infrastructure line is the host ending the job (Slurm, or cudabisect's line for it).
fn host_ended(line: &str) -> bool {
    let line = line.trim_start();
    line.starts_with("slurmstepd")
        || line.starts_with("srun: ")
        || line.starts_with("[cudabisect] slurm")
}

/// The shell's or `env`'s line saying a program could not be started (not found, not executable), among
/// the last lines of a run that exited 126 or 127.
fn cannot_start<'a>(lines: &[&'a str]) -> Option<&'a str> {
    static CANNOT_START: LazyLock<Regex> = LazyLock::new(|| {
        Regex::new(
            r"(?:: (?:command )?not found|: No such file or directory|: Permission denied|: cannot execute(?: binary file)?(?::.*)?|: Exec format error|: bad interpreter: .*)\s*$",
        )
        .expect("built-in pattern compiles")
    });
    lines
        .iter()
        .rev()
        .take(5)
        .map(|l| l.trim())
        .find(|l| CANNOT_START.is_match(l))
}

/// pytest's line saying it ran no test: nothing collected (exit 5), a test id or file it could not
/// find, or a usage error (exit 4).
fn pytest_ran_nothing<'a>(lines: &[&'a str]) -> Option<&'a str> {
    static NOTHING: LazyLock<Regex> = LazyLock::new(|| {
        Regex::new(
            r"^(?:=+ no tests ran(?: in [\d.]+m?s)? =+|ERROR: (?:file or directory )?not found: .+|ERROR: usage: .+|pytest: error: .+)$",
        )
        .expect("built-in pattern compiles")
    });
    lines
        .iter()
        .rev()
        .take(20)
        .map(|l| l.trim())
        .find(|l| NOTHING.is_match(l))
}

fn other(code: i32, context: &Context) -> Signature {
    let what = context
        .panic
        .clone()
        .or_else(|| context.exception.clone())
        .or_else(|| context.last_line.clone());
    let summary = match what {
        Some(w) => format!("exited {code}: {w}"),
        None => format!("exited {code}"),
    };
    Signature::new(FaultClass::Other, summary)
}

/// Facts read from the whole log that refine any finding: traceback frames, harness markers, framework.
#[derive(Default)]
struct Context {
    user_frame: Option<String>,
    /// The innermost user frame as `path:function`.
    launch: Option<String>,
    /// The user frames of the first traceback, outermost first, with their source lines.
    stack: Vec<String>,
    /// The first exception's type name.
    exception_type: Option<String>,
    exception: Option<String>,
    panic: Option<String>,
    last_line: Option<String>,
    /// The nodes whose begin marker has no end yet, outermost first, with the kernel each names: the
    /// one it launched last when the harness said, else its marker's.
    open_nodes: Vec<(String, String)>,
}

impl Context {
    fn read(lines: &[&str]) -> Self {
        let mut ctx = Context::default();
        let mut in_first_traceback = false;
        let mut traceback_done = false;
        for (i, line) in lines.iter().enumerate() {
            let trimmed = line.trim_end();
            if trimmed.starts_with("Traceback (most recent call last)") {
                in_first_traceback = !traceback_done;
                if in_first_traceback {
                    ctx.stack.clear();
                }
            } else if let Some(c) = PY_FRAME.captures(trimmed) {
                if in_first_traceback && is_user_path(&c["path"]) {
                    ctx.user_frame = Some(format!("{}:{}", &c["path"], &c["line"]));
                    ctx.launch = Some(format!("{}:{}", &c["path"], c["func"].trim()));
                    // The source line Python prints under the frame, when it does.
                    let source = lines
                        .get(i + 1)
                        .map(|l| l.trim())
                        .filter(|l| {
                            !l.is_empty() && !l.starts_with("File \"") && !l.starts_with('^')
                        })
                        .unwrap_or("");
                    ctx.stack.push(format!(
                        "{}:{} in {}: {source}",
                        &c["path"],
                        &c["line"],
                        c["func"].trim()
                    ));
                }
            } else if let Some(c) = PY_EXCEPTION.captures(trimmed).or_else(|| {
                in_first_traceback
                    .then(|| PY_TRACEBACK_END.captures(trimmed))
                    .flatten()
            }) {
                if in_first_traceback {
                    in_first_traceback = false;
                    traceback_done = true;
                }
                if ctx.exception.is_none() && !c["name"].ends_with("Warning") {
                    ctx.exception = Some(clip(trimmed));
                    ctx.exception_type = Some(c["name"].to_string());
                }
            } else if let Some(kernel) = crate::marker::parse_launch(trimmed) {
                // The kernel a node launched last beats the node's own label (an op, a module).
                if let Some(open) = ctx.open_nodes.last_mut() {
                    open.1 = kernel.to_string();
                }
            } else if let Some(m) = Marker::parse(trimmed) {
                // Markers nest when a harness descends into a module: an end closes its own node and
                // whatever opened inside it, so the innermost open node is the one that died.
                match m.phase {
                    // A label of the node's module or op is not a kernel: only a launch line names one.
                    MarkerPhase::Begin => ctx.open_nodes.push((
                        m.node.to_string(),
                        if crate::marker::names_a_kernel(m.op, m.kernel) {
                            m.kernel.to_string()
                        } else {
                            String::new()
                        },
                    )),
                    MarkerPhase::End => {
                        if let Some(i) = ctx.open_nodes.iter().rposition(|(n, _)| n == m.node) {
                            ctx.open_nodes.truncate(i);
                        }
                    }
                }
            } else if let Some(c) = RUST_PANIC.captures(trimmed) {
                ctx.panic
                    .get_or_insert_with(|| format!("panicked at {}", &c["site"]));
            }
            if !trimmed.trim().is_empty() && !trimmed.starts_with("exit=") {
                ctx.last_line = Some(clip(trimmed.trim()));
            }
        }
        ctx
    }

    fn fill(&self, s: &mut Signature, lines: &[&str]) {
        if let Some((node, kernel)) = self.open_nodes.last() {
            if !kernel.is_empty() {
                s.kernel.get_or_insert_with(|| kernel.clone());
            }
            s.site.get_or_insert_with(|| format!("node {node}"));
        }
        if s.kernel.is_none() && s.class.is_device_fault() {
            s.kernel = triton_launch_kernel(lines);
        }
        if let Some(frame) = &self.user_frame {
            s.site.get_or_insert_with(|| frame.clone());
        }
        if s.launch.is_none() {
            s.launch = self.launch.clone();
        }
        if s.exception.is_none() {
            s.exception = self.exception_type.clone();
        }
        if s.stack.is_empty() {
            s.stack = self.stack.clone();
        }
        if s.framework.is_none() {
            s.framework = detect_framework(lines.iter().copied());
        }
        if s.detail.is_none() && s.class.is_device_fault() {
            s.detail = xla_executable(lines);
        }
    }
}

static XLA_EXECUTABLE: LazyLock<Regex> =
    LazyLock::new(|| Regex::new(r"\[executable_name='([^']+)'\]").expect("valid regex"));

/// The XLA executable a JAX device fault was raised from (`[executable_name='jit_train_step']`). It is
/// detail, not the kernel: one executable holds every kernel of a jitted function, as a shared launch
/// wrapper does, so two bugs in one executable must not read as one.
fn xla_executable(lines: &[&str]) -> Option<String> {
    lines
        .iter()
        .find_map(|l| XLA_EXECUTABLE.captures(l))
        .map(|c| format!("XLA executable {}", &c[1]))
}

/// The Triton kernel a device fault died in, when a launch hook named every Triton launch
/// (`@@cudabisect launch kernel=…`, printed by the warm probe runner and the harness) and the traceback
/// runs through Triton's launcher: under synchronous launch the last kernel named is the one that faulted.
/// A fault raised elsewhere (a torch op after a Triton launch) names none this way.
fn triton_launch_kernel(lines: &[&str]) -> Option<String> {
    let through_triton = lines.iter().any(|l| {
        let l = l.trim_start();
        l.starts_with("File \"")
            && (l.contains("/triton/runtime/") || l.contains("/triton/backends/"))
    }) || lines.iter().any(|l| l.contains("Triton Error [CUDA]"));
    if !through_triton {
        return None;
    }
    lines
        .iter()
        .rev()
        .find_map(|l| crate::marker::parse_launch(l))
        .map(str::to_string)
}

/// A frame is the user's when it is not inside an installed package, the standard library, Cython code or
/// an installed command's entry script (`venv/bin/torchrun`: a launcher's frame would make every
/// multi-rank failure share one site).
fn is_user_path(path: &str) -> bool {
    !(path.contains("site-packages/")
        || path.contains("/bin/")
        || path.contains("dist-packages/")
        || path.contains("/lib/python3")
        || path.starts_with('<')
        || path.ends_with(".pyx"))
}

fn first_text_finding(lines: &[&str]) -> Option<Signature> {
    let mut after_frame = false;
    let mut generic: Option<Signature> = None;
    for line in lines {
        let quoted_source = after_frame && line.starts_with(char::is_whitespace);
        after_frame = PY_FRAME.is_match(line);
        if quoted_source || line.starts_with("exit=") {
            continue;
        }
        if let Some(c) = ASSERT_LINE.captures(line) {
            let mut s = Signature::new(FaultClass::DeviceAssert, clip(line.trim()));
            s.site = Some(format!("{}:{}", &c["file"], &c["line"]));
            s.kernel = c
                .name("func")
                .map(|f| strip_template_clause(f.as_str()))
                .filter(|f| !f.trim().is_empty())
                .map(|f| short_kernel_name(&f));
            s.detail = Some(match c.name("expr") {
                Some(e) => format!("Assertion `{}` failed", e.as_str()),
                None => "Assertion failed".into(),
            });
            s.framework = detect_framework(std::iter::once(*line));
            return Some(s);
        }
        if let Some(mut s) = classify_line(line) {
            if s.class == FaultClass::Other {
                // A `CUDA error:` line no rule knows: a device fault later in the output is the one to
                // name; this one is kept when none follows (what follows it is usually its fallout).
                generic.get_or_insert(s);
                continue;
            }
            if generic.is_some() && !s.class.is_device_fault() {
                continue;
            }
            if is_fallout(&s) {
                // A peer's collective error or a closed connection is printed first when another rank
                // faulted: a device fault later in the output is the cause.
                if let Some(cause) = lines
                    .iter()
                    .skip_while(|l| *l != line)
                    .skip(1)
                    .filter_map(|l| classify_line(l))
                    .find(|f| f.class.is_device_fault())
                {
                    return Some(cause);
                }
            }
            if s.class.is_device_fault() && s.kernel.is_none() {
                s.kernel = launch_frame_kernel(lines);
            }
            return Some(s);
        }
    }
    generic
}

/// Errors other ranks print because one rank faulted: never the cause while a device fault follows.
fn is_fallout(s: &Signature) -> bool {
    s.class == FaultClass::Nccl
}

/// Drops a `[with T = …]` template clause from a demangled signature.
fn strip_template_clause(func: &str) -> String {
    match func.find(" [with ") {
        Some(i) => func[..i].to_string(),
        None => func.to_string(),
    }
}

/// The kernel named by a debugger's frame `… k<float>(int*)<<<(grid),(block)>>> (…)`, if any line has one.
fn launch_frame_kernel(lines: &[&str]) -> Option<String> {
    lines.iter().find_map(|l| {
        let c = LAUNCH_FRAME.captures(l)?;
        let func = c["func"].trim().trim_start_matches("0x").trim();
        // "0x0000000000c8c6a0 in void k<float>(…)" keeps what follows " in ".
        let func = func.rsplit_once(" in ").map_or(func, |(_, f)| f);
        let name = short_kernel_name(func);
        (!name.is_empty()).then_some(name)
    })
}

fn classify_line(line: &str) -> Option<Signature> {
    let class = RULES
        .iter()
        .find(|r| r.regex.is_match(line))
        .map(|r| r.class)
        .or_else(|| {
            // "Cuda failure 700 '…'" and "(error 716)" name the code only.
            let code = CUDA_FAILURE_CODE
                .captures(line)?
                .iter()
                .skip(1)
                .flatten()
                .next()?
                .as_str()
                .parse()
                .ok()?;
            FaultClass::ALL
                .into_iter()
                .find(|c| c.cuda_code() == Some(code))
        });
    let mut s = match class {
        Some(class) => Signature::new(class, clip(line.trim())),
        None => {
            GENERIC_CUDA_ERROR.captures(line)?;
            Signature::new(FaultClass::Other, clip(line.trim()))
        }
    };
    if let Some(name) = CODE_NAME.captures(line).map(|c| c[1].to_string()) {
        if let Some(&(_, _, code, _)) = CODE_NAMES
            .iter()
            .find(|(d, r, ..)| *d == name || *r == name)
        {
            s.code = Some(code);
        }
        s.code_name = Some(name);
    }
    if s.class == FaultClass::Nccl {
        s.detail = RANK.captures(line).map(|c| format!("rank {}", &c[1]));
    }
    if s.class == FaultClass::Signal {
        s.detail = Some(
            if line.contains("Segmentation fault") || line.contains("SIGSEGV") {
                "SIGSEGV"
            } else if line.contains("Abort") || line.contains("SIGABRT") {
                "SIGABRT"
            } else if line.contains("Bus error") || line.contains("SIGBUS") {
                "SIGBUS"
            } else if line.contains("Floating point") || line.contains("SIGFPE") {
                "SIGFPE"
            } else if line.contains("Killed") || line.contains("SIGKILL") {
                "SIGKILL"
            } else {
                "signal"
            }
            .to_string(),
        );
    }
    s.framework = detect_framework(std::iter::once(line));
    Some(s)
}

/// Names the framework from its fingerprints, most specific first.
fn detect_framework<'a>(lines: impl Iterator<Item = &'a str> + Clone) -> Option<String> {
    static FINGERPRINTS: LazyLock<Vec<(&str, Regex)>> = LazyLock::new(|| {
        [
            ("cudabisect-harness", r"^@@cudabisect "),
            ("triton", r"Triton Error|site-packages/triton/"),
            ("nccl", r"NCCL error|\bnccl[A-Z]\w+Error\b|NCCL WARN|ProcessGroupNCCL"),
            ("pytorch", r"\btorch\.\w*(Error|Exception)\b|site-packages/torch/|/pytorch/|\bc10::|TORCH_USE_CUDA_DSA"),
            ("jax", r"jax\.errors|JaxRuntimeError|XlaRuntimeError|jaxlib"),
            ("tensorflow", r"tensorflow/|stream_executor"),
            ("cupy", r"cupy_backends|\bcupy\."),
            ("cublas", r"CUBLAS_STATUS_"),
            ("cudnn", r"CUDNN_STATUS_|cuDNN error"),
            ("cudarc", r"DriverError\("),
            ("cuda-runtime", r"\bcudaError[A-Z]\w+"),
            ("cuda-driver", r"\bCUDA_ERROR_[A-Z_]+"),
        ]
        .into_iter()
        .map(|(name, p)| (name, Regex::new(p).expect("pattern")))
        .collect()
    });
    FINGERPRINTS
        .iter()
        .find(|(_, re)| lines.clone().any(|l| re.is_match(l)))
        .map(|(name, _)| name.to_string())
}

fn clip(line: &str) -> String {
    const MAX: usize = 240;
    if line.chars().count() <= MAX {
        line.to_string()
    } else {
        let cut: String = line.chars().take(MAX).collect();
        format!("{cut}…")
    }
}

/// The conventional name of a signal number (SIGSEGV), or `signal N`.
pub fn signal_name(sig: i32) -> String {
    let name = match sig {
        1 => "SIGHUP",
        2 => "SIGINT",
        3 => "SIGQUIT",
        4 => "SIGILL",
        5 => "SIGTRAP",
        6 => "SIGABRT",
        7 => "SIGBUS",
        8 => "SIGFPE",
        9 => "SIGKILL",
        11 => "SIGSEGV",
        13 => "SIGPIPE",
        14 => "SIGALRM",
        15 => "SIGTERM",
        _ => return format!("signal {sig}"),
    };
    name.to_string()
}

#[cfg(test)]
mod tests {
    use super::*;
    use classify_stream as classify;

    #[test]
    fn slurm_ending_a_job_is_infrastructure_and_a_cancel_by_the_user_is_not() {
        for line in [
            "slurmstepd-node7: error: StepId=2.batch exceeded memory limit (644714496 > 104857600), being killed",
            "slurmstepd: error: *** JOB 41 ON gpu-3 CANCELLED AT 2026-11-30T03:00:08 DUE TO TIME LIMIT ***",
            "slurmstepd: error: *** JOB 41 ON gpu-3 CANCELLED AT 2026-11-30T03:00:08 DUE TO NODE FAILURE ***",
            "[cudabisect] slurm job 41 on gpu-3: NODE_FAIL (NodeDown)",
            "[cudabisect] slurm job 42 on no node: STUCK in the queue for 3600 s (ReqNodeNotAvail)",
            "srun: error: Unable to create step for job 42: Job/step already completing or completed",
            "srun: error: Node failure on gpu-3",
            "[cudabisect] slurm job 43 on no node: ENDED before it started (CANCELLED, None)",
            "[cudabisect] slurm job 44 on gpu-3: LOST (PENDING) (BeginTime)",
        ] {
            assert_eq!(classify(Exit::Code(0), line).class, FaultClass::Infra, "{line}");
        }
        let cancelled =
            "slurmstepd: error: *** JOB 41 ON gpu-3 CANCELLED AT 2026-11-30T03:00:08 ***";
        assert_ne!(classify(Exit::Code(1), cancelled).class, FaultClass::Infra);
    }

    #[test]
    fn a_traceback_ends_in_a_failure_whatever_its_exception_is_called() {
        for (last, name) in [
            ("triton.runtime.errors.OutOfResources: out of resource: shared memory, Required: 131072, Hardware limit: 101376.", "triton.runtime.errors.OutOfResources"),
            ("StopIteration", "StopIteration"),
        ] {
            let log = format!("Traceback (most recent call last):\n  File \"t.py\", line 3, in <module>\n    step()\n{last}\n");
            let sig = classify(Exit::Unknown, &log);
            assert_eq!(sig.class, FaultClass::Other, "{log}");
            assert_eq!(sig.exception.as_deref(), Some(name), "{log}");
        }
        // Outside a traceback, a bare word is not an exception.
        let sig = classify(Exit::Code(0), "Epoch: 3\nDone\n");
        assert_eq!(sig.class, FaultClass::None);
    }

    #[test]
    fn a_signal_the_shell_or_torchrun_reports_is_a_signal_never_no_failure() {
        for log in [
            "Floating point exception (core dumped)",
            "Illegal instruction (core dumped)",
            "ERROR: Unexpected bus error encountered in worker. This might be caused by insufficient shared memory (shm).",
            "RuntimeError: DataLoader worker (pid 12345) is killed by signal: Bus error. It is possible that dataloader's workers are out of shared memory.",
            "./run.sh: line 3:  1234 Segmentation fault      (core dumped) python train.py",
            "run.sh: line 3: 1234 Aborted                 (core dumped) python train.py",
            "F1203 10:00:00.000000 1234 gpu_event_mgr.cc:220] Unexpected Event status: 1\n*** Check failure stack trace: ***",
            "*** SIGSEGV received at time=1700000000 on cpu 3 ***\nPC: @     0x7f0000000000  (unknown)",
        ] {
            assert_eq!(
                classify(Exit::Unknown, log).class,
                FaultClass::Signal,
                "{log}"
            );
        }
        // torchrun's report of the rank that failed first, read whole (the launcher's block).
        let killed = "torch.distributed.elastic.multiprocessing.errors.ChildFailedError:\ntrain.py FAILED\nRoot Cause (first observed failure):\n[0]:\n  rank      : 0 (local_rank: 0)\n  exitcode  : -11 (pid: 1234)\n  traceback : Signal 11 (SIGSEGV) received by PID 1234\n";
        let sig = crate::classify::classify(Exit::Unknown, killed);
        assert_eq!(
            (sig.class, sig.rank),
            (FaultClass::Signal, Some(0)),
            "{sig:?}"
        );
        let failed = killed.replace("exitcode  : -11", "exitcode  : 1");
        let sig = crate::classify::classify(Exit::Unknown, &failed);
        assert_eq!(sig.class, FaultClass::Other, "{sig:?}");
    }

    #[test]
    fn a_check_against_cuda_success_names_the_code_it_got() {
        let log = "2021-01-01 00:00:00.000000: F tensorflow/core/kernels/gather_functor_gpu.cu.h:123] Check failed: err == cudaSuccess (700 vs. 0)";
        assert_eq!(
            classify(Exit::Unknown, log).class,
            FaultClass::IllegalAddress
        );
    }

    #[test]
    fn no_usable_gpu_is_the_machines_failure_in_every_frameworks_words() {
        for line in [
            "jaxlib.xla_extension.XlaRuntimeError: FAILED_PRECONDITION: No visible GPU devices.",
            "RuntimeError: Unable to initialize backend 'cuda': FAILED_PRECONDITION: No visible GPU devices. (you may need to uninstall the failing plugin package, or set JAX_PLATFORMS=cpu to skip this backend.)",
            "RuntimeError: CUDA driver initialization failed, you might not have a CUDA gpu.",
        ] {
            assert_eq!(classify(Exit::Code(1), line).class, FaultClass::Infra, "{line}");
        }
    }

    #[test]
    fn a_pytest_run_that_selected_no_test_says_nothing_about_the_commit() {
        for (code, log) in [
            (5, "============================ no tests ran in 0.01s ============================="),
            (4, "ERROR: not found: /w/tests/test_step.py::test_new\n(no match in any of [<Module test_step.py>])"),
            (4, "ERROR: file or directory not found: tests/test_new.py"),
        ] {
            let sig = classify(Exit::Code(code), &format!("collecting ...\n{log}\n"));
            assert_eq!(sig.class, FaultClass::ExecFailure, "{log}");
            assert!(sig.summary.contains("ran no test"), "{}", sig.summary);
        }
        // A test that ran and failed is the program's outcome, whatever the code.
        let failed =
            "FAILED tests/test_step.py::test_step - RuntimeError: boom\n=== 1 failed in 0.10s ===";
        assert_ne!(
            classify(Exit::Code(1), failed).class,
            FaultClass::ExecFailure
        );
        assert_ne!(
            classify(Exit::Code(5), "exited with 5 by itself").class,
            FaultClass::ExecFailure
        );
    }

    #[test]
    fn a_program_the_shell_could_not_start_is_the_machines_failure() {
        for (code, log) in [
            (127, "sh: 1: python: not found"),
            (127, "bash: line 1: python: command not found"),
            (127, "./repro.sh: 3: exec: python-missing: not found"),
            (127, "/usr/bin/env: 'python': No such file or directory"),
            (126, "sh: 1: ./repro.sh: Permission denied"),
            (
                126,
                "bash: ./tool: cannot execute binary file: Exec format error",
            ),
            (
                126,
                "sh: ./run.py: /opt/venv/bin/python: bad interpreter: No such file or directory",
            ),
        ] {
            let sig = classify(Exit::Code(code), &format!("starting\n{log}\n"));
            assert_eq!(sig.class, FaultClass::ExecFailure, "{log}");
            assert!(sig.summary.contains("could not start"), "{}", sig.summary);
        }
        // The same exit status from the program itself, or a fault before it, is not the machine's.
        assert_eq!(
            classify(Exit::Code(127), "done, exiting 127").class,
            FaultClass::Other
        );
        assert_eq!(
            classify(Exit::Code(127), "sh: 1: python: not found\nRuntimeError: CUDA error: an illegal memory access was encountered").class,
            FaultClass::IllegalAddress
        );
        assert_eq!(
            classify(Exit::Code(1), "sh: 1: python: not found").class,
            FaultClass::Other
        );
    }

    #[test]
    fn infrastructure_is_claimed_only_on_real_infrastructure_errors() {
        for clean in [
            "preflight: Xid events: 0, retired pages: 0",
            "db: committed transaction xid 4242",
            "cuInit ok (0 errors)",
            "checked for uncorrectable ECC error: none",
            "nvidia-smi has failed? no, it worked",
        ] {
            assert_eq!(
                classify(Exit::Code(0), clean).class,
                FaultClass::None,
                "{clean}"
            );
            assert_ne!(
                classify(Exit::Code(1), clean).class,
                FaultClass::Infra,
                "{clean}"
            );
        }
        let real = [
            "NVRM: Xid (PCI:0000:3b:00): 79, pid=1234, GPU has fallen off the bus.",
            "RuntimeError: CUDA error: CUDA-capable device(s) is/are busy or unavailable",
            "NVIDIA-SMI has failed because it couldn't communicate with the NVIDIA driver.",
            "cuInit failed: CUDA_ERROR_NO_DEVICE",
        ];
        for line in real {
            assert_eq!(
                classify(Exit::Code(1), line).class,
                FaultClass::Infra,
                "{line}"
            );
        }
        // A driver message the program survived (exit 0) is not a failure (K09); the host ending the
        // job is, whatever status the job's shell left.
        assert_eq!(
            classify(
                Exit::Code(0),
                "CUDA driver version is insufficient for feature X (optional), continuing"
            )
            .class,
            FaultClass::None
        );
        assert_eq!(
            classify(
                Exit::Code(0),
                "slurmstepd: error: *** JOB 41 ON gpu-3 CANCELLED AT 2026-11-30T03:00:08 DUE TO TIME LIMIT ***"
            )
            .class,
            FaultClass::Infra
        );
        // A pre-flight line never hides the real fault that follows it.
        let log = "preflight: Xid events: 0\nRuntimeError: CUDA error: an illegal memory access was encountered\n";
        assert_eq!(
            classify(Exit::Code(1), log).class,
            FaultClass::IllegalAddress
        );
    }

    #[test]
    fn random_bytes_are_not_an_infrastructure_failure() {
        let mut x: u64 = 0x2545_f491_4f6c_dd1d;
        let bytes: Vec<u8> = (0..1_000_000)
            .map(|_| {
                x ^= x << 13;
                x ^= x >> 7;
                x ^= x << 17;
                x as u8
            })
            .collect();
        let text = String::from_utf8_lossy(&bytes);
        assert_ne!(classify(Exit::Code(1), &text).class, FaultClass::Infra);
    }

    #[test]
    fn a_traceback_that_quotes_cuda_source_is_not_a_fault() {
        let log = "Traceback (most recent call last):\n  File \"/u/t.py\", line 3, in <module>\n    raise ValueError(\"illegal memory access was encountered? no\")\nValueError: bad shape\n";
        let s = classify(Exit::Code(1), log);
        assert_eq!(s.class, FaultClass::Other);
        assert_eq!(s.site.as_deref(), Some("/u/t.py:3"));
    }

    #[test]
    fn a_mention_of_cuda_in_paths_or_warnings_is_not_a_fault() {
        let log = "  File \"/x/site-packages/torch/cuda/__init__.py\", line 1, in f\nUserWarning: CUDA initialization is slow\nValueError: nope\n";
        assert_eq!(classify(Exit::Code(1), log).class, FaultClass::Other);
    }

    #[test]
    fn the_first_of_two_faults_wins() {
        let log = "RuntimeError: CUDA error: misaligned address\nlater: CUDA error: an illegal memory access was encountered\n";
        let s = classify(Exit::Code(1), log);
        assert_eq!(
            (s.class, s.code),
            (FaultClass::MisalignedAddress, Some(716))
        );
    }

    #[test]
    fn exit_status_decides_when_the_text_says_nothing() {
        assert_eq!(
            classify(Exit::Code(0), "all good\n").class,
            FaultClass::None
        );
        assert_eq!(classify(Exit::Timeout, "waiting\n").class, FaultClass::Hang);
        let s = classify(Exit::Signal(11), "");
        assert_eq!(
            (s.class, s.detail.as_deref()),
            (FaultClass::Signal, Some("SIGSEGV"))
        );
        assert_eq!(classify(Exit::Code(3), "").class, FaultClass::Other);
    }

    #[test]
    fn a_fault_beats_the_signal_that_followed_it() {
        let log = "CUDA error: an illegal memory access was encountered\nterminate called after throwing an instance of 'c10::Error'\n";
        assert_eq!(
            classify(Exit::Signal(6), log).class,
            FaultClass::IllegalAddress
        );
    }

    #[test]
    fn the_user_frames_of_the_traceback_are_kept_with_their_source_lines() {
        let log = "Traceback (most recent call last):\n  File \"/w/repo/train.py\", line 5, in <module>\n    y = forward(x)\n  File \"/w/venv/lib/python3.12/site-packages/torch/nn/modules/module.py\", line 1, in _call_impl\n    return f(x)\n  File \"/w/repo/pkg/ops.py\", line 14, in bias_gelu\n    run(_bias_gelu_kernel, (blocks,), x)\n    ^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^\n  File \"/w/repo/pkg/launch.py\", line 3, in run\n    kernel[grid](*args)\ntorch.AcceleratorError: CUDA error: an illegal memory access was encountered\n";
        let mut s = classify(Exit::Code(1), log);
        s.relativize(std::path::Path::new("/w/repo"));
        assert_eq!(
            s.stack,
            [
                "train.py:5 in <module>: y = forward(x)",
                "pkg/ops.py:14 in bias_gelu: run(_bias_gelu_kernel, (blocks,), x)",
                "pkg/launch.py:3 in run: kernel[grid](*args)",
            ]
        );
        assert_eq!(s.launch.as_deref(), Some("pkg/launch.py:run"));
    }

    #[test]
    fn an_xla_device_fault_names_its_executable_as_detail_not_as_kernel() {
        let log = "Traceback (most recent call last):\n  File \"/w/repo/train.py\", line 9, in <module>\n    step(x)\njax.errors.JaxRuntimeError: INTERNAL: CUDA error: Failed to check stream capturing status: CUDA_ERROR_ILLEGAL_ADDRESS: an illegal memory access was encountered [executable_name='jit_wrapped']\nE1202 01:10:11.123457  12345 gpu_event.cc:40] Error destroying CUDA event: CUDA_ERROR_ILLEGAL_ADDRESS: an illegal memory access was encountered\n";
        let s = classify(Exit::Code(1), log);
        assert_eq!(s.class, FaultClass::IllegalAddress);
        assert_eq!(s.framework.as_deref(), Some("jax"));
        assert_eq!(s.kernel, None);
        assert_eq!(s.detail.as_deref(), Some("XLA executable jit_wrapped"));
        assert_eq!(s.exception.as_deref(), Some("jax.errors.JaxRuntimeError"));
    }

    #[test]
    fn each_rule_names_its_class() {
        let cases = [
            ("CUDA_ERROR_ILLEGAL_INSTRUCTION: an illegal instruction was encountered", FaultClass::IllegalInstruction),
            ("cudaErrorHardwareStackError: hardware stack error", FaultClass::HardwareStackError),
            ("RuntimeError: CUDA error: unspecified launch failure", FaultClass::LaunchFailure),
            ("RuntimeError: CUDA error: CUBLAS_STATUS_EXECUTION_FAILED when calling `cublasSgemm( handle)`", FaultClass::LaunchFailure),
            ("jax.errors.JaxRuntimeError: RESOURCE_EXHAUSTED: Out of memory while trying to allocate", FaultClass::OutOfMemory),
            ("[Rank 3] Watchdog caught collective operation timeout: WorkNCCL(SeqNum=1)", FaultClass::Nccl),
            ("RuntimeError: CUDA error: no CUDA-capable device is detected", FaultClass::Infra),
            ("NVRM: Xid (PCI:0000:3b:00): 79, GPU has fallen off the bus.", FaultClass::Infra),
            ("tensorflow.python.framework.errors_impl.InvalidArgumentError: CheckNumerics: Tensor had NaN values", FaultClass::Nan),
            ("NCCL WARN Cuda failure 700 'an illegal memory access was encountered'", FaultClass::IllegalAddress),
            ("Program hit cudaErrorInvalidValue (error 1) due to \"invalid argument\"", FaultClass::Other),
        ];
        for (line, class) in cases {
            assert_eq!(classify(Exit::Code(1), line).class, class, "{line}");
        }
        let s = classify(
            Exit::Code(1),
            "[Rank 3] Watchdog caught collective operation timeout",
        );
        assert_eq!(s.detail.as_deref(), Some("rank 3"));
    }

    #[test]
    fn harness_markers_name_the_open_node() {
        let log = "@@cudabisect node=emb op=gather kernel=gather_rows begin\n@@cudabisect node=emb op=gather kernel=gather_rows end\n@@cudabisect node=mm op=matmul kernel=matmul_f32 begin\nDriverError(CUDA_ERROR_ILLEGAL_ADDRESS, \"an illegal memory access was encountered\")\n";
        let s = classify(Exit::Code(1), log);
        assert_eq!(s.kernel.as_deref(), Some("matmul_f32"));
        assert_eq!(s.site.as_deref(), Some("node mm"));
        // Nested markers (a harness descending into a module): the innermost open call is named.
        let nested = "@@cudabisect node=blk op=Block kernel=Block begin\n@@cudabisect node=blk__proj op=Linear kernel=Linear begin\n@@cudabisect node=blk__proj op=Linear kernel=Linear end\n@@cudabisect node=blk__emb op=embedding kernel=embedding begin\nDriverError(CUDA_ERROR_ILLEGAL_ADDRESS, \"an illegal memory access was encountered\")\n";
        let s = classify(Exit::Code(1), nested);
        assert_eq!(s.kernel, None);
        assert_eq!(s.site.as_deref(), Some("node blk__emb"));
        // A module's class or a backward's label is not a kernel: the node names the fault alone.
        for label in [
            "op=Mixer kernel=Mixer",
            "op=pure_callback kernel=pure_callback",
            "op=backward_of_Mixer kernel=Mixer",
            "op=hash_embed kernel=hash_embed.default",
        ] {
            let log = format!("@@cudabisect node=m {label} begin\nRuntimeError: CUDA error: an illegal memory access was encountered\n");
            let s = classify(Exit::Code(1), &log);
            assert_eq!(s.kernel, None, "{label}");
            assert_eq!(s.site.as_deref(), Some("node m"), "{label}");
            assert_eq!(s.short(), "illegal_address (700) at node m");
        }
        // The kernel the open node launched last names the fault, not the node's label; a launch in a
        // node that ended does not.
        let launched = "@@cudabisect node=a op=x kernel=x begin\n@@cudabisect launch kernel=early\n@@cudabisect node=a op=x kernel=x end\n@@cudabisect node=hash_embed_default op=hash_embed kernel=hash_embed.default begin\n@@cudabisect launch kernel=_hash_embed_kernel\nRuntimeError: Triton Error [CUDA]: an illegal memory access was encountered\n";
        let s = classify(Exit::Code(1), launched);
        assert_eq!(s.kernel.as_deref(), Some("_hash_embed_kernel"));
        assert_eq!(s.site.as_deref(), Some("node hash_embed_default"));
    }
}
