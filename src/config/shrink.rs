//! `[shrink]`: the harness that describes the model and runs parts of it, and the checks that keep its
//! keys consistent for each shipped harness.

use std::collections::BTreeMap;
use std::time::Duration;

use serde::Deserialize;

use crate::backend::BackendChoice;

use super::values::{one, timeout, yes, CommandLine};

fn default_shrink_timeout() -> Duration {
    Duration::from_secs(300)
}

fn default_confirm() -> u32 {
    5
}

fn default_python() -> String {
    "python3".into()
}

/// `[shrink]`: the harness that can describe the model and run parts of it (the harness protocol).
#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "kebab-case")]
pub struct ShrinkSection {
    /// Shrink at the end of `start`.
    #[serde(default = "yes")]
    pub enabled: bool,
    /// A command speaking the harness protocol (`… describe`, `… run`, `… extract`).
    pub harness: Option<CommandLine>,
    /// The native harness on this model file (relative to the repository root); or, with `inputs`, the
    /// PyTorch harness on this model factory (`package.module:build`).
    pub model: Option<String>,
    /// The factory of the example inputs (`package.module:example_inputs`): for the PyTorch harness the
    /// model's inputs; for `framework = "jax"` the function's arguments; for `"keras"` the model's
    /// inputs (with `train`, its `(x, y)` batch).
    pub inputs: Option<String>,
    /// Which shipped harness the factories speak to: `torch` (the default), `jax` (a JAX function,
    /// split into the equations of its jaxpr) or `keras` (a Keras 3 model, split into its layers).
    #[serde(default)]
    pub framework: ShrinkFramework,
    /// `framework = "jax"`: the function to shrink (`package.module:train_step`), called with the
    /// example inputs. A training step is shrunk through its forward, backward and update equations.
    pub function: Option<String>,
    /// The PyTorch harness: shrink the whole training step (forward, loss, backward and, with
    /// `optimizer`, the update), not the forward pass alone. Left out, the training step is shrunk when
    /// the fault was met in the backward, loss or optimizer phase; `false` is never overridden.
    #[serde(default)]
    pub train: Option<bool>,
    /// The PyTorch harness with factories: the loss (`package.module:loss`, the model's output -> a
    /// scalar; default the sum of the outputs). Implies `train`.
    pub loss: Option<String>,
    /// The PyTorch harness with factories: the optimizer's factory (`package.module:make`, the model ->
    /// its optimizer). Implies `train`.
    pub optimizer: Option<String>,
    /// The user's own training step (`package.module:train_step`, called with no arguments): captured
    /// like a training script, in its own process.
    pub step: Option<String>,
    /// Take the model, optimizer and batch from the repro command itself (the default when no model,
    /// harness or step is named).
    #[serde(default)]
    pub capture: bool,
    /// The PyTorch harness: the Python interpreter (default `python3`).
    #[serde(default = "default_python")]
    pub python: String,
    /// The shipped harnesses: the device. Left out, the one the fault happened on: a captured step's
    /// own device, else `cuda` when a GPU is usable and `cpu` when not.
    #[serde(default)]
    pub device: Option<String>,
    /// The PyTorch harness: build the model once in a warm server and fork each run from it, instead of
    /// importing torch and building the model again for every run.
    #[serde(default = "yes")]
    pub warm_start: bool,
    /// The native harness's backend: cuda, cpu or auto.
    #[serde(default)]
    pub backend: BackendChoice,
    /// Time allowed for one harness run.
    #[serde(default = "default_shrink_timeout", deserialize_with = "timeout")]
    pub timeout: Duration,
    /// Runs of a candidate before it counts as not reproducing (for faults that do not show every time).
    #[serde(default = "one")]
    pub attempts: u32,
    /// Runs of the minimal subgraph in the final check.
    #[serde(default = "default_confirm")]
    pub confirm: u32,
    /// Confirmation runs at once (they are independent). Left out: as many as the search ran at once on
    /// the GPU (one for a `shrink` on its own, or where probes ran one at a time). A run that does not
    /// reproduce while others share the GPU (an out-of-memory, a fault disturbed by another's) is run again
    /// alone, so running them together never changes the verdict.
    #[serde(default)]
    pub confirm_jobs: Option<u32>,
    /// Also run the minimal subgraph at the first bad commit's parent, where it should pass.
    #[serde(default = "yes")]
    pub check_parent: bool,
    /// Extra environment variables.
    #[serde(default)]
    pub env: BTreeMap<String, String>,
    /// Not written by the user: the section `start` and `nightly` shrink with when bisect.toml has none
    /// (a capture of the repro command).
    #[serde(skip)]
    pub implicit: bool,
}

