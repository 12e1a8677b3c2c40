//! compute-sanitizer reports: parse the text and `--xml` forms into findings, fold thousands of identical
//! reports into one line per (kernel, pc, kind), and turn the first finding into a signature.

use std::collections::BTreeMap;
use std::sync::LazyLock;

use regex::Regex;
use serde::{Deserialize, Serialize};

use super::kernel_name::short_kernel_name;
use super::signature::{FaultClass, Signature};

/// What one sanitizer record says went wrong.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum FindingKind {
    /// An access outside every live allocation.
    OutOfBounds,
    /// An access to memory that was freed.
    UseAfterFree,
    /// An access whose address is not a multiple of its size.
    Misaligned,
    /// A read of memory nothing wrote.
    Uninitialized,
    /// A shared-memory data race.
    Race,
    /// A barrier misuse (synccheck).
    Barrier,
    /// A device trap (`__trap()`), reported as a warp exception.
    Trap,
    /// A failed device-side `assert`, reported as a warp exception.
    Assert,
    /// Any other invalid access.
    Invalid,
}

impl FindingKind {
    /// The signature class this finding stands for.
    pub fn class(self) -> FaultClass {
        match self {
            Self::OutOfBounds | Self::UseAfterFree | Self::Invalid => FaultClass::IllegalAddress,
            Self::Misaligned => FaultClass::MisalignedAddress,
            Self::Uninitialized => FaultClass::UninitializedRead,
            Self::Race | Self::Barrier => FaultClass::Race,
            Self::Trap => FaultClass::LaunchFailure,
            Self::Assert => FaultClass::DeviceAssert,
        }
    }
}

/// One sanitizer record.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct Finding {
    /// What went wrong.
    pub kind: Option<FindingKind>,
    /// The kernel, shortened.
    pub kernel: Option<String>,
    /// The program counter offset within the kernel.
    pub pc: Option<String>,
    /// `file:line` when the kernel has line info.
    pub source: Option<String>,
    /// `read`, `write` or `atomic`.
    pub direction: Option<String>,
    /// Access size in bytes.
    pub size: Option<u64>,
    /// The faulting address.
    pub address: Option<String>,
    /// Thread index.
    pub thread: Option<[u32; 3]>,
    /// Block index.
    pub block: Option<[u32; 3]>,
    /// How the address relates to the nearest allocation.
    pub relation: Option<String>,
    /// The record's headline.
    pub text: String,
}

static HEADER: LazyLock<Regex> = LazyLock::new(|| {
    Regex::new(r"^(?:=+ )?(Invalid __(?P<space>\w+)__ (?P<dir>read|write|atomic)\w* of size (?P<size>\d+)(?: bytes?)?|Uninitialized __\w+__ memory read of size (?P<usize>\d+) bytes?|(?:Error|Warning): Race reported between .*|(?:ERROR|WARN)\b[^:]*:\s*(?:\([^)]*\)\s*)?Potential \w+ hazard detected at .*|Barrier error detected.*|(?P<exception>Trace/breakpoint trap|Warp assert|Warp Illegal Address|Warp Misaligned Address|Warp Illegal Instruction|Warp Out-of-range Address))$").expect("pattern")
});
static AT: LazyLock<Regex> = LazyLock::new(|| {
    Regex::new(r"^=+\s+at (?:0x[0-9a-f]+ in )?(?P<func>.+?)\+0x(?P<pc>[0-9a-f]+)(?: in (?P<file>[^:\s]+):(?P<line>\d+))?").expect("pattern")
});
/// The older `cuda-memcheck` form: `at 0x000002e8 in Kernel(args)` (pc first, no offset).
static AT_LEGACY: LazyLock<Regex> = LazyLock::new(|| {
    Regex::new(r"^=+\s+at 0x(?P<pc>[0-9a-f]+) in (?P<func>.+)$").expect("pattern")
});
static RACE_AT: LazyLock<Regex> = LazyLock::new(|| {
    Regex::new(
        r"access at (?P<func>.+?)\+0x(?P<pc>[0-9a-f]+)(?: in (?P<file>[^:\s]+):(?P<line>\d+))?",
    )
    .expect("pattern")
});
static THREAD: LazyLock<Regex> = LazyLock::new(|| {
    Regex::new(r"^=+\s+by thread \((\d+),(\d+),(\d+)\) in block \((\d+),(\d+),(\d+)\)")
        .expect("pattern")
});
static ACCESS: LazyLock<Regex> = LazyLock::new(|| {
    Regex::new(r"^=+\s+(?:Access to|Address) (?P<addr>0x[0-9a-f]+)(?: is (?P<what>out of bounds|misaligned))?").expect("pattern")
});
static RELATION: LazyLock<Regex> = LazyLock::new(|| {
    Regex::new(r"and is (?:(?P<dist>[\d,]+) bytes (?P<side>after|before)|(?P<inside>inside)(?: a (?P<freed>freed))?) (?:the nearest )?allocation at (?P<at>0x[0-9a-f]+) of size (?P<size>[\d,]+) bytes").expect("pattern")
});

