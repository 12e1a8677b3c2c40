//! Harness runs under compute-sanitizer's memcheck, read: the shrink's way to keep a fault that the
//! repro's own process shows only by where its buffers sit (an overrun just past a buffer), which the
//! harness's process, with other buffers around, does not show by itself. The harness that runs under it
//! is [`super::client::Memchecked`].

use crate::classify::sanitizer::{parse_text, signature_of};
use crate::classify::{classify, FaultClass, Signature};
use crate::exec::process::RunOutput;
use crate::exec::tools::POOLS_OFF;

/// The classes of a fault memcheck reports as an invalid access: the same access shows as one or another
/// (700, 716, 717) by where it lands, and as an OutOfBounds record under memcheck.
pub fn is_memory_access(class: FaultClass) -> bool {
    matches!(
        class,
        FaultClass::IllegalAddress
            | FaultClass::InvalidAddressSpace
            | FaultClass::MisalignedAddress
            | FaultClass::LaunchFailure
    )
}

/// The signature of a run under memcheck: its first finding, a memory-access one read as `as_class`;
/// with no finding, the program's own output (clean, or another failure).
pub fn memcheck_signature(run: &RunOutput, as_class: FaultClass) -> Signature {
    let lines: Vec<&str> = run.output.lines().collect();
    match parse_text(&lines).first() {
        Some(finding) => {
            let mut sig = signature_of(finding);
            if is_memory_access(sig.class) && is_memory_access(as_class) {
                sig.class = as_class;
            }
            sig
        }
        None => classify(run.exit, &run.output),
    }
}

/// The words a maintainer puts before a command to run it as the shrink did under memcheck.
pub fn memcheck_prefix() -> String {
    let env: Vec<String> = POOLS_OFF
        .iter()
        .map(|(k, v, _)| format!("{k}={v}"))
        .collect();
    format!("{} compute-sanitizer --tool memcheck", env.join(" "))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::classify::Exit;

    fn run(exit: i32, output: &str) -> RunOutput {
        RunOutput {
            exit: Exit::Code(exit),
            duration: std::time::Duration::from_millis(1),
            output: output.into(),
            total_bytes: 0,
            interrupted: false,
            lingering: Vec::new(),
            job: None,
            ended_by: None,
        }
    }

    #[test]
    fn an_out_of_bounds_record_reads_as_the_targets_class_with_its_kernel() {
        let text = "========= COMPUTE-SANITIZER\n========= Invalid __global__ write of size 16 bytes\n=========     at _hash_embed_kernel+0x1d0 in embed.py:11\n=========     by thread (0,0,0) in block (3,0,0)\n=========     Address 0x7f0000810000 is out of bounds\n=========     and is 8,482,817 bytes after the nearest allocation at 0x7f0000000000 of size 262,144 bytes\n=========\nRuntimeError: CUDA error: unspecified launch failure\n========= ERROR SUMMARY: 1 error\n";
        let sig = memcheck_signature(&run(1, text), FaultClass::InvalidAddressSpace);
        assert_eq!(sig.class, FaultClass::InvalidAddressSpace);
        assert_eq!(sig.kernel.as_deref(), Some("_hash_embed_kernel"));
        // No finding: the program's own output decides (here, a clean run).
        let clean = run(
            0,
            "========= COMPUTE-SANITIZER\nok\n========= ERROR SUMMARY: 0 errors\n",
        );
        assert_eq!(
            memcheck_signature(&clean, FaultClass::IllegalAddress).class,
            FaultClass::None
        );
    }

    #[test]
    fn the_prefix_turns_every_pool_off() {
        let p = memcheck_prefix();
        for (k, v, _) in POOLS_OFF {
            assert!(p.contains(&format!("{k}={v}")), "{p}");
        }
        assert!(p.ends_with("compute-sanitizer --tool memcheck"));
    }
}
