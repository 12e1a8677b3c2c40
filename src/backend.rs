//! The harness backend choice: one enum for the config, the command line, the harness and the reports.

/// Which backend runs the nodes: one enum for the config, the command line and the harness.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, serde::Deserialize, serde::Serialize)]
#[serde(rename_all = "lowercase")]
pub enum BackendChoice {
    /// The CUDA driver, through NVRTC-compiled kernels.
    Cuda,
    /// The bounds-checked CPU reference.
    Cpu,
    /// CUDA when a driver, a device and NVRTC are present, else the CPU reference.
    #[default]
    Auto,
}

impl BackendChoice {
    /// The name the config and the command line use.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Cuda => "cuda",
            Self::Cpu => "cpu",
            Self::Auto => "auto",
        }
    }
}