/// Rejoins record lines that a terminal or a paste wrapped: a line without the `=====` prefix between
/// two that have it continues the one before.
fn unwrap_records(lines: &[&str]) -> Vec<String> {
    let mut out: Vec<String> = Vec::with_capacity(lines.len());
    for (i, line) in lines.iter().enumerate() {
        let prev_is_record = out.last().is_some_and(|l| l.starts_with("====="));
        let next_is_record = lines.get(i + 1).is_some_and(|l| l.starts_with("====="));
        if !line.starts_with('=') && prev_is_record && next_is_record && !line.trim().is_empty() {
            if let Some(last) = out.last_mut() {
                last.push_str(line.trim_start());
                continue;
            }
        }
        out.push((*line).to_string());
    }
    out
}

/// Parses every record of a sanitizer text report.
pub fn parse_text(lines: &[&str]) -> Vec<Finding> {
    let joined = unwrap_records(lines);
    let lines: Vec<&str> = joined.iter().map(String::as_str).collect();
    let mut findings = Vec::new();
    let mut current: Option<Finding> = None;
    for line in lines {
        if let Some(c) = HEADER.captures(line) {
            findings.extend(current.take());
            current = Some(header_finding(&c, line));
            continue;
        }
        let Some(f) = current.as_mut() else { continue };
        if line.trim_start_matches('=').trim().is_empty() || !line.starts_with('=') {
            findings.extend(current.take());
        } else if let Some(c) = AT.captures(line) {
            set_location(f, &c);
        } else if let Some(c) = AT_LEGACY.captures(line) {
            set_location(f, &c);
        } else if let Some(c) = THREAD.captures(line) {
            let n = |i: usize| c[i].parse().unwrap_or(0);
            f.thread = Some([n(1), n(2), n(3)]);
            f.block = Some([n(4), n(5), n(6)]);
        } else if let Some(c) = ACCESS.captures(line) {
            f.address = Some(c["addr"].to_string());
            if c.name("what").map(|m| m.as_str()) == Some("misaligned") {
                f.kind = Some(FindingKind::Misaligned);
            }
        } else if let Some(c) = RELATION.captures(line) {
            apply_relation(f, &c);
        } else if let Some(c) = RACE_AT.captures(line) {
            // "and Read access at race+0xb0": the second party of a race.
            if f.kernel.is_none() {
                set_location(f, &c);
            }
        }
    }
    findings.extend(current);
    findings
}

fn header_finding(c: &regex::Captures, line: &str) -> Finding {
    let text = line.trim_start_matches('=').trim().to_string();
    let mut f = Finding {
        text: text.clone(),
        ..Finding::default()
    };
    if c.name("dir").is_some() {
        f.kind = Some(FindingKind::Invalid);
        f.direction = Some(c["dir"].to_string());
        f.size = c["size"].parse().ok();
    } else if let Some(size) = c.name("usize") {
        f.kind = Some(FindingKind::Uninitialized);
        f.direction = Some("read".into());
        f.size = size.as_str().parse().ok();
    } else if let Some(e) = c.name("exception") {
        f.kind = Some(exception_kind(e.as_str()));
    } else if text.contains("Race reported between") || text.contains("hazard detected at") {
        // Warnings too: a race the tool only warns about is still a race, and the log's reason to exist.
        f.kind = Some(FindingKind::Race);
        if let Some(rc) = RACE_AT.captures(&text) {
            set_location(&mut f, &rc);
        }
    } else {
        f.kind = Some(FindingKind::Barrier);
    }
    f
}

