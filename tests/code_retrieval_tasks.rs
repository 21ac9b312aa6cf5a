//! `scripts/code-retrieval` on the small `durations` package in
//! tests/fixtures/code-package: which functions become targets, the tree it
//! writes for the model (the targets' docstrings cut out, every other byte
//! kept), and what `fetch` checks before it writes anything: a pinned wheel's
//! checksum, a function still where the task says, a task file not built
//! from a local directory. A task file pins a wheel by file name and sha256,
//! never by URL: `fetch` takes it from the wheelhouse `PRISM_PYPI_WHEELHOUSE`
//! names, or from the URL the index `PRISM_PYPI_URL` lists for that file
//! name (here a file:// index, so no test touches the network).

use std::collections::HashSet;
use std::fs;
use std::path::Path;
use std::process::{Command, Output};

use serde_json::Value;

const FIXTURE: &str = "tests/fixtures/code-package";
const FILES: [&str; 3] = [
    "durations/__init__.py",
    "durations/format.py",
    "durations/parse.py",
];
const PARSE_DURATION: &str = "Turn a text such as 3h 20m into a number of seconds.";
/// The file name the fixture's wheel is pinned by.
const WHEEL: &str = "durations-0.1.0-py3-none-any.whl";
const WHEELHOUSE_ENV: &str = "PRISM_PYPI_WHEELHOUSE";
const INDEX_ENV: &str = "PRISM_PYPI_URL";

/// Zip the fixture into a wheel (argv[1]) and print its sha256.
const MAKE_WHEEL: &str = r#"
import hashlib, pathlib, sys, zipfile
wheel, root = pathlib.Path(sys.argv[1]), pathlib.Path(sys.argv[2])
with zipfile.ZipFile(wheel, "w") as archive:
    for path in sorted(root.rglob("*.py")):
        archive.write(path, path.relative_to(root).as_posix())
    archive.writestr("durations-0.1.0.dist-info/METADATA", "Name: durations\nVersion: 0.1.0\n")
print(hashlib.sha256(wheel.read_bytes()).hexdigest())
"#;

/// Run `python3 scripts/code-retrieval ARGS` from the repository root, with
/// neither a wheelhouse nor an index from the caller's environment.
fn script(args: &[&str]) -> Output {
    script_with(args, &[])
}

/// [`script`] with the environment variables `env` set.
fn script_with(args: &[&str], env: &[(&str, &str)]) -> Output {
    let mut command = Command::new("python3");
    command
        .arg("scripts/code-retrieval")
        .args(args)
        .env_remove(WHEELHOUSE_ENV)
        .env_remove(INDEX_ENV)
        .current_dir(env!("CARGO_MANIFEST_DIR"));
    for (key, value) in env {
        command.env(key, value);
    }
    command.output().expect("python3 runs")
}

/// Fetch `task_file` with the wheelhouse `house`.
fn fetch_from_wheelhouse(task_file: &str, house: &Path) -> Output {
    script_with(
        &["fetch", task_file],
        &[(WHEELHOUSE_ENV, house.to_str().unwrap())],
    )
}

fn stderr(output: &Output) -> String {
    String::from_utf8_lossy(&output.stderr).into_owned()
}

/// Assert the script failed with one `code-retrieval:` line containing `needle`.
fn assert_one_error_line(output: &Output, needle: &str) {
    let message = stderr(output);
    assert!(!output.status.success(), "expected failure: {message}");
    let lines: Vec<&str> = message.lines().filter(|l| !l.trim().is_empty()).collect();
    assert_eq!(lines.len(), 1, "expected one error line: {message}");
    assert!(lines[0].starts_with("code-retrieval: "), "{message}");
    assert!(lines[0].contains(needle), "`{needle}` not in: {message}");
}

/// Build the fixture's task file at `dir`/tasks.json with `count` tasks, and
/// its repository tree beside it; the task file's content.
fn build(dir: &Path, count: usize) -> Value {
    let out = dir.join("tasks.json");
    let count = count.to_string();
    let output = script(&[
        "build",
        "--from-dir",
        FIXTURE,
        "--name",
        "durations",
        "--version",
        "0.1.0",
        "--tasks-per-repository",
        &count,
        "--out",
        out.to_str().unwrap(),
    ]);
    assert!(output.status.success(), "build failed: {}", stderr(&output));
    serde_json::from_str(&fs::read_to_string(out).unwrap()).unwrap()
}

