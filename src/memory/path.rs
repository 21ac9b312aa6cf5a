//! Paths into a memory: parsing the JSONPath-like form models write, and printing
//! one canonical form back.

use std::fmt;
use std::str::FromStr;

/// One step of a path: a key of an object, or an index into a list.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Segment {
    Key(String),
    Index(usize),
}

/// A location in a memory, from the root down.
///
/// A path starts at the root `$` and descends one segment at a time:
///
/// ```text
/// $.attributes.'Noise Level'[0]
/// ```
///
/// - `.key` for keys that are plain identifiers (`[A-Za-z_][A-Za-z0-9_]*`);
/// - `.'any key'` for every other key, with `\'` and `\\` escaped inside;
/// - `[3]` for a list index.
///
/// That is what `Display` prints, and parsing it gives the same path back.
/// [`JsonPath::parse`] also accepts what models tend to write instead.
#[derive(Debug, Clone, Default, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct JsonPath {
    segments: Vec<Segment>,
}

/// Why a path did not parse, and where.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PathError {
    /// The text that was parsed.
    pub input: String,
    /// Character offset (not byte) where parsing stopped.
    pub at: usize,
    pub reason: String,
}

impl fmt::Display for PathError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "bad path `{}`: {} (at character {})",
            self.input, self.reason, self.at
        )
    }
}

impl std::error::Error for PathError {}

impl JsonPath {
    /// The root, `$`.
    pub fn root() -> Self {
        JsonPath::default()
    }

    pub fn from_segments(segments: Vec<Segment>) -> Self {
        JsonPath { segments }
    }

    /// Parse the canonical form or what models tend to write instead:
    /// `["key"]` and `['key']`, `."key"`, whitespace around segments
    /// (`$. 'a'. 'b'`), a bare key with spaces (`$.attributes.Noise Level`, up
    /// to the next `.` or `[`), and a missing leading `$`.
    pub fn parse(input: &str) -> Result<Self, PathError> {
        Parser::new(input).parse()
    }

    pub fn segments(&self) -> &[Segment] {
        &self.segments
    }

    pub fn is_root(&self) -> bool {
        self.segments.is_empty()
    }

    /// Number of segments below the root.
    pub fn len(&self) -> usize {
        self.segments.len()
    }

    pub fn is_empty(&self) -> bool {
        self.segments.is_empty()
    }

    pub fn last(&self) -> Option<&Segment> {
        self.segments.last()
    }

    /// The path one level up, or `None` at the root.
    pub fn parent(&self) -> Option<JsonPath> {
        let (_, init) = self.segments.split_last()?;
        Some(JsonPath::from_segments(init.to_vec()))
    }

    pub fn push(&mut self, segment: Segment) {
        self.segments.push(segment);
    }

    pub fn pop(&mut self) -> Option<Segment> {
        self.segments.pop()
    }

    /// This path extended by `key`.
    pub fn key(&self, key: impl Into<String>) -> JsonPath {
        let mut path = self.clone();
        path.push(Segment::Key(key.into()));
        path
    }

    /// This path extended by `[index]`.
    pub fn index(&self, index: usize) -> JsonPath {
        let mut path = self.clone();
        path.push(Segment::Index(index));
        path
    }

    /// Whether `prefix` is this path or one of its ancestors.
    pub fn starts_with(&self, prefix: &JsonPath) -> bool {
        self.segments.starts_with(&prefix.segments)
    }
}

/// True for keys printed without quotes: `[A-Za-z_][A-Za-z0-9_]*`.
pub(crate) fn is_plain_key(key: &str) -> bool {
    let mut chars = key.chars();
    match chars.next() {
        Some(c) if c.is_ascii_alphabetic() || c == '_' => {}
        _ => return false,
    }
    chars.all(|c| c.is_ascii_alphanumeric() || c == '_')
}

impl fmt::Display for Segment {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Segment::Index(index) => write!(f, "[{index}]"),
            Segment::Key(key) if is_plain_key(key) => write!(f, ".{key}"),
            Segment::Key(key) => {
                f.write_str(".'")?;
                for c in key.chars() {
                    if c == '\'' || c == '\\' {
                        f.write_str("\\")?;
                    }
                    write!(f, "{c}")?;
                }
                f.write_str("'")
            }
        }
    }
}

impl fmt::Display for JsonPath {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("$")?;
        for segment in &self.segments {
            write!(f, "{segment}")?;
        }
        Ok(())
    }
}

impl FromStr for JsonPath {
    type Err = PathError;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        JsonPath::parse(s)
    }
}

