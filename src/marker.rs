//! The `@@cudabisect` node markers a harness prints around every node: one grammar, written by the native
//! harness, parsed by the classifier and the shrink driver, and mirrored by the shipped PyTorch harness.

/// Whether a marker opens or closes a node.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum MarkerPhase {
    /// The node is about to run.
    Begin,
    /// The node ran and synchronised without a fault.
    End,
}

/// One parsed marker line.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Marker<'a> {
    /// The node id.
    pub node: &'a str,
    /// The node's op.
    pub op: &'a str,
    /// The kernel the node launches (`-` when unknown).
    pub kernel: &'a str,
    /// Begin or end.
    pub phase: MarkerPhase,
}

/// What every marker line starts with.
pub const MARKER_PREFIX: &str = "@@cudabisect ";

impl<'a> Marker<'a> {
    /// Parses `@@cudabisect node=N op=O kernel=K begin|end`; anything else is `None`.
    pub fn parse(line: &'a str) -> Option<Self> {
        let rest = line.trim_end().strip_prefix(MARKER_PREFIX)?;
        let mut words = rest.split_whitespace();
        let node = words.next()?.strip_prefix("node=")?;
        let op = words.next()?.strip_prefix("op=")?;
        let kernel = words.next()?.strip_prefix("kernel=")?;
        let phase = match words.next()? {
            "begin" => MarkerPhase::Begin,
            "end" => MarkerPhase::End,
            _ => return None,
        };
        Some(Self {
            node,
            op,
            kernel,
            phase,
        })
    }

    /// The marker line, without a newline.
    pub fn format(node: &str, op: &str, kernel: &str, phase: MarkerPhase) -> String {
        let phase = match phase {
            MarkerPhase::Begin => "begin",
            MarkerPhase::End => "end",
        };
        format!("{MARKER_PREFIX}node={node} op={op} kernel={kernel} {phase}")
    }
}

/// What a harness prints inside a node before each kernel launch it can name (the PyTorch harness: every
/// Triton launch): `@@cudabisect launch kernel=<name>`.
pub const LAUNCH_PREFIX: &str = "@@cudabisect launch kernel=";

/// What a harness prints when it failed by itself (its own bug, a fork that cannot use CUDA), so that
/// the failure is never taken for the model's.
pub const HARNESS_ERROR_PREFIX: &str = "@@cudabisect harness-error";

/// What a harness prints when the full run showed no fault node by node but the whole program, compiled
/// as one (JAX's `jit`), faulted: `@@cudabisect jit-only dump=<dir>`, the compiler's dump in `<dir>`.
pub const JIT_ONLY_PREFIX: &str = "@@cudabisect jit-only dump=";

/// The compiler dump's directory, when the output says the fault shows only compiled as a whole.
pub fn jit_only_dump(output: &str) -> Option<&str> {
    output
        .lines()
        .find_map(|l| l.trim_end().strip_prefix(JIT_ONLY_PREFIX))
        .filter(|d| !d.is_empty())
}

/// Whether a node's `kernel` names a GPU kernel rather than labelling its op. The native harness names
/// the kernel a node launches (`op=embedding kernel=engine_gather`, `op=matmul kernel=matmul_f32`); the
/// PyTorch, JAX and Keras harnesses label a node by its module or layer class, its primitive or its op
/// overload (`op=Linear kernel=Linear`, `op=pure_callback kernel=pure_callback`, `op=backward_of_Mixer
/// kernel=Mixer`, `op=hash_embed kernel=hash_embed.default`), and a kernel is only known there from a
/// launch line (a Triton launch, a Pallas call's kernel).
pub fn names_a_kernel(op: &str, kernel: &str) -> bool {
    let kernel = kernel.trim();
    let op = op.trim();
    !(kernel.is_empty()
        || kernel == "-"
        || kernel == op
        || op.ends_with(&format!(" of {kernel}"))
        || op.ends_with(&format!("_of_{kernel}"))
        || kernel
            .strip_prefix(op)
            .is_some_and(|rest| rest.starts_with('.')))
}

/// The kernel named by a launch line, if `line` is one.
pub fn parse_launch(line: &str) -> Option<&str> {
    let name = line.trim_end().strip_prefix(LAUNCH_PREFIX)?.trim();
    (!name.is_empty() && !name.contains(char::is_whitespace)).then_some(name)
}

/// The nodes still open when the output ends, outermost first, each with the kernel it launched last
/// (when the harness named its launches). Markers nest when a harness descends into a module: an `end`
/// closes its node and anything opened inside it; an `end` of a node that is not open is ignored.
fn open_nodes(output: &str) -> Vec<(Marker<'_>, Option<&str>)> {
    let mut open: Vec<(Marker<'_>, Option<&str>)> = Vec::new();
    for line in output.lines() {
        if let Some(k) = parse_launch(line) {
            if let Some(last) = open.last_mut() {
                last.1 = Some(k);
            }
            continue;
        }
        match Marker::parse(line) {
            Some(m) if m.phase == MarkerPhase::Begin => open.push((m, None)),
            Some(m) => {
                if let Some(i) = open.iter().rposition(|(o, _)| o.node == m.node) {
                    open.truncate(i);
                }
            }
            None => {}
        }
    }
    open
}

/// The markers still open when the output ends, outermost first (see [`open_nodes`]).
pub fn open_markers(output: &str) -> Vec<Marker<'_>> {
    open_nodes(output).into_iter().map(|(m, _)| m).collect()
}