fn tasks(content: &Value) -> &Vec<Value> {
    content["tasks"].as_array().unwrap()
}

fn target_names(content: &Value) -> Vec<&str> {
    tasks(content)
        .iter()
        .map(|task| task["function"].as_str().unwrap())
        .collect()
}

fn fixture(path: &str) -> Vec<u8> {
    fs::read(
        Path::new(env!("CARGO_MANIFEST_DIR"))
            .join(FIXTURE)
            .join(path),
    )
    .unwrap()
}

/// `text` without the docstrings of the functions whose `def` is at
/// `def_lines` (1-based): in the fixture each such docstring is `"""`-quoted
/// and starts on the line after its `def`.
fn without_docstrings(text: &str, def_lines: &[u64]) -> String {
    let lines: Vec<&str> = text.split_inclusive('\n').collect();
    let mut removed = HashSet::new();
    for &def in def_lines {
        let first = def as usize; // the 0-based index of the line after the def
        assert!(
            lines[first].trim_start().starts_with("\"\"\""),
            "{}",
            lines[first]
        );
        let mut quotes = 0;
        for (index, line) in lines.iter().enumerate().skip(first) {
            removed.insert(index);
            quotes += line.matches("\"\"\"").count();
            if quotes >= 2 {
                break;
            }
        }
    }
    let kept = lines
        .iter()
        .enumerate()
        .filter(|(index, _)| !removed.contains(index));
    kept.map(|(_, line)| *line).collect()
}

/// Zip the fixture into `dir`/[`WHEEL`]: its sha256.
fn fixture_wheel(dir: &Path) -> String {
    let wheel = dir.join(WHEEL);
    let output = Command::new("python3")
        .args(["-c", MAKE_WHEEL, wheel.to_str().unwrap(), FIXTURE])
        .current_dir(env!("CARGO_MANIFEST_DIR"))
        .output()
        .expect("python3 runs");
    assert!(output.status.success(), "zip failed: {}", stderr(&output));
    String::from_utf8(output.stdout).unwrap().trim().to_string()
}

/// Write `content` to `dir`/tasks.json, its repository pinned to the wheel
/// file name `wheel` and `sha256`; the task file's path.
fn pinned_task_file(dir: &Path, mut content: Value, wheel: &str, sha256: &str) -> String {
    content["repositories"][0]["wheel"] = wheel.into();
    content["repositories"][0]["sha256"] = sha256.into();
    let path = dir.join("tasks.json");
    fs::write(&path, serde_json::to_string_pretty(&content).unwrap()).unwrap();
    path.to_str().unwrap().to_string()
}

#[test]
fn the_target_docstring_is_removed_and_its_description_kept() {
    let dir = tempfile::tempdir().unwrap();
    let content = build(dir.path(), 3);
    let task = tasks(&content)
        .iter()
        .find(|task| task["function"] == "parse_duration")
        .unwrap_or_else(|| panic!("parse_duration is not a target: {content:#}"));
    assert_eq!(task["id"], "durations/parse_duration");
    assert_eq!(task["repository"], "durations");
    assert_eq!(task["file"], "durations/parse.py");
    assert_eq!(task["line"], 9);
    assert_eq!(task["description"], PARSE_DURATION);

    let tree = dir.path().join("repos/durations-0.1.0");
    let parse = fs::read_to_string(tree.join("durations/parse.py")).unwrap();
    assert!(parse.contains("def parse_duration("), "{parse}");
    assert!(!parse.contains(PARSE_DURATION), "{parse}");
    assert!(
        !parse.contains("when some of the text is not an amount"),
        "{parse}"
    );
}

