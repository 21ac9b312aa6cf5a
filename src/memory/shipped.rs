//! The schemas of `schemas/`, compiled into the binary, so that a schema can
//! be named (`--schema book`) wherever prism runs, not only in its checkout.

pub const BOOK: &str = include_str!("../../schemas/book.json");
pub const COK_BOOK: &str = include_str!("../../schemas/cok-book.json");
pub const CODE: &str = include_str!("../../schemas/code.json");
pub const ENTITY: &str = include_str!("../../schemas/entity.json");
pub const SQL: &str = include_str!("../../schemas/sql.json");
pub const SUMMARY: &str = include_str!("../../schemas/summary.json");

/// Every shipped schema by name: its file name without `.json`.
pub const ALL: [(&str, &str); 6] = [
    ("book", BOOK),
    ("cok-book", COK_BOOK),
    ("code", CODE),
    ("entity", ENTITY),
    ("sql", SQL),
    ("summary", SUMMARY),
];

/// The text of the shipped schema called `name`.
pub fn text(name: &str) -> Option<&'static str> {
    ALL.iter()
        .find(|(shipped, _)| *shipped == name)
        .map(|(_, text)| *text)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::memory::Schema;

    #[test]
    fn every_file_in_schemas_is_shipped_as_it_is() {
        let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("schemas");
        let mut files: Vec<String> = std::fs::read_dir(&dir)
            .unwrap()
            .map(|entry| entry.unwrap().path())
            .filter(|path| path.extension().is_some_and(|ext| ext == "json"))
            .map(|path| path.file_stem().unwrap().to_string_lossy().into_owned())
            .collect();
        files.sort();
        let mut names: Vec<&str> = ALL.iter().map(|(name, _)| *name).collect();
        names.sort();
        assert_eq!(files, names);
        for (name, shipped) in ALL {
            let file = std::fs::read_to_string(dir.join(format!("{name}.json"))).unwrap();
            assert_eq!(file, shipped);
            let value = serde_json::from_str(shipped).unwrap();
            Schema::from_value(&value).unwrap_or_else(|err| panic!("{name}: {err}"));
        }
    }

    #[test]
    fn names_are_file_stems() {
        assert_eq!(text("book"), Some(BOOK));
        assert_eq!(text("book.json"), None);
        assert_eq!(text("schemas/book.json"), None);
    }
}
