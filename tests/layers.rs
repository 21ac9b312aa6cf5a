//! The library's modules are layered, and every `use` points down the
//! layers: a module names only the modules listed before it in `LAYERS`
//! (what `src/lib.rs` documents). A new upward import fails here, naming the
//! file and the module it reached for.

use std::path::Path;

/// The top-level modules of the library, lowest first.
const LAYERS: [&str; 18] = [
    "error",
    "document",
    "chunk",
    "sentences",
    "engine",
    "models",
    "metrics",
    "llm",
    "memory",
    "run",
    "qa",
    "methods",
    "schema_gen",
    "job",
    "quality",
    "bench",
    "serve",
    "cli",
];

fn rank(module: &str) -> Option<usize> {
    LAYERS.iter().position(|layer| *layer == module)
}

/// The top-level modules `source` names as `crate::x` or `prism::x`,
/// including those inside grouped imports (`use crate::{a::B, c}`). Tests
/// (everything from the first `#[cfg(test)]`) are left out.
fn modules_named(source: &str) -> Vec<String> {
    let code = source.split("#[cfg(test)]").next().unwrap_or_default();
    let mut named = Vec::new();
    for prefix in ["crate::", "prism::"] {
        for (at, _) in code.match_indices(prefix) {
            let rest = &code[at + prefix.len()..];
            if let Some(group) = rest.strip_prefix('{') {
                named.extend(first_names_in_group(group));
            } else {
                named.push(identifier(rest));
            }
        }
    }
    named.retain(|name| !name.is_empty());
    named
}

/// The first identifier of each comma-separated item of a `{…}` group.
fn first_names_in_group(group: &str) -> Vec<String> {
    let mut names = vec![identifier(group.trim_start())];
    let mut depth = 1;
    for (at, c) in group.char_indices() {
        match c {
            '{' => depth += 1,
            '}' => {
                depth -= 1;
                if depth == 0 {
                    break;
                }
            }
            ',' if depth == 1 => names.push(identifier(group[at + 1..].trim_start())),
            _ => {}
        }
    }
    names
}

fn identifier(text: &str) -> String {
    text.chars()
        .take_while(|c| c.is_ascii_alphanumeric() || *c == '_')
        .collect()
}

fn rust_files(dir: &Path, found: &mut Vec<std::path::PathBuf>) {
    for entry in std::fs::read_dir(dir).unwrap() {
        let path = entry.unwrap().path();
        if path.is_dir() {
            rust_files(&path, found);
        } else if path.extension().is_some_and(|ext| ext == "rs") {
            found.push(path);
        }
    }
}

#[test]
fn every_import_points_down_the_layers() {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let mut files = Vec::new();
    rust_files(&src, &mut files);
    let mut upward = Vec::new();
    let mut unlisted = Vec::new();
    for file in &files {
        let relative = file.strip_prefix(&src).unwrap();
        let top = relative
            .components()
            .next()
            .unwrap()
            .as_os_str()
            .to_string_lossy()
            .trim_end_matches(".rs")
            .to_string();
        if top == "lib" || top == "main" {
            continue;
        }
        let Some(own) = rank(&top) else {
            unlisted.push(top);
            continue;
        };
        let source = std::fs::read_to_string(file).unwrap();
        for module in modules_named(&source) {
            if rank(&module).is_some_and(|other| other > own) {
                upward.push(format!("{} uses {module}", relative.display()));
            }
        }
    }
    unlisted.sort();
    unlisted.dedup();
    assert!(
        unlisted.is_empty(),
        "modules missing from LAYERS: {unlisted:?}"
    );
    upward.sort();
    upward.dedup();
    assert!(
        upward.is_empty(),
        "imports that point up the layers: {upward:#?}"
    );
}

#[test]
fn grouped_and_plain_imports_are_both_seen() {
    let source = "use crate::{engine::Usage, memory::{Schema, Op}, Error};\n\
                  use crate::run::dir::RunDir;\nfn f() { prism::bench::x(); }\n\
                  #[cfg(test)]\nmod tests { use crate::cli; }";
    assert_eq!(
        modules_named(source),
        ["engine", "memory", "Error", "run", "bench"]
    );
}
