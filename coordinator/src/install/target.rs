//! Where to install: `user@host[:port]`, one on the command line or one a line in a
//! hosts file (`#` starts a comment). An IPv6 address is written in brackets:
//! `root@[fd00::2]:22`.

use std::fmt;

/// One SSH destination.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Target {
    pub user: String,
    /// A name or address, without brackets.
    pub host: String,
    pub port: u16,
}

#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum TargetError {
    #[error("{text:?} is not user@host[:port]: {why}")]
    Invalid { text: String, why: &'static str },
    #[error("line {line} of the hosts file: {source}")]
    Line {
        line: usize,
        #[source]
        source: Box<TargetError>,
    },
    #[error("the hosts file names {host} twice (lines {first} and {second})")]
    Duplicate {
        host: String,
        first: usize,
        second: usize,
    },
    #[error("the hosts file names no host")]
    Empty,
}

impl fmt::Display for Target {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.host.contains(':') {
            write!(f, "{}@[{}]:{}", self.user, self.host, self.port)
        } else {
            write!(f, "{}@{}:{}", self.user, self.host, self.port)
        }
    }
}

impl std::str::FromStr for Target {
    type Err = TargetError;

    fn from_str(text: &str) -> Result<Target, TargetError> {
        let invalid = |why| TargetError::Invalid {
            text: text.to_string(),
            why,
        };
        let (user, rest) = text.split_once('@').ok_or_else(|| invalid("no user@"))?;
        if user.is_empty() || user.contains(char::is_whitespace) {
            return Err(invalid("an empty or blank user"));
        }
        let (host, port) = if let Some(inner) = rest.strip_prefix('[') {
            let (host, after) = inner
                .split_once(']')
                .ok_or_else(|| invalid("no closing ]"))?;
            match after {
                "" => (host, None),
                _ => (
                    host,
                    Some(
                        after
                            .strip_prefix(':')
                            .ok_or_else(|| invalid("junk after ]"))?,
                    ),
                ),
            }
        } else {
            match rest.split_once(':') {
                Some((host, port)) => (host, Some(port)),
                None => (rest, None),
            }
        };
        if host.is_empty() || host.contains(|c: char| c.is_whitespace() || c == '/' || c == '@') {
            return Err(invalid("an empty or malformed host"));
        }
        let port = match port {
            None => 22,
            Some(p) => p
                .parse::<u16>()
                .ok()
                .filter(|p| *p != 0)
                .ok_or_else(|| invalid("the port is not 1-65535"))?,
        };
        Ok(Target {
            user: user.to_string(),
            host: host.to_string(),
            port,
        })
    }
}

/// The targets of a hosts file's text, in order; a host named twice is an error.
pub fn parse_hosts_file(text: &str) -> Result<Vec<Target>, TargetError> {
    let mut targets: Vec<(usize, Target)> = Vec::new();
    for (i, line) in text.lines().enumerate() {
        let line_no = i + 1;
        let entry = line.split('#').next().unwrap_or_default().trim();
        if entry.is_empty() {
            continue;
        }
        let target: Target = entry.parse().map_err(|e| TargetError::Line {
            line: line_no,
            source: Box::new(e),
        })?;
        if let Some((first, _)) = targets
            .iter()
            .find(|(_, t)| t.host == target.host && t.port == target.port)
        {
            return Err(TargetError::Duplicate {
                host: target.host,
                first: *first,
                second: line_no,
            });
        }
        targets.push((line_no, target));
    }
    if targets.is_empty() {
        return Err(TargetError::Empty);
    }
    Ok(targets.into_iter().map(|(_, t)| t).collect())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn t(user: &str, host: &str, port: u16) -> Target {
        Target {
            user: user.into(),
            host: host.into(),
            port,
        }
    }

    #[test]
    fn user_host_and_port_parse() {
        assert_eq!("root@web-1".parse(), Ok(t("root", "web-1", 22)));
        assert_eq!("ops@10.0.0.2:2222".parse(), Ok(t("ops", "10.0.0.2", 2222)));
        assert_eq!("root@[fd00::2]:23".parse(), Ok(t("root", "fd00::2", 23)));
        assert_eq!("root@[fd00::2]".parse(), Ok(t("root", "fd00::2", 22)));
        assert_eq!(t("root", "fd00::2", 23).to_string(), "root@[fd00::2]:23");
        assert_eq!(t("root", "web-1", 22).to_string(), "root@web-1:22");
    }

    #[test]
    fn malformed_targets_are_refused() {
        for bad in [
            "web-1",
            "@web-1",
            "root@",
            "root@web-1:0",
            "root@web-1:x",
            "root@web:1:2",
            "root@[fd00::2",
        ] {
            let err = bad.parse::<Target>();
            assert!(
                matches!(err, Err(TargetError::Invalid { ref text, .. }) if text == bad),
                "{bad}: {err:?}"
            );
        }
    }

    #[test]
    fn a_hosts_file_has_comments_blank_lines_and_one_target_a_line() {
        let text = "# the web tier\nroot@web-1\n\n  root@web-2:2222  # a comment\nops@db-1\n";
        assert_eq!(
            parse_hosts_file(text),
            Ok(vec![
                t("root", "web-1", 22),
                t("root", "web-2", 2222),
                t("ops", "db-1", 22)
            ])
        );
    }

    #[test]
    fn a_hosts_file_error_names_the_line() {
        let err = parse_hosts_file("root@web-1\nweb-2\n").unwrap_err();
        assert!(matches!(err, TargetError::Line { line: 2, .. }), "{err:?}");
        assert_eq!(
            parse_hosts_file("root@a\n# x\nops@a:22\n"),
            Err(TargetError::Duplicate {
                host: "a".into(),
                first: 1,
                second: 3
            })
        );
        assert_eq!(parse_hosts_file("# nothing\n\n"), Err(TargetError::Empty));
    }
}