/// The kernel launched last inside the node the run died in (launches are synchronous under
/// `CUDA_LAUNCH_BLOCKING=1`, so that is the kernel that faulted), when the harness named one.
pub fn launched_in_open_node(output: &str) -> Option<&str> {
    open_nodes(output).pop().and_then(|(_, k)| k)
}

/// The harness's own failure line, when it printed one.
pub fn harness_error(output: &str) -> Option<&str> {
    output
        .lines()
        .find(|l| l.starts_with(HARNESS_ERROR_PREFIX))
        .map(str::trim)
}

/// The innermost marker whose `begin` has no `end`: the node the run died in.
pub fn open_marker(output: &str) -> Option<Marker<'_>> {
    open_markers(output).pop()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn format_and_parse_agree() {
        for phase in [MarkerPhase::Begin, MarkerPhase::End] {
            let line = Marker::format("b2_lookup", "embedding", "gather_rows", phase);
            let m = Marker::parse(&line).expect("parses");
            assert_eq!(
                (m.node, m.op, m.kernel, m.phase),
                ("b2_lookup", "embedding", "gather_rows", phase)
            );
        }
        assert_eq!(
            Marker::parse("@@cudabisect node=a op=b kernel=c middle"),
            None
        );
        assert_eq!(Marker::parse("@@cudabisect node=a"), None);
        assert_eq!(Marker::parse("node=a op=b kernel=c begin"), None);
    }

    #[test]
    fn the_open_marker_names_the_node_that_died() {
        let out = "@@cudabisect node=a op=x kernel=k begin\n@@cudabisect node=a op=x kernel=k end\n@@cudabisect node=b op=y kernel=k2 begin\nRuntimeError: CUDA error\n";
        assert_eq!(open_marker(out).map(|m| m.node), Some("b"));
        let done =
            "@@cudabisect node=a op=x kernel=k begin\n@@cudabisect node=a op=x kernel=k end\n";
        assert_eq!(open_marker(done), None);
        // Nested: the call inside the module that died is innermost; the module is still open around it.
        let nested = "@@cudabisect node=m op=M kernel=M begin\n@@cudabisect node=m__a op=A kernel=A begin\n@@cudabisect node=m__a op=A kernel=A end\n@@cudabisect node=m__b op=B kernel=B begin\nRuntimeError\n";
        let open: Vec<&str> = open_markers(nested).iter().map(|m| m.node).collect();
        assert_eq!(open, ["m", "m__b"]);
        // A fault in the module's own code after its children ended: the module itself.
        let own = "@@cudabisect node=m op=M kernel=M begin\n@@cudabisect node=m__a op=A kernel=A begin\n@@cudabisect node=m__a op=A kernel=A end\nRuntimeError\n";
        assert_eq!(open_marker(own).map(|m| m.node), Some("m"));
    }

    #[test]
    fn the_last_launch_inside_the_open_node_names_the_kernel() {
        let out = "@@cudabisect node=a op=x kernel=k begin\n@@cudabisect launch kernel=early\n@@cudabisect node=a op=x kernel=k end\n@@cudabisect node=emb__backward op=backward_of_Embed kernel=Embed begin\n@@cudabisect launch kernel=_gather_fwd\n@@cudabisect launch kernel=_gather_bwd\nRuntimeError: Triton Error [CUDA]: an illegal memory access was encountered\n";
        assert_eq!(launched_in_open_node(out), Some("_gather_bwd"));
        // A launch in a node that ended says nothing about the node that died.
        let ended = "@@cudabisect node=a op=x kernel=k begin\n@@cudabisect launch kernel=early\n@@cudabisect node=a op=x kernel=k end\n@@cudabisect node=b op=y kernel=y begin\nRuntimeError\n";
        assert_eq!(launched_in_open_node(ended), None);
        assert_eq!(parse_launch("@@cudabisect launch kernel=a b"), None);
        assert_eq!(
            harness_error("x\n@@cudabisect harness-error: run: TypeError: boom\n"),
            Some("@@cudabisect harness-error: run: TypeError: boom")
        );
        assert_eq!(harness_error("RuntimeError: CUDA error"), None);
    }

    #[test]
    fn the_python_harness_writes_the_same_grammar() {
        let py = [
            include_str!("../harness/torch_harness/cudabisect_torch/protocol.py"),
            include_str!("../harness/torch_harness/cudabisect_torch/node.py"),
        ]
        .concat();
        assert!(
            py.contains(r#"MARKER = "@@cudabisect node={node} op={op} kernel={kernel} {phase}""#),
            "the PyTorch harness's MARKER must match Marker::format"
        );
        assert!(py.contains(&format!("LAUNCH = \"{LAUNCH_PREFIX}{{kernel}}\"")));
        assert!(py.contains(&format!("HARNESS_ERROR = \"{HARNESS_ERROR_PREFIX}\"")));
    }
}
