//! Splits a summary into the sentences a coherence judge looks at one by one.

/// Lines at least this long that stop without punctuation are taken as
/// hard-wrapped prose, and joined with the next line.
const WRAPPED_LINE_CHARS: usize = 40;

/// Abbreviations whose period usually does not end a sentence (lowercase,
/// without the final period). Dotted forms (`e.g.`, `U.S.`) are recognized by
/// their shape instead.
const ABBREVIATIONS: &[&str] = &[
    "mr", "mrs", "ms", "mx", "dr", "prof", "st", "jr", "sr", "rev", "hon", "gen", "col", "capt",
    "lt", "sgt", "maj", "cmdr", "adm", "gov", "sen", "rep", "pres", "fr", "mt", "ft", "ave",
    "blvd", "rd", "etc", "vs", "cf", "ca", "approx", "dept", "univ", "inc", "ltd", "co", "corp",
    "bros", "al",
];

/// Abbreviations that stand before a number (`No. 5`, `p. 12`).
const NUMBER_ABBREVIATIONS: &[&str] = &[
    "no", "nos", "vol", "vols", "fig", "figs", "ch", "chap", "sec", "p", "pp", "art", "op",
];

/// Words that commonly open a sentence: after an abbreviation or an initial,
/// one of these tells that the period also ended the sentence. Single letters
/// are left out, since initials follow initials (`J. A. Smith`).
const SENTENCE_OPENERS: &[&str] = &[
    "the",
    "this",
    "that",
    "these",
    "those",
    "he",
    "she",
    "it",
    "they",
    "we",
    "you",
    "his",
    "her",
    "its",
    "their",
    "our",
    "my",
    "there",
    "then",
    "but",
    "and",
    "so",
    "however",
    "meanwhile",
    "later",
    "after",
    "afterwards",
    "when",
    "while",
    "in",
    "on",
    "at",
    "as",
    "one",
    "some",
    "many",
    "finally",
    "eventually",
    "soon",
    "yet",
    "also",
    "both",
    "each",
    "all",
    "if",
    "although",
    "because",
    "since",
    "now",
    "today",
];

/// The sentences of `text`, trimmed, with runs of whitespace made single
/// spaces and list markers removed. Pieces with no letter or digit (rules
/// such as `---`) are dropped.
///
/// The text is first cut into blocks: a blank line, a heading (`# …`) or a
/// list item (`- …`, `* …`, `• …`, `1. …`, `2) …`) always starts a new block.
/// A single line break inside a paragraph joins the lines with a space unless
/// the line before ends in `:`, or is short and unpunctuated while the next
/// starts with a capital (a title above its text); long lines that stop
/// mid-sentence are taken as hard-wrapped prose.
///
/// Inside a block a sentence ends at `.`, `?`, `!`, `…` or a run of them
/// (`...`, `?!`), together with any closing quotes and brackets right after
/// (`He left.” She …` ends after `”`), when whitespace and then a capital, a
/// digit or an opening quote or bracket follow. So decimals (`3.5`), dotted
/// names (`example.com`) and lowercase continuations (`He waited... and
/// waited`) never split. After a known abbreviation (`Mr.`, `Dr.`, `St.`,
/// `etc.`, `e.g.`, `U.S.`) or an initial (`J. R. R. Tolkien`), the period
/// ends the sentence only when the next word is one that commonly opens a
/// sentence (`He`, `The`, `Then` …); after `No.`, `p.` and the like only when
/// no number follows. The ideographic `。！？` end a sentence wherever they are.
pub fn split_sentences(text: &str) -> Vec<String> {
    let mut sentences = Vec::new();
    for block in blocks(text) {
        split_block(&block, &mut sentences);
    }
    sentences
        .into_iter()
        .filter(|sentence| sentence.chars().any(char::is_alphanumeric))
        .collect()
}

/// The paragraphs, headings and list items of `text`, each on one line.
fn blocks(text: &str) -> Vec<String> {
    let mut blocks = Vec::new();
    let mut current = String::new();
    // The last line added to `current`, to decide whether the next one continues it.
    let mut last_line = "";
    let flush = |current: &mut String, blocks: &mut Vec<String>| {
        if !current.is_empty() {
            blocks.push(std::mem::take(current));
        }
    };
    for line in text.lines() {
        let line = line.trim();
        if line.is_empty() {
            flush(&mut current, &mut blocks);
            continue;
        }
        if let Some(heading) = strip_heading(line) {
            flush(&mut current, &mut blocks);
            blocks.push(heading.to_string());
            continue;
        }
        let (line, is_item) = match strip_list_marker(line) {
            Some(item) => (item, true),
            None => (line, false),
        };
        if is_item || (!current.is_empty() && !continues(last_line, line)) {
            flush(&mut current, &mut blocks);
        }
        if !current.is_empty() {
            current.push(' ');
        }
        current.push_str(line);
        last_line = line;
    }
    flush(&mut current, &mut blocks);
    blocks
}

