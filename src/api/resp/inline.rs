//! Splitting an inline command line (`CL.THROTTLE user 15 30 60`, typed in telnet) into
//! arguments, with the quoting rules of Redis's `sdssplitargs`: whitespace separates,
//! `"..."` takes `\n \r \t \b \a \\ \" \xHH` escapes, `'...'` takes `\'`, and a closing quote
//! must end its argument. A line is bounded by the frame parser before it gets here.

use super::frame::ProtocolError;
use crate::api::hex_pair;
use bytes::Bytes;

/// The arguments of one inline line (without its line end), at most `max_args` of them (the
/// limit an array request has: a 64 KiB line of one-letter words would otherwise be 32,768
/// arguments).
pub fn split(line: &[u8], max_args: usize) -> Result<Vec<Bytes>, ProtocolError> {
    let mut args = Vec::new();
    let mut i = 0;
    loop {
        while line.get(i).is_some_and(|b| b.is_ascii_whitespace()) {
            i += 1;
        }
        if i >= line.len() {
            return Ok(args);
        }
        if args.len() == max_args {
            return Err(ProtocolError::TooManyElements {
                count: (args.len() + 1) as i64,
                max: max_args,
            });
        }
        let mut arg = Vec::new();
        i = one_arg(line, i, &mut arg)?;
        args.push(Bytes::from(arg));
    }
}

#[derive(Clone, Copy, PartialEq, Eq)]
enum Quote {
    None,
    Double,
    Single,
}

/// Reads one argument starting at `i` into `arg`; returns the index after it.
fn one_arg(line: &[u8], mut i: usize, arg: &mut Vec<u8>) -> Result<usize, ProtocolError> {
    let mut quote = Quote::None;
    loop {
        let Some(&c) = line.get(i) else {
            return match quote {
                Quote::None => Ok(i),
                _ => Err(ProtocolError::UnbalancedQuotes),
            };
        };
        match quote {
            Quote::None => match c {
                b'"' => quote = Quote::Double,
                b'\'' => quote = Quote::Single,
                c if c.is_ascii_whitespace() => return Ok(i),
                c => arg.push(c),
            },
            Quote::Double => match (c, line.get(i + 1).copied()) {
                (b'\\', Some(b'x')) if hex_pair(line, i + 2).is_some() => {
                    arg.extend(hex_pair(line, i + 2));
                    i += 3;
                }
                (b'\\', Some(e)) => {
                    arg.push(match e {
                        b'n' => b'\n',
                        b'r' => b'\r',
                        b't' => b'\t',
                        b'b' => 0x08,
                        b'a' => 0x07,
                        other => other,
                    });
                    i += 1;
                }
                (b'"', next) => {
                    closes_argument(next)?;
                    return Ok(i + 1);
                }
                (c, _) => arg.push(c),
            },
            Quote::Single => match (c, line.get(i + 1).copied()) {
                (b'\\', Some(b'\'')) => {
                    arg.push(b'\'');
                    i += 1;
                }
                (b'\'', next) => {
                    closes_argument(next)?;
                    return Ok(i + 1);
                }
                (c, _) => arg.push(c),
            },
        }
        i += 1;
    }
}

/// A closing quote must be followed by whitespace or the end of the line.
fn closes_argument(next: Option<u8>) -> Result<(), ProtocolError> {
    match next {
        Some(b) if !b.is_ascii_whitespace() => Err(ProtocolError::UnbalancedQuotes),
        _ => Ok(()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn words(line: &str) -> Result<Vec<String>, ProtocolError> {
        split(line.as_bytes(), 8).map(|a| {
            a.iter()
                .map(|b| String::from_utf8_lossy(b).into_owned())
                .collect()
        })
    }

    #[test]
    fn whitespace_separates_arguments() {
        assert_eq!(
            words("  CL.THROTTLE\tuser 15  30 60 ").unwrap(),
            ["CL.THROTTLE", "user", "15", "30", "60"]
        );
        assert_eq!(words("   ").unwrap(), Vec::<String>::new());
    }

    #[test]
    fn a_line_of_more_arguments_than_an_array_may_hold_is_refused() {
        assert_eq!(words("a b c d e f g h").unwrap().len(), 8);
        assert_eq!(words("a b c d e f g h   ").unwrap().len(), 8);
        assert_eq!(
            words("a b c d e f g h i"),
            Err(ProtocolError::TooManyElements { count: 9, max: 8 })
        );
    }

    #[test]
    fn double_quotes_take_escapes_and_spaces() {
        assert_eq!(
            words(r#"ECHO "a b\n\x41\"" x"#).unwrap(),
            ["ECHO", "a b\nA\"", "x"]
        );
        assert_eq!(words(r#"ECHO """#).unwrap(), ["ECHO", ""]);
        assert_eq!(words(r#"ECHO "\xZZ""#).unwrap(), ["ECHO", "xZZ"]);
    }

    #[test]
    fn single_quotes_take_only_an_escaped_quote() {
        assert_eq!(words(r"ECHO 'it\'s \n'").unwrap(), ["ECHO", "it's \\n"]);
    }

    #[test]
    fn a_quote_inside_a_word_starts_quoting_as_in_redis() {
        assert_eq!(words(r#"ECHO a"b c""#).unwrap(), ["ECHO", "ab c"]);
    }

    #[test]
    fn unbalanced_or_glued_quotes_are_protocol_errors() {
        for bad in [
            r#"ECHO "abc"#,
            "ECHO 'abc",
            r#"ECHO "a"b"#,
            "ECHO 'a'b",
            r#"ECHO "\"#,
        ] {
            assert_eq!(words(bad), Err(ProtocolError::UnbalancedQuotes), "{bad}");
        }
    }
}