/// Which shipped harness `[shrink]`'s factories are for. Every framework but PyTorch's (which also takes
/// captures, a harness of the user's own and native models) is one row of `protocol::SHIPPED`.
#[derive(Clone, Copy, Debug, Default, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "lowercase")]
pub enum ShrinkFramework {
    /// The PyTorch harness (an `nn.Module`, or a captured training step).
    #[default]
    Torch,
    /// The JAX harness on a function: its jaxpr, equation by equation.
    Jax,
    /// The JAX harness on a Keras 3 model: its layers (or, with `train`, its training step's jaxpr).
    Keras,
}

impl ShrinkFramework {
    /// Its name in bisect.toml.
    pub fn name(self) -> &'static str {
        match self {
            ShrinkFramework::Torch => "torch",
            ShrinkFramework::Jax => "jax",
            ShrinkFramework::Keras => "keras",
        }
    }

    /// The key of `[shrink]` that names what its harness shrinks (a `package.module:name` factory).
    pub fn factory_key(self) -> &'static str {
        match self {
            ShrinkFramework::Jax => "function",
            ShrinkFramework::Torch | ShrinkFramework::Keras => "model",
        }
    }
}

/// The harness a `[shrink]` section names, resolved from its keys (which the config's check keeps to
/// exactly one of these).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Harness<'a> {
    /// A command of the user's own that speaks the harness protocol (`harness`).
    Own(&'a CommandLine),
    /// The native harness on a model file (`model` without `inputs`).
    Native(&'a str),
    /// The shipped PyTorch harness on the model's factories (`model` and `inputs`).
    Torch {
        /// The model's factory.
        model: &'a str,
        /// The example inputs' factory.
        inputs: &'a str,
    },
    /// A shipped harness other than PyTorch's (`framework = "jax"`, `"keras"`): the factory its
    /// framework's key names (`function`, `model`) and the inputs' factory.
    Shipped {
        /// Which.
        framework: ShrinkFramework,
        /// What it shrinks: the factory named by [`ShrinkFramework::factory_key`].
        factory: &'a str,
        /// The example inputs' factory.
        inputs: &'a str,
    },
    /// The shipped PyTorch harness on what a capture of the repro command (or of `step`) records.
    Capture,
}

impl ShrinkSection {
    /// The harness this section names.
    pub fn named_harness(&self) -> Harness<'_> {
        let (model, inputs) = (self.model.as_deref(), self.inputs.as_deref());
        match (self.framework, &self.harness) {
            (ShrinkFramework::Torch, Some(command)) => Harness::Own(command),
            (ShrinkFramework::Torch, None) => match (model, inputs) {
                (Some(model), Some(inputs)) => Harness::Torch { model, inputs },
                (Some(model), None) => Harness::Native(model),
                (None, _) => Harness::Capture,
            },
            (framework, _) => Harness::Shipped {
                framework,
                factory: self.factory(framework).unwrap_or_default(),
                inputs: inputs.unwrap_or_default(),
            },
        }
    }

    /// The factory `framework`'s key names in this section.
    fn factory(&self, framework: ShrinkFramework) -> Option<&str> {
        match framework.factory_key() {
            "function" => self.function.as_deref(),
            _ => self.model.as_deref(),
        }
    }

    /// The model comes from a capture of the repro command (or of `step`), not from factories, a model
    /// file or a harness of the user's own.
    pub fn captures(&self) -> bool {
        self.framework == ShrinkFramework::Torch
            && (self.capture
                || self.step.is_some()
                || (self.harness.is_none() && self.model.is_none()))
    }

    /// The PyTorch harness runs the whole training step.
    pub fn trains(&self) -> bool {
        // An explicit `train = false` is never overridden (the config refuses it beside loss or optimizer).
        self.train
            .unwrap_or(self.loss.is_some() || self.optimizer.is_some())
    }

    /// Whether the training step may be chosen for the user (`train` left out, no loss or optimizer).
    pub fn train_left_out(&self) -> bool {
        self.train.is_none() && self.loss.is_none() && self.optimizer.is_none()
    }

    /// Factories, a model file or a harness of the user's own name the model (a `step` with factories
    /// names its `model` too: the config requires it).
    pub fn has_factories(&self) -> bool {
        self.named_harness() != Harness::Capture
    }

    /// The device argument of the shipped harnesses (`auto`: the fault's own device).
    pub fn device_arg(&self) -> &str {
        self.device.as_deref().unwrap_or("auto")
    }

    /// The section used when bisect.toml has no `[shrink]`: capture the faulting step from the repro
    /// command, every other key at its default.
    pub fn implicit() -> Self {
        Self {
            enabled: yes(),
            harness: None,
            model: None,
            inputs: None,
            framework: ShrinkFramework::Torch,
            function: None,
            train: None,
            loss: None,
            optimizer: None,
            step: None,
            capture: true,
            python: default_python(),
            device: None,
            warm_start: yes(),
            backend: BackendChoice::default(),
            timeout: default_shrink_timeout(),
            attempts: one(),
            confirm: default_confirm(),
            confirm_jobs: None,
            check_parent: yes(),
            env: BTreeMap::new(),
            implicit: true,
        }
    }
}