/// Whether `next` goes on the paragraph whose last line is `previous`.
fn continues(previous: &str, next: &str) -> bool {
    if previous.ends_with(':') {
        return false;
    }
    let ends_punctuated = previous.trim_end_matches(is_closing).ends_with(is_terminal);
    let starts_lowercase = next.chars().next().is_some_and(char::is_lowercase);
    ends_punctuated || starts_lowercase || previous.chars().count() >= WRAPPED_LINE_CHARS
}

/// The text of a Markdown heading line (`## Title`), if it is one.
fn strip_heading(line: &str) -> Option<&str> {
    let rest = line.trim_start_matches('#');
    let hashes = line.len() - rest.len();
    (hashes > 0 && rest.starts_with(char::is_whitespace)).then(|| rest.trim())
}

/// The text of a list item (`- x`, `* x`, `• x`, `1. x`, `2) x`, `(3) x`,
/// `a) x`), if the line is one.
fn strip_list_marker(line: &str) -> Option<&str> {
    let after = |marker_len: usize| {
        let rest = &line[marker_len..];
        rest.starts_with(char::is_whitespace).then(|| rest.trim())
    };
    let first = line.chars().next()?;
    if matches!(first, '-' | '*' | '+' | '•' | '–' | '—' | '·') {
        return after(first.len_utf8());
    }
    let inner = line.strip_prefix('(').unwrap_or(line);
    let digits = inner.chars().take_while(char::is_ascii_digit).count();
    let label = if (1..=3).contains(&digits) {
        digits
    } else if inner.starts_with(|c: char| c.is_ascii_lowercase()) && inner[1..].starts_with(')') {
        1
    } else {
        return None;
    };
    let close = inner[label..].chars().next()?;
    let closes = if inner.len() < line.len() {
        close == ')'
    } else {
        close == ')' || (close == '.' && digits > 0)
    };
    closes.then(|| after(line.len() - inner.len() + label + 1))?
}

/// Characters that end a sentence.
fn is_terminal(c: char) -> bool {
    matches!(c, '.' | '?' | '!' | '…' | '。' | '！' | '？')
}

/// Ideographic terminals, which need no space after them.
fn is_ideographic_terminal(c: char) -> bool {
    matches!(c, '。' | '！' | '？')
}

/// Closing quotes and brackets that belong to the sentence they follow.
fn is_closing(c: char) -> bool {
    matches!(
        c,
        '"' | '\'' | '”' | '’' | ')' | ']' | '}' | '»' | '」' | '』'
    )
}

/// Whether `c` can open a sentence: a capital (or a letter of a script without
/// case), a digit, or an opening quote or bracket.
fn opens_sentence(c: char) -> bool {
    c.is_numeric()
        || (c.is_alphabetic() && !c.is_lowercase())
        || matches!(
            c,
            '"' | '\'' | '“' | '‘' | '(' | '[' | '«' | '¡' | '¿' | '「' | '『'
        )
}

/// Cut one block into sentences, appending them to `out`.
fn split_block(block: &str, out: &mut Vec<String>) {
    let chars: Vec<char> = block.chars().collect();
    let mut start = 0;
    let mut i = 0;
    while i < chars.len() {
        if !is_terminal(chars[i]) {
            i += 1;
            continue;
        }
        let mut end = i + 1;
        while end < chars.len() && is_terminal(chars[end]) {
            end += 1;
        }
        while end < chars.len() && is_closing(chars[end]) {
            end += 1;
        }
        if ends_sentence(&chars, start, i, end) {
            push_sentence(&chars[start..end], out);
            start = end;
        }
        i = end;
    }
    push_sentence(&chars[start..], out);
}

fn push_sentence(chars: &[char], out: &mut Vec<String>) {
    let text: String = chars.iter().collect();
    let sentence = text.split_whitespace().collect::<Vec<_>>().join(" ");
    if !sentence.is_empty() {
        out.push(sentence);
    }
}

