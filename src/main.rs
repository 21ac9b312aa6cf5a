//! The `prism` command line: parses flags, hands plain configuration to the
//! library, and prints results to stdout and progress to stderr.

mod cli;

use std::process::ExitCode;

fn main() -> ExitCode {
    prism::engine::allocator::reuse_freed_buffers();
    match cli::run() {
        Ok(()) => ExitCode::SUCCESS,
        Err(err) if is_broken_pipe(&err) => ExitCode::SUCCESS,
        Err(err) => {
            eprintln!("error: {}", one_line(&err));
            // The whole chain, with a backtrace when one was captured, for `PRISM_LOG=debug`.
            tracing::debug!("{err:?}");
            ExitCode::FAILURE
        }
    }
}

/// The error and its causes joined with ": ", leaving out a cause whose text
/// the message before it already ends with (the library's errors show their
/// source in their own message, for callers that print only that). Only the
/// first line of each is kept: with `RUST_BACKTRACE` set, candle's errors
/// carry a backtrace after theirs.
fn one_line(err: &anyhow::Error) -> String {
    let mut line = String::new();
    for cause in err.chain() {
        let text = cause.to_string();
        let text = text.lines().next().unwrap_or_default().trim_end();
        if text.is_empty() || line.ends_with(text) {
            continue;
        }
        if !line.is_empty() {
            line.push_str(": ");
        }
        line.push_str(text);
    }
    line
}

/// `prism … | head` closing the pipe early is not a failure.
fn is_broken_pipe(err: &anyhow::Error) -> bool {
    err.chain().any(|cause| {
        cause
            .downcast_ref::<std::io::Error>()
            .is_some_and(|io| io.kind() == std::io::ErrorKind::BrokenPipe)
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_cause_already_in_the_message_is_printed_once() {
        let missing = std::io::Error::new(std::io::ErrorKind::NotFound, "no such file");
        let err = anyhow::Error::new(prism::Error::io("book.txt", missing)).context("reading");
        assert_eq!(one_line(&err), "reading: book.txt: no such file");
    }

    #[test]
    fn a_backtrace_after_a_message_is_left_out() {
        let err = anyhow::anyhow!("shape mismatch\nstack backtrace:\n   0: candle_core::…")
            .context("loading model.gguf");
        assert_eq!(one_line(&err), "loading model.gguf: shape mismatch");
    }

    #[test]
    fn every_distinct_cause_is_kept() {
        let err = anyhow::anyhow!("bad header").context("loading model.gguf");
        assert_eq!(one_line(&err), "loading model.gguf: bad header");
    }
}
