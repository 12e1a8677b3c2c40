//! Kernel names as people say them: a demangled C++ signature shortened to its qualified name.

/// Shortens a demangled kernel name: drops the return type, template arguments and parameters.
pub fn short_kernel_name(name: &str) -> String {
    let mut s = name.trim().trim_start_matches("void ").to_string();
    if s.ends_with(')') {
        if let Some(open) = matching_open(&s, '(', ')') {
            s.truncate(open);
        }
    }
    let mut out = String::new();
    let mut depth = 0usize;
    for ch in s.chars() {
        match ch {
            '<' => depth += 1,
            '>' => depth = depth.saturating_sub(1),
            _ if depth == 0 => out.push(ch),
            _ => {}
        }
    }
    // A parameter list a paste cut off before its `)` still starts the parameters.
    let out = match out.find('(') {
        Some(i) if !out.starts_with("(anonymous") => &out[..i],
        _ => out.as_str(),
    };
    let out = out.trim();
    let name = out.rsplit(' ').next().unwrap_or(out);
    // A Windows-style `file.cc:148:func` location prefix is not part of the name.
    let name = name
        .rsplit_once(':')
        .filter(|(p, _)| p.ends_with(|c: char| c.is_ascii_digit()))
        .map_or(name, |(_, n)| n);
    if name.ends_with("operator") {
        // `operator()` lost its parentheses with the parameter list.
        return format!("{name}()");
    }
    name.to_string()
}

fn matching_open(s: &str, open: char, close: char) -> Option<usize> {
    let mut depth = 0i32;
    for (i, ch) in s.char_indices().rev() {
        if ch == close {
            depth += 1;
        } else if ch == open {
            depth -= 1;
            if depth == 0 {
                return Some(i);
            }
        }
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn kernel_names_are_shortened() {
        assert_eq!(
            short_kernel_name("void k(float *, unsigned long long, int)"),
            "k"
        );
        assert_eq!(
            short_kernel_name("void at::native::vectorized_elementwise_kernel<(int)4, at::native::FillFunctor<unsigned char>>(int, T2, T3)"),
            "at::native::vectorized_elementwise_kernel"
        );
        assert_eq!(
            short_kernel_name("indexSelectSmallIndex"),
            "indexSelectSmallIndex"
        );
        assert_eq!(short_kernel_name("write_oob(float *, int)"), "write_oob");
    }
}