/// Whether the terminal run `chars[punct..end]` (closing marks included),
/// in the sentence begun at `start`, ends that sentence.
fn ends_sentence(chars: &[char], start: usize, punct: usize, end: usize) -> bool {
    if chars[punct..end]
        .iter()
        .any(|&c| is_ideographic_terminal(c))
    {
        return true;
    }
    let Some(&after) = chars.get(end) else {
        return true;
    };
    if !after.is_whitespace() {
        return false;
    }
    let rest = &chars[end..];
    let Some(next_start) = rest.iter().position(|c| !c.is_whitespace()) else {
        return true;
    };
    let next = &rest[next_start..];
    if !opens_sentence(next[0]) {
        return false;
    }
    let single_period =
        chars[punct] == '.' && !chars.get(punct + 1).is_some_and(|&c| is_terminal(c));
    if !single_period {
        return true;
    }
    let word_start = chars[start..punct]
        .iter()
        .rposition(|c| c.is_whitespace())
        .map_or(start, |at| start + at + 1);
    let word: String = chars[word_start..punct]
        .iter()
        .skip_while(|&&c| opens_sentence(c) && !c.is_alphanumeric())
        .collect();
    match abbreviation_kind(&word) {
        None => true,
        Some(Abbreviation::BeforeNumber) => !next[0].is_numeric(),
        Some(Abbreviation::Plain) => SENTENCE_OPENERS.contains(&next_word(next).as_str()),
    }
}

enum Abbreviation {
    /// Ends a sentence only before a word that commonly opens one.
    Plain,
    /// Stands before a number; ends a sentence when no number follows.
    BeforeNumber,
}

/// What kind of abbreviation `word` (the text before a period) is, if any.
fn abbreviation_kind(word: &str) -> Option<Abbreviation> {
    let lower = word.to_lowercase();
    if NUMBER_ABBREVIATIONS.contains(&lower.as_str()) {
        return Some(Abbreviation::BeforeNumber);
    }
    let mut chars = word.chars();
    let is_initial = matches!((chars.next(), chars.next()), (Some(c), None) if c.is_uppercase());
    // e.g, i.e, a.m, U.S, Ph.D: short letter groups joined by periods.
    let is_dotted = lower.contains('.')
        && lower.split('.').all(|group| {
            (1..=2).contains(&group.chars().count()) && group.chars().all(char::is_alphabetic)
        });
    (is_initial || is_dotted || ABBREVIATIONS.contains(&lower.as_str()))
        .then_some(Abbreviation::Plain)
}