/// The kind of a warp exception record, by its name.
fn exception_kind(name: &str) -> FindingKind {
    let lower = name.to_lowercase();
    if lower.contains("trap") {
        FindingKind::Trap
    } else if lower.contains("assert") {
        FindingKind::Assert
    } else if lower.contains("misaligned") {
        FindingKind::Misaligned
    } else {
        FindingKind::Invalid
    }
}

fn set_location(f: &mut Finding, c: &regex::Captures) {
    // A debug build puts the source first: `at 0x120 in /path/file.cuh:59:ns::kernel(args)`.
    static SOURCE_FIRST: LazyLock<Regex> = LazyLock::new(|| {
        Regex::new(r"^(?P<file>[^:\s()]+):(?P<line>\d+):(?P<func>.+)$").expect("pattern")
    });
    let func = &c["func"];
    let (func, source) = match SOURCE_FIRST.captures(func) {
        Some(s) => (
            s.name("func").map_or(func, |m| m.as_str()),
            Some(format!("{}:{}", &s["file"], &s["line"])),
        ),
        None => (func, None),
    };
    f.kernel = Some(short_kernel_name(func));
    f.pc = Some(format!("0x{}", &c["pc"]));
    if let (Some(file), Some(line)) = (c.name("file"), c.name("line")) {
        f.source = Some(format!("{}:{}", file.as_str(), line.as_str()));
    } else if source.is_some() {
        f.source = source;
    }
}

fn apply_relation(f: &mut Finding, c: &regex::Captures) {
    let size = &c["size"];
    f.relation = Some(if let Some(dist) = c.name("dist") {
        f.kind = f.kind.map(|k| {
            if k == FindingKind::Invalid {
                FindingKind::OutOfBounds
            } else {
                k
            }
        });
        format!(
            "{} bytes {} an allocation of size {} bytes",
            dist.as_str(),
            &c["side"],
            size
        )
    } else if c.name("freed").is_some() {
        f.kind = Some(FindingKind::UseAfterFree);
        format!("inside a freed allocation of size {size} bytes")
    } else {
        format!("inside an allocation of size {size} bytes")
    });
}

/// The error count from the summary line, when printed.
pub fn error_summary(lines: &[&str]) -> Option<u64> {
    static SUMMARY: LazyLock<Regex> =
        LazyLock::new(|| Regex::new(r"^=+ ERROR SUMMARY: (\d+) errors?$").expect("pattern"));
    lines
        .iter()
        .find_map(|l| SUMMARY.captures(l).and_then(|c| c[1].parse().ok()))
}

/// The signature of the first sanitizer finding in a text log, if any.
pub fn first_finding(lines: &[&str]) -> Option<Signature> {
    parse_text(lines)
        .into_iter()
        .next()
        .map(|f| signature_of(&f))
}

/// Turns a finding into a signature.
pub fn signature_of(f: &Finding) -> Signature {
    let kind = f.kind.unwrap_or(FindingKind::Invalid);
    let mut s = Signature::new(kind.class(), format!("compute-sanitizer: {}", f.text));
    s.kernel = f.kernel.clone();
    s.site = f.source.clone();
    s.detail = Some(describe(f));
    s
}

/// One line about a finding: direction, size, address relation.
pub fn describe(f: &Finding) -> String {
    let mut parts = Vec::new();
    if let (Some(dir), Some(size)) = (&f.direction, f.size) {
        parts.push(format!("{dir} of {size} bytes"));
    }
    match (f.kind, &f.relation) {
        (_, Some(rel)) => parts.push(rel.clone()),
        (Some(FindingKind::Misaligned), None) => parts.push("misaligned".into()),
        (Some(FindingKind::OutOfBounds), None) => parts.push("out of bounds".into()),
        (Some(FindingKind::Race | FindingKind::Trap | FindingKind::Assert), None) => {
            parts.push(f.text.clone())
        }
        _ => {}
    }
    if parts.is_empty() {
        f.text.clone()
    } else {
        parts.join(", ")
    }
}