#[test]
fn private_undocumented_and_twice_defined_functions_are_never_targets() {
    let dir = tempfile::tempdir().unwrap();
    let excluded = ["_seconds", "is_negative", "describe", "__init__"];
    let three = build(dir.path(), 3);
    assert_eq!(target_names(&three).len(), 3, "{three:#}");
    for name in excluded {
        assert!(!target_names(&three).contains(&name), "{name}: {three:#}");
    }
    // Asked for more than there are, every candidate is a target, in reading
    // order: not `total` (its description says "total") nor `is_long` (too
    // short a description) either.
    let all = build(dir.path(), 100);
    assert_eq!(
        target_names(&all),
        [
            "format_duration",
            "round_down",
            "parse_duration",
            "split_units",
            "as_minutes"
        ]
    );
}

#[test]
fn every_other_byte_of_the_tree_is_the_fixture() {
    let dir = tempfile::tempdir().unwrap();
    let content = build(dir.path(), 3);
    assert_eq!(
        content["repositories"][0]["files"],
        serde_json::json!(FILES)
    );
    // Pinned by name, version, wheel file name and sha256, never by URL: a
    // tree built from a directory has neither wheel nor sha256.
    let keys: Vec<&String> = content["repositories"][0]
        .as_object()
        .unwrap()
        .keys()
        .collect();
    assert_eq!(keys, ["name", "version", "wheel", "sha256", "files"]);
    assert_eq!(content["repositories"][0]["wheel"], Value::Null);
    assert_eq!(content["repositories"][0]["sha256"], Value::Null);
    for path in FILES {
        let def_lines: Vec<u64> = tasks(&content)
            .iter()
            .filter(|task| task["file"] == path)
            .map(|task| task["line"].as_u64().unwrap())
            .collect();
        let original = String::from_utf8(fixture(path)).unwrap();
        let written = fs::read(dir.path().join("repos/durations-0.1.0").join(path)).unwrap();
        assert_eq!(
            String::from_utf8(written).unwrap(),
            without_docstrings(&original, &def_lines),
            "{path}"
        );
    }
}

#[test]
fn fetch_refuses_a_task_file_built_from_a_local_directory() {
    let dir = tempfile::tempdir().unwrap();
    build(dir.path(), 3);
    let task_file = dir.path().join("tasks.json");
    let output = script(&["fetch", task_file.to_str().unwrap()]);
    assert_one_error_line(&output, "local directory");
}

/// Assert `fetched` holds the same repository tree as `built`.
fn assert_same_tree(fetched: &Path, built: &Path) {
    for path in FILES {
        let tree = Path::new("repos/durations-0.1.0").join(path);
        assert_eq!(
            fs::read(fetched.join(&tree)).unwrap(),
            fs::read(built.join(&tree)).unwrap(),
            "{path}"
        );
    }
}

/// A file:// package index under `dir` serving PyPI's JSON API for
/// durations 0.1.0: its listing names `listed` by a link relative to the
/// listing, and the fixture's wheel lies where that link leads. The index's
/// URL and the wheel's sha256.
fn file_index(dir: &Path, listed: &str) -> (String, String) {
    let files = dir.join("files");
    fs::create_dir_all(&files).unwrap();
    let sha256 = fixture_wheel(&files);
    let release = dir.join("pypi/durations/0.1.0");
    fs::create_dir_all(&release).unwrap();
    let listing = serde_json::json!({"urls": [{
        "filename": listed,
        "url": format!("../../../files/{listed}"),
        "digests": {"sha256": sha256}
    }]});
    fs::write(release.join("json"), listing.to_string()).unwrap();
    (format!("file://{}", dir.display()), sha256)
}

#[test]
fn fetch_writes_the_same_tree_from_a_pinned_wheel() {
    let built = tempfile::tempdir().unwrap();
    let content = build(built.path(), 3);
    let fetched = tempfile::tempdir().unwrap();
    let house = tempfile::tempdir().unwrap();
    let sha256 = fixture_wheel(house.path());
    let task_file = pinned_task_file(fetched.path(), content, WHEEL, &sha256);
    let output = fetch_from_wheelhouse(&task_file, house.path());
    assert!(output.status.success(), "fetch failed: {}", stderr(&output));
    assert_same_tree(fetched.path(), built.path());
}

