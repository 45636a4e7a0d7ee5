//! The one way capstan renders an error for a log line or an answer: the error's
//! message, then each cause's after `": "`, outermost first — as `anyhow`'s `{:#}`
//! renders the binaries' errors, so a cause reads the same wherever it is printed.
//! (Each error's own message never repeats its cause: `#[source]` carries it.)

/// `e` and every cause under it: `"<e>: <cause>: <its cause>"`.
pub fn report(e: &dyn std::error::Error) -> String {
    let mut out = e.to_string();
    let mut source = e.source();
    while let Some(cause) = source {
        out.push_str(": ");
        out.push_str(&cause.to_string());
        source = cause.source();
    }
    out
}

#[cfg(test)]
mod tests {
    use super::report;

    #[derive(Debug, thiserror::Error)]
    #[error("outer")]
    struct Outer(#[source] Middle);

    #[derive(Debug, thiserror::Error)]
    #[error("middle")]
    struct Middle(#[source] std::io::Error);

    #[test]
    fn every_cause_follows_the_message_outermost_first() {
        let e = Outer(Middle(std::io::Error::other("inner")));
        assert_eq!(report(&e), "outer: middle: inner");
        assert_eq!(report(&std::io::Error::other("alone")), "alone");
    }

    #[test]
    fn it_reads_as_anyhow_renders_the_same_chain() {
        let e = Outer(Middle(std::io::Error::other("inner")));
        assert_eq!(report(&e), format!("{:#}", anyhow::Error::new(e)));
    }
}
