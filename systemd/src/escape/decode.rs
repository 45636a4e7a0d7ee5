//! An independent decoder for the tests: how systemd 252 reads back the lines that
//! [`super`] writes, modelled on its own code (`conf-parser.c` for lines,
//! `extract-word.c` + `escape.c:cunescape_one` for words, `specifier.c` for `%`,
//! `env-util.c:replace_env_argv` for `$`, `load-fragment.c` for the settings). It
//! shares nothing with the encoder, and fails on anything the encoder should never
//! produce (a specifier, a variable, a second command, a prefix on the program).
//! [`hostile`] is the corpus of values the tests feed through both.

pub type Decoded<T> = Result<T, String>;

const WHITESPACE: &[u8] = b" \t\n\r";

/// The value of a one-line `key=value`: the line must be one line to systemd (no
/// `\n`, `\r`, NUL, no continuation) and its value is stripped as systemd strips it.
pub fn value_of<'a>(line: &'a str, key: &str) -> Decoded<&'a str> {
    if line.contains(['\n', '\r', '\0']) {
        return Err("more than one line".into());
    }
    if continues(line) {
        return Err("continues on the next line".into());
    }
    let value = line
        .strip_prefix(key)
        .and_then(|rest| rest.strip_prefix('='))
        .ok_or_else(|| format!("not a {key}= line"))?;
    Ok(value.trim_matches([' ', '\t']))
}

/// conf-parser's rule: a line whose last `\` is unpaired continues on the next.
pub fn continues(line: &str) -> bool {
    let mut escaped = false;
    for b in line.bytes() {
        if escaped {
            escaped = false;
        } else if b == b'\\' {
            escaped = true;
        }
    }
    escaped
}

/// `extract_first_word(EXTRACT_UNQUOTE [| EXTRACT_CUNESCAPE])` from `*pos`: the next
/// word, `None` at the end. Leaves `*pos` at the start of the word after it.
pub fn next_word(s: &[u8], pos: &mut usize, cunescape: bool) -> Decoded<Option<Vec<u8>>> {
    skip_whitespace(s, pos);
    if *pos >= s.len() {
        return Ok(None);
    }
    let mut word = Vec::new();
    let mut quote = None;
    while let Some(&c) = s.get(*pos) {
        *pos += 1;
        if c == b'\\' {
            let Some(&next) = s.get(*pos) else {
                return Err("trailing backslash".into());
            };
            if cunescape {
                let (bytes, used) = cunescape_one(&s[*pos..])?;
                word.extend(bytes);
                *pos += used;
            } else {
                word.push(next);
                *pos += 1;
            }
        } else if let Some(q) = quote {
            if c == q {
                quote = None;
            } else {
                word.push(c);
            }
        } else if c == b'"' || c == b'\'' {
            quote = Some(c);
        } else if WHITESPACE.contains(&c) {
            skip_whitespace(s, pos);
            return Ok(Some(word));
        } else {
            word.push(c);
        }
    }
    if quote.is_some() {
        return Err("unbalanced quote".into());
    }
    Ok(Some(word))
}

fn skip_whitespace(s: &[u8], pos: &mut usize) {
    while s.get(*pos).is_some_and(|c| WHITESPACE.contains(c)) {
        *pos += 1;
    }
}

/// `cunescape_one` without `accept_nul`: the bytes of one escape (after its `\`)
/// and how many bytes of `p` it used.
fn cunescape_one(p: &[u8]) -> Decoded<(Vec<u8>, usize)> {
    let hex = |n: usize| -> Decoded<u32> {
        let digits = p.get(1..1 + n).ok_or("short escape")?;
        let text = std::str::from_utf8(digits).map_err(|e| e.to_string())?;
        u32::from_str_radix(text, 16).map_err(|e| e.to_string())
    };
    let char_bytes = |v: u32, used: usize| -> Decoded<(Vec<u8>, usize)> {
        match char::from_u32(v) {
            Some(c) if v != 0 => Ok((c.to_string().into_bytes(), used)),
            _ => Err("escaped NUL or invalid code point".into()),
        }
    };
    let simple = match p[0] {
        b'a' => 0x07,
        b'b' => 0x08,
        b'f' => 0x0c,
        b'n' => b'\n',
        b'r' => b'\r',
        b't' => b'\t',
        b'v' => 0x0b,
        b'\\' => b'\\',
        b'"' => b'"',
        b'\'' => b'\'',
        b's' => b' ',
        b'x' => {
            let v = hex(2)?;
            if v == 0 {
                return Err("escaped NUL".into());
            }
            return Ok((vec![v as u8], 3));
        }
        b'u' => return char_bytes(hex(4)?, 5),
        b'U' => return char_bytes(hex(8)?, 9),
        b'0'..=b'7' => {
            let digits = p.get(..3).ok_or("short octal escape")?;
            let text = std::str::from_utf8(digits).map_err(|e| e.to_string())?;
            let v = u32::from_str_radix(text, 8).map_err(|e| e.to_string())?;
            if v == 0 || v > 0xff {
                return Err("bad octal escape".into());
            }
            return Ok((vec![v as u8], 3));
        }
        other => return Err(format!("unknown escape \\{}", other as char)),
    };
    Ok((vec![simple], 1))
}

/// `specifier_printf`, failing on any specifier but `%%`.
pub fn specifiers(word: &[u8]) -> Decoded<Vec<u8>> {
    let mut out = Vec::with_capacity(word.len());
    let mut it = word.iter();
    while let Some(&c) = it.next() {
        if c != b'%' {
            out.push(c);
            continue;
        }
        match it.next() {
            Some(b'%') => out.push(b'%'),
            Some(&s) => return Err(format!("specifier %{}", s as char)),
            None => return Err("trailing %".into()),
        }
    }
    Ok(out)
}

