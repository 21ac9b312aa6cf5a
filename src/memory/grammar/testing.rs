//! Reading grammars in tests: whether one accepts a text, and GBNF read as Lark.

use super::lark_string;
use llguidance::api::TopLevelGrammar;
use llguidance::{Matcher, ParserFactory};

/// Whether a Lark grammar accepts `text` whole, read one byte per token.
pub fn accepts(lark: &str, text: &str) -> bool {
    let env = toktrie::ApproximateTokEnv::single_byte_env();
    let mut factory = ParserFactory::new_simple(&env).unwrap();
    factory.quiet();
    let mut matcher =
        Matcher::new(factory.create_parser(TopLevelGrammar::from_lark(lark.to_string())));
    assert_eq!(matcher.get_error(), None, "{lark}");
    let tokens: Vec<u32> = text.bytes().map(u32::from).collect();
    matcher.validate_tokens(&tokens).unwrap() == tokens.len()
        && matcher.consume_tokens(&tokens).is_ok()
        && matcher.is_accepting().unwrap()
}

/// GBNF read into llguidance's Lark, which has no GBNF reader: rules
/// keep their names (`-` becomes `_`), literals are quoted again and
/// classes become regular expressions. It reads what prism's GBNF
/// renderings write, one rule a line, and nothing else.
pub fn lark_of_gbnf(gbnf: &str) -> String {
    let mut lark = String::from("start: root\n");
    for rule in gbnf.lines() {
        let (name, body) = rule.split_once(" ::= ").expect("one rule a line");
        lark += &format!("{}: {}\n", name.replace('-', "_"), lark_body(body));
    }
    lark
}

fn lark_body(body: &str) -> String {
    let mut out = String::new();
    let mut chars = body.chars();
    while let Some(c) = chars.next() {
        match c {
            '"' => {
                let mut text = String::new();
                loop {
                    match chars.next().expect("a literal ends") {
                        '"' => break,
                        '\\' => text.push(unescape(&mut chars)),
                        c => text.push(c),
                    }
                }
                out += &lark_string(&text);
            }
            '[' => {
                out += "/[";
                loop {
                    match chars.next().expect("a class ends") {
                        ']' => break,
                        '\\' => out += &format!("\\x{{{:X}}}", u32::from(unescape(&mut chars))),
                        '/' => out += "\\/",
                        c => out.push(c),
                    }
                }
                out += "]/";
            }
            '-' => out.push('_'),
            c => out.push(c),
        }
    }
    out
}

/// The character a GBNF escape stands for, the backslash already read.
fn unescape(chars: &mut std::str::Chars) -> char {
    let digits = match chars.next().expect("an escaped character") {
        'x' => 2,
        'u' => 4,
        'U' => 8,
        'n' => return '\n',
        'r' => return '\r',
        't' => return '\t',
        c => return c,
    };
    let hex: String = chars.take(digits).collect();
    char::from_u32(u32::from_str_radix(&hex, 16).unwrap()).unwrap()
}