/// Why an XML report could not be read.
#[derive(Debug, thiserror::Error)]
#[error("unreadable compute-sanitizer XML: {0}")]
pub struct XmlError(String);

/// Parses the records of a `--xml --save` report. API-error records are left out: they repeat what the
/// program saw.
pub fn parse_xml(xml: &str) -> Result<Vec<Finding>, XmlError> {
    // compute-sanitizer nests a dozen levels; a deeper document is not its report, and parsing one tens
    // of thousands deep would exhaust the stack.
    if nesting_depth(xml) > MAX_XML_DEPTH {
        return Err(XmlError(format!(
            "elements nested deeper than {MAX_XML_DEPTH} levels"
        )));
    }
    let doc = roxmltree::Document::parse(xml).map_err(|e| XmlError(e.to_string()))?;
    let mut out = Vec::new();
    for record in doc.descendants().filter(|n| n.has_tag_name("record")) {
        let kind = child_text(record, &["kind"]).unwrap_or_default();
        if kind == "Api" {
            continue;
        }
        out.push(xml_finding(record));
    }
    Ok(out)
}

/// How deep a sanitizer report may nest its elements.
const MAX_XML_DEPTH: usize = 256;

/// The deepest element nesting in `xml`, by a linear scan of its tags (comments, declarations and
/// processing instructions aside); an upper bound good enough to refuse hostile input before parsing.
fn nesting_depth(xml: &str) -> usize {
    let bytes = xml.as_bytes();
    let (mut depth, mut max, mut i) = (0usize, 0usize, 0usize);
    while let Some(off) = bytes[i..].iter().position(|&b| b == b'<') {
        let start = i + off;
        let Some(end) = bytes[start..]
            .iter()
            .position(|&b| b == b'>')
            .map(|e| start + e)
        else {
            break;
        };
        match bytes.get(start + 1) {
            Some(b'/') => depth = depth.saturating_sub(1),
            Some(b'?' | b'!') => {}
            _ if bytes[end - 1] == b'/' => {}
            _ => {
                depth += 1;
                max = max.max(depth);
            }
        }
        i = end + 1;
    }
    max
}

fn child<'a>(node: roxmltree::Node<'a, 'a>, path: &[&str]) -> Option<roxmltree::Node<'a, 'a>> {
    let mut n = node;
    for name in path {
        n = n.children().find(|c| c.has_tag_name(*name))?;
    }
    Some(n)
}

fn child_text(node: roxmltree::Node, path: &[&str]) -> Option<String> {
    child(node, path)
        .and_then(|n| n.text())
        .map(|t| t.trim().to_string())
}

fn xyz(node: roxmltree::Node, name: &str) -> Option<[u32; 3]> {
    let n = child(node, &["who", name])?;
    let v = |axis: &str| {
        child_text(n, &[axis])
            .and_then(|t| t.parse().ok())
            .unwrap_or(0)
    };
    Some([v("x"), v("y"), v("z")])
}