/// Checks `[shrink]`'s keys against each other: what is wrong, in words, or nothing.
pub(super) fn check(shrink: &ShrinkSection) -> Result<(), String> {
    check_framework(shrink)?;
    if shrink.train == Some(false) && (shrink.loss.is_some() || shrink.optimizer.is_some()) {
        return Err(
            "train = false shrinks the forward pass alone: loss and optimizer are for the training step (remove them, or set train = true)".into(),
        );
    }
    match (&shrink.harness, &shrink.model) {
        (Some(_), Some(_)) => return Err("give either harness or model, not both".into()),
        (Some(_), None) if shrink.capture || shrink.step.is_some() => {
            return Err("capture and step use the PyTorch harness: leave harness out".into())
        }
        (None, Some(_)) if shrink.capture || (shrink.step.is_some() && shrink.inputs.is_none()) => {
            return Err(
                "capture takes the model from the repro command: leave model and inputs out".into(),
            );
        }
        _ => {}
    }
    if shrink.step.as_deref().is_some_and(|s| !s.contains(':')) {
        return Err("step: expected `package.module:function`".into());
    }
    if shrink.framework == ShrinkFramework::Torch
        && shrink.inputs.is_some()
        && !shrink.model.as_deref().is_some_and(|m| m.contains(':'))
    {
        return Err(
            "model: with inputs (the PyTorch harness), model is a factory, `package.module:build`"
                .into(),
        );
    }
    if shrink.attempts == 0 || shrink.confirm == 0 || shrink.confirm_jobs == Some(0) {
        return Err("attempts, confirm and confirm-jobs must be at least 1".into());
    }
    Ok(())
}