/// The first word of `text`, lowercase, without surrounding punctuation.
fn next_word(text: &[char]) -> String {
    text.iter()
        .skip_while(|c| !c.is_alphanumeric())
        .take_while(|c| c.is_alphanumeric())
        .flat_map(|c| c.to_lowercase())
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn split(text: &str) -> Vec<String> {
        split_sentences(text)
    }

    #[test]
    fn plain_sentences_split_on_their_punctuation() {
        assert_eq!(
            split("The council met. Was the budget passed? Yes! It was."),
            [
                "The council met.",
                "Was the budget passed?",
                "Yes!",
                "It was."
            ]
        );
    }

    #[test]
    fn the_last_sentence_may_lack_punctuation() {
        assert_eq!(
            split("  Anna left the farm.  She never came back  "),
            ["Anna left the farm.", "She never came back"]
        );
    }

    #[test]
    fn titles_before_names_do_not_split() {
        assert_eq!(
            split("Mr. and Mrs. Smith met Dr. Jones at St. Mary's church. They talked."),
            [
                "Mr. and Mrs. Smith met Dr. Jones at St. Mary's church.",
                "They talked."
            ]
        );
    }

    #[test]
    fn dotted_abbreviations_do_not_split_mid_sentence() {
        assert_eq!(
            split("Some fruit, e.g. Apples, i.e. Red ones, grew in the U.S. Army camp. It rained."),
            [
                "Some fruit, e.g. Apples, i.e. Red ones, grew in the U.S. Army camp.",
                "It rained."
            ]
        );
    }

    #[test]
    fn an_abbreviation_ends_a_sentence_before_a_sentence_opener() {
        assert_eq!(
            split(
                "She moved to the U.S. The move was hard. He bought pens, ink, etc. Then he wrote."
            ),
            [
                "She moved to the U.S.",
                "The move was hard.",
                "He bought pens, ink, etc.",
                "Then he wrote."
            ]
        );
        assert_eq!(
            split("They met at 5 p.m. He was late."),
            ["They met at 5 p.m.", "He was late."]
        );
    }

    #[test]
    fn initials_do_not_split() {
        assert_eq!(
            split("J. R. R. Tolkien wrote it. John F. Kennedy read it. J. A. Smith did not."),
            [
                "J. R. R. Tolkien wrote it.",
                "John F. Kennedy read it.",
                "J. A. Smith did not."
            ]
        );
    }

    #[test]
    fn number_abbreviations_split_only_without_a_number() {
        assert_eq!(
            split("See No. 5 on p. 12 for details. She said no. Mary left."),
            [
                "See No. 5 on p. 12 for details.",
                "She said no.",
                "Mary left."
            ]
        );
    }

    #[test]
    fn decimals_and_dotted_names_do_not_split() {
        assert_eq!(
            split("The budget grew by 3.5 percent to $2.75 million. See example.com. Done."),
            [
                "The budget grew by 3.5 percent to $2.75 million.",
                "See example.com.",
                "Done."
            ]
        );
    }

    #[test]
    fn a_number_may_open_the_next_sentence() {
        assert_eq!(
            split("It ended in 1990. 1991 was calm."),
            ["It ended in 1990.", "1991 was calm."]
        );
    }

    #[test]
    fn closing_quotes_and_brackets_stay_with_their_sentence() {
        assert_eq!(
            split("He said \"Go home.\" She left. (He stayed.) They wept.”"),
            [
                "He said \"Go home.\"",
                "She left.",
                "(He stayed.)",
                "They wept.”"
            ]
        );
        assert_eq!(
            split("“Leave now.” Anna obeyed. ‘Why?’ she asked later."),
            ["“Leave now.”", "Anna obeyed.", "‘Why?’ she asked later."]
        );
    }

    #[test]
    fn a_quoted_question_followed_by_lowercase_continues() {
        assert_eq!(
            split("\"Why?\" he asked. \"Because!\" she said."),
            ["\"Why?\" he asked.", "\"Because!\" she said."]
        );
    }

    #[test]
    fn ellipses_split_only_before_a_new_sentence() {
        assert_eq!(
            split("He waited... and waited… Then she came. Or did she…"),
            ["He waited... and waited…", "Then she came.", "Or did she…"]
        );
    }

    #[test]
    fn mixed_marks_end_once() {
        assert_eq!(
            split("Really?! Yes!! Fine."),
            ["Really?!", "Yes!!", "Fine."]
        );
    }

    #[test]
    fn bullets_and_numbered_items_are_sentences_without_their_markers() {
        let text = "Key events:\n- The mill burns down\n* Anna flees\n• Tom stays. He rebuilds.\n1. The town votes\n2) It agrees\n(3) It pays\na) The end";
        assert_eq!(
            split(text),
            [
                "Key events:",
                "The mill burns down",
                "Anna flees",
                "Tom stays.",
                "He rebuilds.",
                "The town votes",
                "It agrees",
                "It pays",
                "The end"
            ]
        );
    }

    #[test]
    fn headings_blank_lines_and_rules_separate() {
        let text = "## Summary\nThe story opens in winter\n\nSpring comes late\n---\n";
        assert_eq!(
            split(text),
            ["Summary", "The story opens in winter", "Spring comes late"]
        );
    }

    #[test]
    fn a_short_title_line_stands_alone() {
        assert_eq!(
            split("The Mill\nAnna works at the mill."),
            ["The Mill", "Anna works at the mill."]
        );
    }

    #[test]
    fn hard_wrapped_lines_join() {
        let text = "The council met on a cold Tuesday morning to discuss\nthe budget, and after a long debate it voted to cut the\nLibrary fund. Nobody objected.";
        assert_eq!(
            split(text),
            [
                "The council met on a cold Tuesday morning to discuss the budget, and after a long debate it voted to cut the Library fund.",
                "Nobody objected."
            ]
        );
    }

    #[test]
    fn an_abbreviation_at_a_line_end_joins_the_next_line() {
        assert_eq!(
            split("They called Dr.\nSmith at once."),
            ["They called Dr. Smith at once."]
        );
    }

    #[test]
    fn ideographic_marks_split_without_spaces() {
        assert_eq!(split("他走了。她留下。"), ["他走了。", "她留下。"]);
    }

    #[test]
    fn empty_and_punctuation_only_text_has_no_sentences() {
        assert!(split("").is_empty());
        assert!(split("  \n\n ... \n---").is_empty());
    }

    #[test]
    fn lowercase_after_a_period_does_not_split() {
        assert_eq!(
            split("The approx. figure was low. the end"),
            ["The approx. figure was low. the end"]
        );
    }
}
