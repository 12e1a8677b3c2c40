//! The value types and readers every section shares: commands, durations and time limits.

use std::fmt;
use std::time::Duration;

use serde::de::{self, Deserializer, SeqAccess, Visitor};
use serde::Deserialize;

/// A command: an argv array run directly, or a string run by `sh -c`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum CommandLine {
    /// Program and arguments, no shell involved.
    Argv(Vec<String>),
    /// A shell line for `sh -c`.
    Shell(String),
}

impl CommandLine {
    /// The program and its arguments as they will be executed.
    pub fn argv(&self) -> (String, Vec<String>) {
        match self {
            Self::Argv(v) => (v[0].clone(), v[1..].to_vec()),
            Self::Shell(s) => ("sh".into(), vec!["-c".into(), s.clone()]),
        }
    }

    /// A readable form for messages and reports.
    pub fn display(&self) -> String {
        match self {
            Self::Argv(v) => v.join(" "),
            Self::Shell(s) => s.clone(),
        }
    }
}

impl<'de> Deserialize<'de> for CommandLine {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct CommandVisitor;
        impl<'de> Visitor<'de> for CommandVisitor {
            type Value = CommandLine;
            fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
                f.write_str("a command: an array of strings (argv) or a string (run by `sh -c`)")
            }
            fn visit_str<E: de::Error>(self, v: &str) -> Result<CommandLine, E> {
                if v.trim().is_empty() {
                    return Err(E::custom("the command is empty"));
                }
                Ok(CommandLine::Shell(v.to_string()))
            }
            fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<CommandLine, A::Error> {
                let mut argv = Vec::new();
                while let Some(arg) = seq.next_element::<String>()? {
                    argv.push(arg);
                }
                match argv.first() {
                    None => return Err(de::Error::custom("the command array is empty")),
                    Some(p) if p.trim().is_empty() => {
                        return Err(de::Error::custom(
                            "the command's program (its first word) is empty",
                        ))
                    }
                    Some(_) => {}
                }
                Ok(CommandLine::Argv(argv))
            }
        }
        d.deserialize_any(CommandVisitor)
    }
}

pub(super) fn duration<'de, D: Deserializer<'de>>(d: D) -> Result<Duration, D::Error> {
    let text = String::deserialize(d)?;
    humantime::parse_duration(&text)
        .map_err(|e| de::Error::custom(format!("invalid duration `{text}`: {e}")))
}

/// A time limit: a duration of at least a second (a zero or sub-second limit would end every command at
/// once or before it started: a typo, as `1ns` for `1m`).
pub(super) fn timeout<'de, D: Deserializer<'de>>(d: D) -> Result<Duration, D::Error> {
    let value = duration(d)?;
    if value.is_zero() {
        return Err(de::Error::custom(
            "a zero timeout would stop every command at once: give a positive duration such as \"10m\"",
        ));
    }
    if value < Duration::from_secs(1) {
        return Err(de::Error::custom(format!(
            "a timeout of {} would stop every command before it started: give at least a second, such as \"10m\"",
            humantime::format_duration(value)
        )));
    }
    Ok(value)
}

pub(super) fn opt_duration<'de, D: Deserializer<'de>>(d: D) -> Result<Option<Duration>, D::Error> {
    duration(d).map(Some)
}

pub(super) fn yes() -> bool {
    true
}

pub(super) fn one() -> u32 {
    1
}

#[cfg(test)]
mod tests {
    /// What a command and a time limit accept and refuse, written in `[repro]`.
    const ACCEPTED: &[&str] = &[
        "[repro]\ncommand = \"python3 train.py --steps 3\"",
        "[repro]\ncommand = [\"python3\", \"train.py\"]",
        "[repro]\ncommand = \"x\"\ntimeout = \"90s\"",
        "[repro]\ncommand = \"x\"\ntimeout = \"1h 30m\"",
        "[repro]\ncommand = \"x\"\ngrace-period = \"0s\"",
    ];
    const REFUSED: &[(&str, &str)] = &[
        ("[repro]\ncommand = \"  \"", "the command is empty"),
        ("[repro]\ncommand = []", "the command array is empty"),
        (
            "[repro]\ncommand = [\" \", \"x\"]",
            "the command's program (its first word) is empty",
        ),
        (
            "[repro]\ncommand = 3",
            "a command: an array of strings (argv) or a string",
        ),
        (
            "[repro]\ncommand = \"x\"\ntimeout = \"0s\"",
            "a zero timeout would stop every command at once",
        ),
        (
            "[repro]\ncommand = \"x\"\ntimeout = \"500ms\"",
            "would stop every command before it started",
        ),
        (
            "[repro]\ncommand = \"x\"\ntimeout = \"ten minutes\"",
            "invalid duration",
        ),
    ];

    #[test]
    fn commands_and_time_limits_accepts_and_refuses_these_inputs() {
        super::super::assert_table(ACCEPTED, REFUSED);
    }
}