/// `replace_env_argv` on one argument, failing on anything that would expand.
pub fn env_expand(word: &[u8]) -> Decoded<Vec<u8>> {
    if word.first() == Some(&b'$') && !matches!(word.get(1), Some(b'{' | b'$')) {
        return Err("a whole-word variable".into());
    }
    let mut out = Vec::with_capacity(word.len());
    let mut dollar = false;
    for &c in word {
        if !dollar {
            if c == b'$' {
                dollar = true;
            } else {
                out.push(c);
            }
            continue;
        }
        dollar = false;
        match c {
            b'{' => return Err("a ${variable}".into()),
            b'$' => out.push(b'$'),
            other => out.extend([b'$', other]),
        }
    }
    if dollar {
        out.push(b'$');
    }
    Ok(out)
}

fn utf8(bytes: Vec<u8>) -> Decoded<String> {
    String::from_utf8(bytes).map_err(|_| "not UTF-8".to_string())
}

/// An `Environment=` line holding one assignment: its name and value.
pub fn environment(line: &str) -> Decoded<(String, String)> {
    let value = value_of(line, "Environment")?.as_bytes();
    let mut pos = 0;
    let word = next_word(value, &mut pos, true)?.ok_or("no assignment")?;
    if next_word(value, &mut pos, true)?.is_some() {
        return Err("more than one assignment".into());
    }
    let assignment = utf8(specifiers(&word)?)?;
    let (name, value) = assignment.split_once('=').ok_or("no '='")?;
    let b = name.as_bytes();
    if b.is_empty()
        || b[0].is_ascii_digit()
        || !b.iter().all(|c| c.is_ascii_alphanumeric() || *c == b'_')
    {
        return Err("bad variable name".into());
    }
    Ok((name.to_string(), value.to_string()))
}

/// An `ExecStart=` line: the one command's argv as the process gets it.
pub fn exec_start(line: &str) -> Decoded<Vec<String>> {
    let value = value_of(line, "ExecStart")?.as_bytes();
    let mut pos = 0;
    let first = next_word(value, &mut pos, true)?.ok_or("no command")?;
    if first == b";" {
        return Err("a separator as the program".into());
    }
    if matches!(first.first(), Some(b'-' | b'@' | b':' | b'+' | b'!')) {
        return Err("a prefix on the program".into());
    }
    let path = utf8(specifiers(&first)?)?;
    let unsafe_char = |c: char| c.is_ascii_control() || matches!(c, '"' | '\'' | '\\');
    if !path.starts_with('/') || path.ends_with('/') || path.contains(unsafe_char) {
        return Err("a program systemd refuses".into());
    }
    let argv0 = utf8(env_expand(path.as_bytes())?)?;
    if argv0 != path {
        return Err("argv[0] differs from the program".into());
    }
    let mut argv = vec![argv0];
    while pos < value.len() {
        let rest = &value[pos..];
        let ends_word = |i: usize| rest.get(i).is_none_or(|c| WHITESPACE.contains(c));
        if rest[0] == b';' && ends_word(1) {
            return Err("a second command".into());
        }
        if rest.starts_with(b"\\;") && ends_word(2) {
            argv.push(";".into());
            pos += 2;
            skip_whitespace(value, &mut pos);
            continue;
        }
        let Some(word) = next_word(value, &mut pos, true)? else {
            break;
        };
        argv.push(utf8(env_expand(&specifiers(&word)?)?)?);
    }
    Ok(argv)
}

/// A `key=` line of one path that systemd neither splits nor unquotes.
pub fn path(line: &str, key: &str) -> Decoded<String> {
    utf8(specifiers(value_of(line, key)?.as_bytes())?)
}

/// A `key=` line of paths, unquoted but not C-unescaped.
pub fn path_list(line: &str, key: &str) -> Decoded<Vec<String>> {
    let value = value_of(line, key)?.as_bytes();
    let mut pos = 0;
    let mut paths = Vec::new();
    while let Some(word) = next_word(value, &mut pos, false)? {
        if matches!(word.first(), Some(b'-' | b'+')) {
            return Err("a prefix on a path".into());
        }
        paths.push(utf8(specifiers(&word)?)?);
    }
    Ok(paths)
}

/// Values meant to break out of a quoted word, a line or a section, or to be
/// expanded by systemd.
pub fn hostile() -> Vec<String> {
    let mut values: Vec<String> = [
        "\nExecStartPre=/bin/sh -c id",
        "\"\n[Service]",
        "\"\nExecStartPre=/bin/sh\n\"",
        "\r[Unit]\rX-Capstan-Host=evil",
        "%h",
        "%",
        "%%",
        "100%",
        "$(id)",
        "${HOME}",
        "$HOME",
        "$$",
        "$",
        "a$",
        "`id`",
        "\\\\",
        "trailing\\",
        "\\",
        "\\x41\\n\\;",
        "'single'",
        "\"double\"",
        "'",
        "\"",
        ";",
        "\\;",
        "a;b",
        "tab\there",
        "cr\rhere",
        "del\x7f",
        "soh\x01",
        "esc\x1b[31m",
        "é",
        "🦀 crab",
        "\u{85}next-line\u{2028}",
        "",
        " ",
        "  padded  ",
        "#not a comment",
        "[Unit]",
        "A=B C=D",
    ]
    .map(String::from)
    .to_vec();
    values.push("x".repeat(64 * 1024));
    values.push("é%$\\\"\n".repeat(4 * 1024));
    values
}