fn xml_finding(record: roxmltree::Node) -> Finding {
    let exception = child_text(record, &["what", "exception"]);
    let text = child_text(record, &["what", "text"])
        .or_else(|| exception.clone())
        .unwrap_or_default();
    let error = child_text(record, &["what", "error"]).unwrap_or_default();
    let lower = format!("{text} {error}").to_lowercase();
    let kind = if let Some(e) = &exception {
        exception_kind(e)
    } else if lower.contains("misaligned") {
        FindingKind::Misaligned
    } else if lower.contains("uninitialized") {
        FindingKind::Uninitialized
    } else if lower.contains("race") || lower.contains("hazard") {
        FindingKind::Race
    } else if lower.contains("barrier") {
        FindingKind::Barrier
    } else if lower.contains("freed") {
        FindingKind::UseAfterFree
    } else if lower.contains("out of bounds") {
        FindingKind::OutOfBounds
    } else {
        FindingKind::Invalid
    };
    // Races name their two parties under what/source and what/destination; other records use where.
    let place = child(record, &["where"]).or_else(|| child(record, &["what", "source", "where"]));
    let at = |name: &str| place.and_then(|p| child_text(p, &[name]));
    let source = match (at("path"), at("line")) {
        (Some(p), Some(l)) => Some(format!("{}:{l}", p.rsplit('/').next().unwrap_or(&p))),
        _ => None,
    };
    let mut direction = child_text(record, &["what", "direction"]).map(|d| d.to_lowercase());
    let mut text = text;
    if kind == FindingKind::Race {
        let party = |side: &str| {
            let dir = child_text(record, &["what", side, "direction"])
                .unwrap_or_default()
                .to_lowercase();
            let line =
                child_text(record, &["what", side, "where", "line"]).unwrap_or_else(|| "?".into());
            format!("{dir} at line {line}")
        };
        let hazards =
            child_text(record, &["what", "destination", "count"]).unwrap_or_else(|| "?".into());
        text = format!(
            "race between {} and {} ({hazards} hazards)",
            party("source"),
            party("destination")
        );
    } else if kind == FindingKind::Uninitialized {
        direction.get_or_insert_with(|| "read".into());
    }
    Finding {
        kind: Some(kind),
        kernel: at("func").map(|f| short_kernel_name(&f)),
        pc: at("pc"),
        source,
        direction,
        size: child_text(record, &["what", "size"]).and_then(|s| s.parse().ok()),
        address: child_text(record, &["what", "address"]),
        thread: xyz(record, "threadIdx"),
        block: xyz(record, "blockIdx"),
        relation: None,
        text,
    }
}

/// Copies the allocation relation, which only the text report prints, onto XML findings with the same address.
pub fn attach_relations(xml: &mut [Finding], text: &[Finding]) {
    let by_address: BTreeMap<&str, &Finding> = text
        .iter()
        .filter_map(|f| Some((f.address.as_deref()?, f)))
        .collect();
    for f in xml.iter_mut() {
        let Some(t) = f.address.as_deref().and_then(|a| by_address.get(a)) else {
            continue;
        };
        f.relation = t.relation.clone();
        if t.kind == Some(FindingKind::UseAfterFree)
            || (f.kind == Some(FindingKind::Invalid) && t.kind.is_some())
        {
            f.kind = t.kind;
        }
    }
}

/// Identical reports folded into one: same kernel, pc and kind.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct FoldedFinding {
    /// A representative record (the first one).
    pub first: Finding,
    /// How many records were folded.
    pub count: usize,
    /// Lowest and highest thread index seen, per axis.
    pub threads: Option<[[u32; 2]; 3]>,
    /// Lowest and highest block index seen, per axis.
    pub blocks: Option<[[u32; 2]; 3]>,
}

impl FoldedFinding {
    /// One line: kind, kernel, access, relation, source, count and ranges.
    pub fn line(&self) -> String {
        let f = &self.first;
        let kind = f
            .kind
            .map(|k| format!("{k:?}"))
            .unwrap_or_else(|| "Invalid".into());
        let mut out = format!(
            "{} in {}{}: {}",
            kind,
            f.kernel.as_deref().unwrap_or("?"),
            f.pc.as_deref().map(|p| format!("+{p}")).unwrap_or_default(),
            describe(f)
        );
        if let Some(src) = &f.source {
            out.push_str(&format!(" at {src}"));
        }
        out.push_str(&format!(" ×{}", self.count));
        if let Some(t) = self.threads {
            out.push_str(&format!(", threads {}", range3(t)));
        }
        if let Some(b) = self.blocks {
            out.push_str(&format!(", blocks {}", range3(b)));
        }
        out
    }
}

