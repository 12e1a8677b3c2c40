//! The signature type: a closed set of fault classes with stable JSON names, and the details found with them.

use serde::{Deserialize, Serialize};

/// How a run ended, as far as the classifier cares.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case", tag = "kind", content = "value")]
pub enum Exit {
    /// The process exited with this status.
    Code(i32),
    /// The process was killed by this signal.
    Signal(i32),
    /// The process ran past its timeout and was killed.
    Timeout,
    /// The status is unknown (a saved log without one).
    Unknown,
}

/// The fault classes. Their JSON names are part of the report format.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize, PartialOrd, Ord)]
#[serde(rename_all = "snake_case")]
pub enum FaultClass {
    /// CUDA error 700: a load or store to an address no allocation covers.
    IllegalAddress,
    /// CUDA error 716.
    MisalignedAddress,
    /// CUDA error 717: a generic pointer used in the wrong address space.
    InvalidAddressSpace,
    /// CUDA error 719: a kernel died (`__trap()`, or any fault under compute-sanitizer).
    LaunchFailure,
    /// CUDA error 710: a device-side `assert` failed.
    DeviceAssert,
    /// CUDA error 715.
    IllegalInstruction,
    /// CUDA error 714.
    HardwareStackError,
    /// An allocation failed.
    OutOfMemory,
    /// Tensors on different devices met in one op.
    DeviceMismatch,
    /// NCCL errors and collective watchdog timeouts.
    Nccl,
    /// NaN or Inf caught by anomaly mode or numeric checks.
    Nan,
    /// A data race reported by the sanitizer.
    Race,
    /// A read of uninitialised device memory reported by the sanitizer.
    UninitializedRead,
    /// Killed by a signal with no GPU fault seen.
    Signal,
    /// Ran past its timeout.
    Hang,
    /// The build step failed.
    BuildFailure,
    /// The machine, not the code: no device, driver mismatch, device busy or lost, ECC, Xid.
    Infra,
    /// The repro or build could not be started at all (a missing interpreter, an exec failure).
    ExecFailure,
    /// The commit cannot be checked out: its objects are missing from this clone.
    MissingObject,
    /// Failed in a way no pattern recognises.
    Other,
    /// Ran clean.
    None,
}

impl FaultClass {
    /// Every class, in declaration order.
    pub const ALL: [FaultClass; 21] = [
        Self::IllegalAddress,
        Self::MisalignedAddress,
        Self::InvalidAddressSpace,
        Self::LaunchFailure,
        Self::DeviceAssert,
        Self::IllegalInstruction,
        Self::HardwareStackError,
        Self::OutOfMemory,
        Self::DeviceMismatch,
        Self::Nccl,
        Self::Nan,
        Self::Race,
        Self::UninitializedRead,
        Self::Signal,
        Self::Hang,
        Self::BuildFailure,
        Self::Infra,
        Self::ExecFailure,
        Self::MissingObject,
        Self::Other,
        Self::None,
    ];

    /// The stable identifier used in JSON and in messages.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::IllegalAddress => "illegal_address",
            Self::MisalignedAddress => "misaligned_address",
            Self::InvalidAddressSpace => "invalid_address_space",
            Self::LaunchFailure => "launch_failure",
            Self::DeviceAssert => "device_assert",
            Self::IllegalInstruction => "illegal_instruction",
            Self::HardwareStackError => "hardware_stack_error",
            Self::OutOfMemory => "out_of_memory",
            Self::DeviceMismatch => "device_mismatch",
            Self::Nccl => "nccl",
            Self::Nan => "nan",
            Self::Race => "race",
            Self::UninitializedRead => "uninitialized_read",
            Self::Signal => "signal",
            Self::Hang => "hang",
            Self::BuildFailure => "build_failure",
            Self::Infra => "infra",
            Self::ExecFailure => "exec_failure",
            Self::MissingObject => "missing_object",
            Self::Other => "other",
            Self::None => "none",
        }
    }

    /// The CUDA error code that this class stands for, when there is exactly one.
    pub fn cuda_code(self) -> Option<u32> {
        match self {
            Self::IllegalAddress => Some(700),
            Self::DeviceAssert => Some(710),
            Self::HardwareStackError => Some(714),
            Self::IllegalInstruction => Some(715),
            Self::MisalignedAddress => Some(716),
            Self::InvalidAddressSpace => Some(717),
            Self::LaunchFailure => Some(719),
            _ => None,
        }
    }

    /// True for the device faults that poison a CUDA context (the family a bisection usually hunts).
    pub fn is_device_fault(self) -> bool {
        self.cuda_code().is_some()
    }
}