impl serde::Serialize for JsonPath {
    fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.collect_str(self)
    }
}

impl<'de> serde::Deserialize<'de> for JsonPath {
    fn deserialize<D: serde::Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        let text = String::deserialize(deserializer)?;
        JsonPath::parse(&text).map_err(serde::de::Error::custom)
    }
}

/// A hand-written scanner over the characters of one path.
struct Parser<'a> {
    input: &'a str,
    chars: Vec<char>,
    pos: usize,
}

impl<'a> Parser<'a> {
    fn new(input: &'a str) -> Self {
        Parser {
            input,
            chars: input.chars().collect(),
            pos: 0,
        }
    }

    fn error(&self, reason: impl Into<String>) -> PathError {
        PathError {
            input: self.input.to_string(),
            at: self.pos,
            reason: reason.into(),
        }
    }

    fn peek(&self) -> Option<char> {
        self.chars.get(self.pos).copied()
    }

    fn skip_whitespace(&mut self) {
        while self.peek().is_some_and(char::is_whitespace) {
            self.pos += 1;
        }
    }

    fn parse(mut self) -> Result<JsonPath, PathError> {
        let mut path = JsonPath::root();
        self.skip_whitespace();
        match self.peek() {
            None => return Err(self.error("empty path; the root is `$`")),
            Some('$') => self.pos += 1,
            // Tolerate a missing `$`: `.a`, `[0]` and `a.b` all start at the root.
            Some('.') | Some('[') => {}
            Some(_) => path.push(self.key_after_dot()?),
        }
        loop {
            self.skip_whitespace();
            match self.peek() {
                None => return Ok(path),
                Some('.') => {
                    self.pos += 1;
                    path.push(self.key_after_dot()?);
                }
                Some('[') => {
                    self.pos += 1;
                    path.push(self.bracketed()?);
                }
                Some(c) => return Err(self.error(format!("expected `.` or `[`, found `{c}`"))),
            }
        }
    }

    /// After a `.`: a quoted key or a bare one.
    fn key_after_dot(&mut self) -> Result<Segment, PathError> {
        self.skip_whitespace();
        match self.peek() {
            Some(quote @ ('\'' | '"')) => {
                self.pos += 1;
                self.quoted(quote).map(Segment::Key)
            }
            _ => self.bare().map(Segment::Key),
        }
    }

    /// A bare key runs to the next `.` or `[`; surrounding spaces are dropped.
    fn bare(&mut self) -> Result<String, PathError> {
        let start = self.pos;
        while let Some(c) = self.peek() {
            match c {
                '.' | '[' => break,
                '\'' | '"' | ']' | '$' => {
                    return Err(self.error(format!(
                        "`{c}` inside an unquoted key; quote the key as .'…'"
                    )))
                }
                _ => self.pos += 1,
            }
        }
        let key: String = self.chars[start..self.pos].iter().collect();
        let key = key.trim();
        if key.is_empty() {
            self.pos = start;
            return Err(self.error("expected a key"));
        }
        Ok(key.to_string())
    }

    /// The text of a quoted key, after its opening quote; `\x` stands for `x`.
    fn quoted(&mut self, quote: char) -> Result<String, PathError> {
        let mut key = String::new();
        loop {
            match self.peek() {
                None => {
                    return Err(self.error(format!("unterminated key: missing closing {quote}")))
                }
                Some('\\') => {
                    self.pos += 1;
                    match self.peek() {
                        Some(c) => key.push(c),
                        None => return Err(self.error("path ends inside an escape")),
                    }
                    self.pos += 1;
                }
                Some(c) if c == quote => {
                    self.pos += 1;
                    return Ok(key);
                }
                Some(c) => {
                    key.push(c);
                    self.pos += 1;
                }
            }
        }
    }