fn range3(r: [[u32; 2]; 3]) -> String {
    let axis = |[lo, hi]: [u32; 2]| {
        if lo == hi {
            lo.to_string()
        } else {
            format!("{lo}-{hi}")
        }
    };
    format!("({},{},{})", axis(r[0]), axis(r[1]), axis(r[2]))
}

fn widen(range: &mut Option<[[u32; 2]; 3]>, v: Option<[u32; 3]>) {
    let Some(v) = v else { return };
    let r = range.get_or_insert([[v[0], v[0]], [v[1], v[1]], [v[2], v[2]]]);
    for axis in 0..3 {
        r[axis][0] = r[axis][0].min(v[axis]);
        r[axis][1] = r[axis][1].max(v[axis]);
    }
}

/// What makes two records the same report: kernel, pc and kind.
type FoldKey = (Option<String>, Option<String>, Option<FindingKind>);

/// Folds findings by (kernel, pc, kind), keeping first-seen order.
pub fn fold(findings: &[Finding]) -> Vec<FoldedFinding> {
    let mut order: Vec<FoldKey> = Vec::new();
    let mut groups: BTreeMap<FoldKey, FoldedFinding> = BTreeMap::new();
    for f in findings {
        let key = (f.kernel.clone(), f.pc.clone(), f.kind);
        let group = groups.entry(key.clone()).or_insert_with(|| {
            order.push(key);
            FoldedFinding {
                first: f.clone(),
                count: 0,
                threads: None,
                blocks: None,
            }
        });
        group.count += 1;
        widen(&mut group.threads, f.thread);
        widen(&mut group.blocks, f.block);
    }
    order
        .into_iter()
        .filter_map(|k| groups.remove(&k))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn xml_nested_past_any_report_is_refused_without_exhausting_the_stack() {
        let deep = format!("<a>{}{}</a>", "<b>".repeat(50_000), "</b>".repeat(50_000));
        let err = parse_xml(&deep).expect_err("refused");
        assert!(err.to_string().contains("nested deeper"), "{err}");
        let ok =
            "<?xml version=\"1.0\"?><!-- c --><root><record><kind>Api</kind><x/></record></root>";
        assert_eq!(nesting_depth(ok), 3);
        assert!(parse_xml(ok).expect("parsed").is_empty());
    }

    #[test]
    fn text_records_carry_kernel_thread_and_relation() {
        let log = "========= Invalid __global__ write of size 4 bytes\n=========     at write_oob(float *, int)+0xc0 in oob.cu:4\n=========     by thread (232,0,0) in block (3,0,0)\n=========     Access to 0x7f8b54800fa0 is out of bounds\n=========     and is 1 bytes after the nearest allocation at 0x7f8b54800000 of size 4,000 bytes\n========= \n";
        let lines: Vec<&str> = log.lines().collect();
        let f = &parse_text(&lines)[0];
        assert_eq!(f.kind, Some(FindingKind::OutOfBounds));
        assert_eq!(f.kernel.as_deref(), Some("write_oob"));
        assert_eq!(f.source.as_deref(), Some("oob.cu:4"));
        assert_eq!(f.thread, Some([232, 0, 0]));
        assert_eq!(
            describe(f),
            "write of 4 bytes, 1 bytes after an allocation of size 4,000 bytes"
        );
    }

    #[test]
    fn folding_counts_and_ranges() {
        let mk = |t: u32| Finding {
            kind: Some(FindingKind::OutOfBounds),
            kernel: Some("k".into()),
            pc: Some("0x10".into()),
            thread: Some([t, 0, 0]),
            block: Some([2, 0, 0]),
            ..Finding::default()
        };
        let folded = fold(&[mk(5), mk(1), mk(9)]);
        assert_eq!(folded.len(), 1);
        assert_eq!(folded[0].count, 3);
        assert!(
            folded[0]
                .line()
                .contains("threads (1-9,0,0), blocks (2,0,0)"),
            "{}",
            folded[0].line()
        );
    }

    #[test]
    fn broken_xml_is_an_error_not_a_panic() {
        assert!(parse_xml("<ComputeSanitizerOutput><record><kind>Pre").is_err());
        assert!(parse_xml("").is_err());
    }
}