impl std::fmt::Display for FaultClass {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// A class plus the stable details that tell two bugs of one class apart.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Signature {
    /// The fault class.
    pub class: FaultClass,
    /// The CUDA error code, when printed or implied.
    pub code: Option<u32>,
    /// The CUDA error name as printed (`CUDA_ERROR_ILLEGAL_ADDRESS`, `cudaErrorIllegalAddress`).
    pub code_name: Option<String>,
    /// The faulting kernel, when known.
    pub kernel: Option<String>,
    /// Where it happened: a kernel source line, an assertion's file:line, or the first user frame.
    pub site: Option<String>,
    /// The framework that reported it (pytorch, triton, cupy, jax, tensorflow, nccl, cudarc, cuda-runtime, …).
    pub framework: Option<String>,
    /// Extra detail: assertion text, signal name, NCCL rank, sanitizer access.
    pub detail: Option<String>,
    /// The launch site: the innermost frame of the user's own code, as `path:function` (the path relative to
    /// the checkout once [`Signature::relativize`] ran; no line number, since lines move between commits).
    #[serde(default)]
    pub launch: Option<String>,
    /// The exception type, for failures a Python exception reports (`ValueError`, `torch.AcceleratorError`).
    #[serde(default)]
    pub exception: Option<String>,
    /// The rank that faulted first, for a multi-rank run. Recorded, not compared: which rank meets a
    /// data-dependent fault is not the bug's identity.
    #[serde(default)]
    pub rank: Option<u32>,
    /// Every frame of the user's own code in the failure's traceback, outermost first, as
    /// `path:line in function: source line` (paths relative to the checkout once
    /// [`Signature::relativize`] ran). Not compared: it lets a run recognise a fault stack it has already
    /// had settled by the sanitizer.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub stack: Vec<String>,
    /// One line saying what happened.
    pub summary: String,
}

impl Signature {
    /// A signature of `class` with only a summary.
    pub fn new(class: FaultClass, summary: impl Into<String>) -> Self {
        Self {
            class,
            code: class.cuda_code(),
            code_name: None,
            kernel: None,
            site: None,
            framework: None,
            detail: None,
            launch: None,
            exception: None,
            rank: None,
            stack: Vec::new(),
            summary: summary.into(),
        }
    }

    /// Makes the paths in `site` and `launch` relative to `root` (the probe worktree), so that the same
    /// place reads the same whichever checkout ran it.
    pub fn relativize(&mut self, root: &std::path::Path) {
        let root = root.display().to_string();
        let root = root.trim_end_matches('/');
        let strip = |v: &mut String| {
            if let Some(rest) = v.strip_prefix(root).and_then(|r| r.strip_prefix('/')) {
                *v = rest.to_string();
            }
        };
        for v in [&mut self.site, &mut self.launch].into_iter().flatten() {
            strip(v);
        }
        self.stack.iter_mut().for_each(strip);
    }

    /// The JSON object `classify --json` prints: the fixed keys, absent ones null (`rank` only for
    /// multi-rank output).
    pub fn to_classify_json(&self) -> serde_json::Value {
        serde_json::json!({
            "class": self.class.as_str(),
            "code": self.code,
            "kernel": self.kernel,
            "site": self.site,
            "framework": self.framework,
            "rank": self.rank,
            "summary": self.summary,
        })
    }

    /// A short human form: `illegal_address (700) in kernel gather at model.cu:12`.
    pub fn short(&self) -> String {
        let mut out = self.class.as_str().to_string();
        if let Some(code) = self.code {
            out.push_str(&format!(" ({code})"));
        }
        if let Some(kernel) = &self.kernel {
            out.push_str(&format!(" in {kernel}"));
        }
        if let Some(site) = &self.site {
            out.push_str(&format!(" at {site}"));
        }
        if let Some(rank) = self.rank {
            out.push_str(&format!(" on rank {rank}"));
        }
        out
    }
}