/// A shipped harness other than PyTorch's first: its own words for keys that belong to the PyTorch one.
fn check_framework(shrink: &ShrinkSection) -> Result<(), String> {
    let framework = shrink.framework;
    if framework == ShrinkFramework::Torch {
        if shrink.function.is_some() {
            return Err("function is for framework = \"jax\": set it, or name a model".into());
        }
        return Ok(());
    }
    let (name, field) = (framework.name(), framework.factory_key());
    let what = shrink.factory(framework);
    let jax = framework == ShrinkFramework::Jax;
    if shrink.harness.is_some() || shrink.capture || shrink.step.is_some() {
        return Err(format!(
            "framework = \"{name}\" uses its shipped harness: leave harness, capture and step out"
        ));
    }
    if !what.is_some_and(|f| f.contains(':')) || shrink.inputs.is_none() {
        return Err(format!(
            "framework = \"{name}\" needs {field} = \"package.module:name\" and inputs = \"package.module:example_inputs\""
        ));
    }
    if jax && shrink.model.is_some() {
        return Err(
            "framework = \"jax\" shrinks a function: name it as function, not model".into(),
        );
    }
    if shrink.optimizer.is_some() {
        return Err(format!(
            "framework = \"{name}\" takes no optimizer: a JAX step does its own update, a compiled Keras model has its own"
        ));
    }
    if jax && shrink.trains() {
        return Err("framework = \"jax\": the function is what runs (name the training step itself); train and loss are for models".into());
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    /// What `[shrink]` accepts and refuses.
    const ACCEPTED: &[&str] = &[
        "[shrink]",
        "[shrink]\nenabled = false",
        "[shrink]\nmodel = \"pkg.models:build\"\ninputs = \"pkg.models:example_inputs\"",
        "[shrink]\nmodel = \"pkg.m:build\"\ninputs = \"pkg.m:batch\"\nloss = \"pkg.m:loss\"\noptimizer = \"pkg.m:make\"",
        "[shrink]\nframework = \"jax\"\nfunction = \"pkg.m:train_step\"\ninputs = \"pkg.m:args\"",
        "[shrink]\nframework = \"keras\"\nmodel = \"pkg.m:build\"\ninputs = \"pkg.m:batch\"\ntrain = true",
        "[shrink]\nharness = \"python3 harness.py\"",
        "[shrink]\nstep = \"pkg.train:train_step\"",
        "[shrink]\nmodel = \"models/net.json\"\nbackend = \"cpu\"",
        "[shrink]\ntrain = false\nconfirm = 3\nconfirm-jobs = 2\ncheck-parent = false",
    ];
    const REFUSED: &[(&str, &str)] = &[
        ("[shrink]\nfunction = \"pkg.m:step\"", "[shrink] function is for framework = \"jax\""),
        ("[shrink]\nframework = \"jax\"\nfunction = \"a:b\"\ninputs = \"a:c\"\nharness = \"h\"", "uses its shipped harness"),
        ("[shrink]\nframework = \"jax\"\ninputs = \"a:c\"", "framework = \"jax\" needs function = "),
        ("[shrink]\nframework = \"keras\"\nmodel = \"nocolon\"\ninputs = \"a:c\"", "framework = \"keras\" needs model = "),
        ("[shrink]\nframework = \"jax\"\nfunction = \"a:b\"\ninputs = \"a:c\"\nmodel = \"a:m\"", "shrinks a function"),
        ("[shrink]\nframework = \"keras\"\nmodel = \"a:b\"\ninputs = \"a:c\"\noptimizer = \"a:o\"", "takes no optimizer"),
        ("[shrink]\nframework = \"jax\"\nfunction = \"a:b\"\ninputs = \"a:c\"\ntrain = true", "the function is what runs"),
        ("[shrink]\ntrain = false\nloss = \"a:l\"", "train = false shrinks the forward pass alone"),
        ("[shrink]\nharness = \"h\"\nmodel = \"m.json\"", "give either harness or model, not both"),
        ("[shrink]\nharness = \"h\"\ncapture = true", "capture and step use the PyTorch harness"),
        ("[shrink]\nmodel = \"a:b\"\ncapture = true", "capture takes the model from the repro command"),
        ("[shrink]\nstep = \"train_step\"", "step: expected `package.module:function`"),
        ("[shrink]\nmodel = \"m.json\"\ninputs = \"a:i\"", "model is a factory"),
        ("[shrink]\nconfirm = 0", "attempts, confirm and confirm-jobs must be at least 1"),
        ("[shrink]\nframework = \"tensorflow\"", "unknown variant `tensorflow`"),
    ];

    #[test]
    fn the_shrink_section_accepts_and_refuses_these_inputs() {
        super::super::assert_table(ACCEPTED, REFUSED);
    }

    #[test]
    fn each_accepted_section_names_exactly_the_harness_its_keys_say() {
        use super::Harness;
        let cases: &[(&str, &str)] = &[
            ("", "capture"),
            ("capture = true", "capture"),
            ("step = \"pkg.train:step\"", "capture"),
            ("model = \"models/net.json\"", "native"),
            ("model = \"pkg.m:build\"\ninputs = \"pkg.m:x\"", "torch"),
            (
                "model = \"pkg.m:build\"\ninputs = \"pkg.m:x\"\nstep = \"pkg.t:s\"",
                "torch",
            ),
            ("harness = \"python3 harness.py\"", "own"),
            (
                "framework = \"jax\"\nfunction = \"pkg.m:f\"\ninputs = \"pkg.m:a\"",
                "jax",
            ),
            (
                "framework = \"keras\"\nmodel = \"pkg.m:b\"\ninputs = \"pkg.m:a\"",
                "keras",
            ),
        ];
        for (keys, want) in cases {
            let text = format!("[repro]\ncommand = \"x\"\n[shrink]\n{keys}\n");
            let config = crate::config::Config::parse(std::path::Path::new("bisect.toml"), &text)
                .expect("accepted");
            let section = config.shrink.expect("a [shrink] section");
            let got = match section.named_harness() {
                Harness::Own(_) => "own",
                Harness::Native(_) => "native",
                Harness::Torch { .. } => "torch",
                Harness::Shipped { framework, .. } => framework.name(),
                Harness::Capture => "capture",
            };
            assert_eq!(got, *want, "{keys}");
        }
    }
}
