//! The config loader on the committed configs (`configs/*.yaml`) and on mutations of them: no
//! input panics `Config::parse`, and every refusal can be acted on: it carries a line, or (for
//! an error about the file as a whole) names the key in backquotes. This is the stable stand-in
//! for a cargo-fuzz target, which would have to build wasmtime under the sanitizer. (That the
//! configs themselves load is `scripts/test.sh`'s `configs` stage: it needs the built plugins.)

use std::path::{Path, PathBuf};

use proptest::prelude::*;
use proptest::test_runner::{Config as RunnerConfig, TestRunner};
use wasmswitch::config::{Config, ConfigError};

fn corpus() -> Vec<(PathBuf, String)> {
    let dir = Path::new(concat!(env!("CARGO_MANIFEST_DIR"), "/../configs"));
    let mut files: Vec<PathBuf> = std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|x| x == "yaml"))
        .collect();
    files.sort();
    assert!(!files.is_empty(), "no configs in {}", dir.display());
    files.into_iter().map(|p| (p.clone(), std::fs::read_to_string(&p).unwrap())).collect()
}

fn actionable(e: &ConfigError) -> bool {
    e.line > 0 || e.message.contains('`')
}

/// One edit of a YAML text: the kinds of damage a hand-edited file gets.
#[derive(Debug, Clone)]
enum Edit {
    DeleteLine(usize),
    DuplicateLine(usize),
    SwapLines(usize, usize),
    Indent(usize, i8),
    SetByte(usize, u8),
    Truncate(usize),
}

fn apply(text: &str, edit: &Edit) -> String {
    let mut lines: Vec<String> = text.lines().map(str::to_owned).collect();
    let n = lines.len().max(1);
    match *edit {
        Edit::DeleteLine(i) if !lines.is_empty() => {
            lines.remove(i % n);
        }
        Edit::DuplicateLine(i) if !lines.is_empty() => {
            let l = lines[i % n].clone();
            lines.insert(i % n, l);
        }
        Edit::SwapLines(i, j) if !lines.is_empty() => lines.swap(i % n, j % n),
        Edit::Indent(i, d) if !lines.is_empty() => {
            let l = &mut lines[i % n];
            if d > 0 {
                l.insert_str(0, &" ".repeat(d as usize));
            } else {
                let k = l.len() - l.trim_start_matches(' ').len();
                l.drain(..k.min(d.unsigned_abs() as usize));
            }
        }
        Edit::SetByte(at, b) => {
            let mut bytes = text.as_bytes().to_vec();
            if !bytes.is_empty() {
                let i = at % bytes.len();
                bytes[i] = b;
            }
            // Configs are UTF-8 (`Config::load` refuses anything else): keep the text valid.
            return String::from_utf8_lossy(&bytes).into_owned();
        }
        Edit::Truncate(at) => {
            let mut i = at % (text.len() + 1);
            while !text.is_char_boundary(i) {
                i -= 1;
            }
            return text[..i].to_owned();
        }
        _ => {}
    }
    lines.join("\n")
}

fn edit() -> impl Strategy<Value = Edit> {
    // Bytes that mean something to YAML or to the config's types.
    let byte = prop::sample::select(b": -\n{}[]#'\"&*!|>%@,09ax.\t".to_vec());
    prop_oneof![
        any::<usize>().prop_map(Edit::DeleteLine),
        any::<usize>().prop_map(Edit::DuplicateLine),
        (any::<usize>(), any::<usize>()).prop_map(|(i, j)| Edit::SwapLines(i, j)),
        (any::<usize>(), -4i8..=4).prop_map(|(i, d)| Edit::Indent(i, d)),
        (any::<usize>(), byte).prop_map(|(i, b)| Edit::SetByte(i, b)),
        any::<usize>().prop_map(Edit::Truncate),
    ]
}

#[test]
fn mutated_configs_never_panic_and_every_error_is_located_or_names_a_key() {
    let files = corpus();
    let mut runner =
        TestRunner::new(RunnerConfig { cases: 3000, failure_persistence: None, ..RunnerConfig::default() });
    let strategy = (0..files.len(), prop::collection::vec(edit(), 1..4));
    runner
        .run(&strategy, |(f, edits)| {
            let (path, text) = &files[f];
            let text = edits.iter().fold(text.clone(), |t, e| apply(&t, e));
            if let Err(e) = Config::parse(&text, path) {
                prop_assert!(actionable(&e), "unlocated error that names no key: {e}\n--- input:\n{text}");
            }
            Ok(())
        })
        .unwrap();
}
