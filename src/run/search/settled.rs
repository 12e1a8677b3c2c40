//! The fault stacks the sanitizer has settled in this run: a probe that faults with exactly the same
//! stack as one settled before (every frame of the user's code, its line and its source text, and the same
//! class, code and exception) takes the kernel that run named, instead of a sanitizer run of its own.
//!
//! Why the whole stack and not the launch site alone: real libraries launch every kernel through one
//! wrapper frame, so the innermost frame is shared by every kernel, and a lookalike of the target in another
//! kernel has the same site. Its callers differ, or a line of them does. A stack with any frame, line or
//! source text changed is settled again. What this cannot see is a kernel chosen from the very same lines by
//! data alone (one op of an extension dispatching to two kernels): so a culprit whose fault was judged from
//! memory is run under the sanitizer itself before it is named, and a different kernel there sends the
//! search round again with nothing remembered.

use std::collections::HashMap;
use std::sync::Mutex;

use crate::classify::Signature;

/// What a sanitizer run named for one fault stack.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Settled {
    /// The kernel the fault was in.
    pub kernel: String,
    /// The commit whose probe the sanitizer ran on.
    pub commit: String,
}

/// The settled fault stacks of one run, shared by its workers.
#[derive(Debug, Default)]
pub struct SettledStacks {
    known: Mutex<HashMap<String, Settled>>,
    /// Remembers nothing: a search run again after a remembered answer proved wrong at its culprit.
    off: bool,
}

/// The note a probe record carries when its kernel came from an earlier sanitizer run, not its own.
pub const REMEMBERED: &str = "not run again: the same fault stack was settled at";

/// The key of a fault: class, code, exception and every user frame. `None` when the output had no
/// traceback of the user's code (nothing to recognise it by).
fn key(sig: &Signature) -> Option<String> {
    if sig.stack.is_empty() {
        return None;
    }
    Some(format!(
        "{}\u{1f}{:?}\u{1f}{}\u{1f}{}",
        sig.class.as_str(),
        sig.code,
        sig.exception.as_deref().unwrap_or(""),
        sig.stack.join("\u{1e}")
    ))
}

impl SettledStacks {
    /// What the sanitizer named for this fault's stack earlier in the run.
    pub fn get(&self, sig: &Signature) -> Option<Settled> {
        if self.off {
            return None;
        }
        let k = key(sig)?;
        self.known
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .get(&k)
            .cloned()
    }

    /// Whether `a` and `b` fault with one stack that a sanitizer run would settle for both (never, for
    /// a memory that remembers nothing).
    pub fn same_stack(&self, a: &Signature, b: &Signature) -> bool {
        !self.off && key(a).is_some_and(|k| Some(k) == key(b))
    }

    /// A memory that remembers nothing.
    pub fn off() -> Self {
        Self {
            known: Mutex::default(),
            off: true,
        }
    }

    /// Remembers what the sanitizer named for `sig`'s stack (the first answer stands).
    pub fn remember(&self, sig: &Signature, kernel: &str, commit: &str) {
        if let Some(k) = key(sig).filter(|_| !self.off) {
            self.known
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .entry(k)
                .or_insert_with(|| Settled {
                    kernel: kernel.to_string(),
                    commit: commit.to_string(),
                });
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::classify::FaultClass;

    fn fault(stack: &[&str]) -> Signature {
        let mut s = Signature::new(FaultClass::IllegalAddress, "x");
        s.exception = Some("RuntimeError".into());
        s.stack = stack.iter().map(|f| f.to_string()).collect();
        s
    }

    #[test]
    fn only_the_very_same_stack_is_recognised() {
        let memory = SettledStacks::default();
        let gelu = fault(&[
            "train.py:5 in <module>: y = forward(x)",
            "pkg/ops.py:14 in bias_gelu: run(_bias_gelu_kernel, (blocks,), x, out, n)",
            "pkg/launch.py:3 in run: kernel[grid](*args, **kw)",
        ]);
        memory.remember(&gelu, "_bias_gelu_kernel", "abc");
        assert_eq!(
            memory.get(&gelu).map(|s| s.kernel),
            Some("_bias_gelu_kernel".into())
        );
        // The same wrapper frame, reached from another kernel's caller: not the same fault.
        let embed = fault(&[
            "train.py:5 in <module>: y = forward(x)",
            "pkg/embed.py:14 in hash_embed: run(_hash_embed_kernel, (blocks,), x, out, n)",
            "pkg/launch.py:3 in run: kernel[grid](*args, **kw)",
        ]);
        assert_eq!(memory.get(&embed), None);
        // A moved line, another exception, another class: settled again.
        let mut moved = gelu.clone();
        moved.stack[1] = moved.stack[1].replace(":14 ", ":15 ");
        assert_eq!(memory.get(&moved), None);
        let mut other = gelu.clone();
        other.exception = Some("torch.AcceleratorError".into());
        assert_eq!(memory.get(&other), None);
        let mut class = gelu.clone();
        class.class = FaultClass::MisalignedAddress;
        assert_eq!(memory.get(&class), None);
        // No traceback: nothing to recognise.
        memory.remember(&fault(&[]), "k", "abc");
        assert_eq!(memory.get(&fault(&[])), None);
        // The first answer stands.
        memory.remember(&gelu, "other", "def");
        assert_eq!(memory.get(&gelu).map(|s| s.commit), Some("abc".into()));
        // One that is off remembers nothing.
        let off = SettledStacks::off();
        off.remember(&gelu, "_bias_gelu_kernel", "abc");
        assert_eq!(off.get(&gelu), None);
    }
}