    /// After a `[`: a quoted key or an index, then `]`.
    fn bracketed(&mut self) -> Result<Segment, PathError> {
        self.skip_whitespace();
        let segment = match self.peek() {
            Some(quote @ ('\'' | '"')) => {
                self.pos += 1;
                Segment::Key(self.quoted(quote)?)
            }
            Some(c) if c.is_ascii_digit() => {
                let start = self.pos;
                while self.peek().is_some_and(|c| c.is_ascii_digit()) {
                    self.pos += 1;
                }
                let digits: String = self.chars[start..self.pos].iter().collect();
                let index = digits.parse::<usize>().map_err(|_| {
                    self.pos = start;
                    self.error(format!("index {digits} is too large"))
                })?;
                Segment::Index(index)
            }
            Some('-') => return Err(self.error("negative indices are not supported")),
            Some(c) => {
                return Err(self.error(format!("expected an index or a quoted key, found `{c}`")))
            }
            None => return Err(self.error("path ends after `[`")),
        };
        self.skip_whitespace();
        match self.peek() {
            Some(']') => {
                self.pos += 1;
                Ok(segment)
            }
            _ => Err(self.error("expected `]`")),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn key(k: &str) -> Segment {
        Segment::Key(k.to_string())
    }

    #[test]
    fn prints_the_canonical_form() {
        let path = JsonPath::from_segments(vec![
            key("attributes"),
            key("Noise Level"),
            Segment::Index(0),
            key("it's"),
            key(r"a\b"),
            key(""),
            key("9lives"),
        ]);
        assert_eq!(
            path.to_string(),
            r"$.attributes.'Noise Level'[0].'it\'s'.'a\\b'.''.'9lives'"
        );
        assert_eq!(JsonPath::root().to_string(), "$");
    }

    #[test]
    fn accepts_the_spellings_models_write() {
        let expected = JsonPath::from_segments(vec![key("attributes"), key("Noise Level")]);
        for text in [
            "$.attributes.'Noise Level'",
            "$. 'attributes'. 'Noise Level'",
            "$['attributes'][\"Noise Level\"]",
            "$.attributes[ 'Noise Level' ]",
            "$.\"attributes\".\"Noise Level\"",
            "$.attributes.Noise Level",
            "attributes.Noise Level",
            ".attributes.'Noise Level'",
            "  $.attributes.'Noise Level'  ",
        ] {
            assert_eq!(JsonPath::parse(text), Ok(expected.clone()), "{text}");
        }
        assert_eq!(
            JsonPath::parse("$.list[12].x").unwrap().segments(),
            &[key("list"), Segment::Index(12), key("x")]
        );
        assert_eq!(JsonPath::parse("$"), Ok(JsonPath::root()));
        assert_eq!(
            JsonPath::parse("[0]").unwrap().segments(),
            &[Segment::Index(0)]
        );
    }

    #[test]
    fn errors_say_what_went_wrong() {
        for (text, reason) in [
            ("", "empty path"),
            ("$.", "expected a key"),
            ("$.a..b", "expected a key"),
            ("$.'open", "unterminated"),
            ("$[1", "expected `]`"),
            ("$[-1]", "negative"),
            ("$[x]", "expected an index"),
            ("$[99999999999999999999999]", "too large"),
            ("$x", "expected `.` or `[`"),
            ("$.a'b", "inside an unquoted key"),
            ("$[", "ends after"),
        ] {
            let err = JsonPath::parse(text).unwrap_err();
            assert!(err.reason.contains(reason), "{text}: {err}");
            assert!(err.to_string().contains(&format!("`{text}`")), "{err}");
        }
    }

    #[test]
    fn serde_uses_the_string_form() {
        let path = JsonPath::parse("$.a.'b c'[2]").unwrap();
        let json = serde_json::to_string(&path).unwrap();
        assert_eq!(json, r#""$.a.'b c'[2]""#);
        assert_eq!(serde_json::from_str::<JsonPath>(&json).unwrap(), path);
        assert!(serde_json::from_str::<JsonPath>(r#""$[""#).is_err());
    }

    #[test]
    fn navigation_helpers() {
        let path = JsonPath::root().key("a").index(3);
        assert_eq!(path.to_string(), "$.a[3]");
        assert_eq!(path.parent(), Some(JsonPath::root().key("a")));
        assert!(path.starts_with(&JsonPath::root().key("a")));
        assert_eq!(JsonPath::root().parent(), None);
    }

    fn segment() -> impl Strategy<Value = Segment> {
        prop_oneof![
            any::<String>().prop_map(Segment::Key),
            "[a-z_][a-z0-9_]{0,6}".prop_map(Segment::Key),
            "[ '\"\\\\.\\[\\]$a-z]{0,6}".prop_map(Segment::Key),
            any::<usize>().prop_map(Segment::Index),
        ]
    }

    proptest! {
        #[test]
        fn printing_then_parsing_round_trips(segments in prop::collection::vec(segment(), 0..6)) {
            let path = JsonPath::from_segments(segments);
            let text = path.to_string();
            prop_assert_eq!(JsonPath::parse(&text), Ok(path));
        }

        #[test]
        fn parsing_never_panics_and_reprints_stably(text in "\\PC{0,24}") {
            if let Ok(path) = JsonPath::parse(&text) {
                let canonical = path.to_string();
                prop_assert_eq!(JsonPath::parse(&canonical), Ok(path));
            }
        }
    }
}