#[test]
fn fetch_finds_the_pinned_wheel_through_the_index_listing() {
    let built = tempfile::tempdir().unwrap();
    let content = build(built.path(), 3);
    let fetched = tempfile::tempdir().unwrap();
    let index = tempfile::tempdir().unwrap();
    let (url, sha256) = file_index(index.path(), WHEEL);
    let task_file = pinned_task_file(fetched.path(), content, WHEEL, &sha256);
    let output = script_with(&["fetch", &task_file], &[(INDEX_ENV, url.as_str())]);
    assert!(output.status.success(), "fetch failed: {}", stderr(&output));
    assert_same_tree(fetched.path(), built.path());
}

#[test]
fn fetch_refuses_a_wheel_the_index_does_not_list_and_writes_nothing() {
    let built = tempfile::tempdir().unwrap();
    let content = build(built.path(), 3);
    let fetched = tempfile::tempdir().unwrap();
    let index = tempfile::tempdir().unwrap();
    let (url, sha256) = file_index(index.path(), "durations-0.1.0-py2.py3-none-any.whl");
    let task_file = pinned_task_file(fetched.path(), content, WHEEL, &sha256);
    let output = script_with(&["fetch", &task_file], &[(INDEX_ENV, url.as_str())]);
    assert_one_error_line(
        &output,
        &format!("durations==0.1.0: the package index lists no file {WHEEL}"),
    );
    assert!(!fetched.path().join("repos").exists());
}

#[test]
fn fetch_takes_wheels_only_from_a_named_wheelhouse() {
    let built = tempfile::tempdir().unwrap();
    let content = build(built.path(), 3);
    let fetched = tempfile::tempdir().unwrap();
    // The index lists the wheel, but a wheelhouse is named, and lacks it.
    let index = tempfile::tempdir().unwrap();
    let (url, sha256) = file_index(index.path(), WHEEL);
    let house = tempfile::tempdir().unwrap();
    let task_file = pinned_task_file(fetched.path(), content, WHEEL, &sha256);
    let output = script_with(
        &["fetch", &task_file],
        &[
            (INDEX_ENV, url.as_str()),
            (WHEELHOUSE_ENV, house.path().to_str().unwrap()),
        ],
    );
    assert_one_error_line(
        &output,
        &format!("durations==0.1.0: no {WHEEL} in the wheelhouse"),
    );
    assert!(!fetched.path().join("repos").exists());
}

#[test]
fn fetch_refuses_a_wheel_whose_checksum_differs_and_writes_nothing() {
    let built = tempfile::tempdir().unwrap();
    let content = build(built.path(), 3);
    let fetched = tempfile::tempdir().unwrap();
    let house = tempfile::tempdir().unwrap();
    fixture_wheel(house.path());
    let task_file = pinned_task_file(fetched.path(), content, WHEEL, &"0".repeat(64));
    let output = fetch_from_wheelhouse(&task_file, house.path());
    assert_one_error_line(&output, "checksum mismatch");
    assert!(!fetched.path().join("repos").exists());
}

#[test]
fn fetch_refuses_a_wheel_name_that_is_not_a_file_name() {
    let built = tempfile::tempdir().unwrap();
    let content = build(built.path(), 3);
    let fetched = tempfile::tempdir().unwrap();
    let house = tempfile::tempdir().unwrap();
    let sha256 = fixture_wheel(house.path());
    let wheel = format!("../{WHEEL}");
    let task_file = pinned_task_file(fetched.path(), content, &wheel, &sha256);
    let output = fetch_from_wheelhouse(&task_file, &house.path().join("sub"));
    assert_one_error_line(&output, "is not a wheel's file name");
    assert!(!fetched.path().join("repos").exists());
}

#[test]
fn fetch_refuses_a_task_whose_function_is_no_longer_at_its_line() {
    let built = tempfile::tempdir().unwrap();
    let mut content = build(built.path(), 3);
    let task = content["tasks"]
        .as_array_mut()
        .unwrap()
        .iter_mut()
        .find(|task| task["function"] == "parse_duration")
        .unwrap();
    task["line"] = 10.into();
    let fetched = tempfile::tempdir().unwrap();
    let house = tempfile::tempdir().unwrap();
    let sha256 = fixture_wheel(house.path());
    let task_file = pinned_task_file(fetched.path(), content, WHEEL, &sha256);
    let output = fetch_from_wheelhouse(&task_file, house.path());
    assert_one_error_line(&output, "parse_duration");
    assert!(!fetched.path().join("repos").exists());
}
