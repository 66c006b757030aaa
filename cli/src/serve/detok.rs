//! Incremental detokenisation: the text a new token adds, from a short window of
//! the last tokens rather than the whole completion decoded again at every token.
//!
//! A token's text can depend on the tokens before it (a byte-level piece that
//! completes a character, a decoder that strips the first token's leading space),
//! so each new token is decoded together with the tokens since the last emitted
//! text began, and only what that window's text gained is new: the method of
//! Hugging Face's text-generation-inference (`decode_token`, its `prefix_offset`
//! and `read_offset`). A window whose text ends in an incomplete character (the
//! replacement character U+FFFD) emits nothing until a later token completes it;
//! [`Detokeniser::finish`] emits whatever is left, as decoding the whole
//! completion would.

use privmix_models::Tokenizer;

use crate::error::CliError;

/// The decoding state of one completion.
#[derive(Debug, Default)]
pub struct Detokeniser {
    tokens: Vec<u32>,
    /// Where the window decoded for the next token starts.
    prefix_offset: usize,
    /// Tokens up to here are in the emitted text.
    read_offset: usize,
}

impl Detokeniser {
    /// The tokens pushed so far.
    pub fn tokens(&self) -> &[u32] {
        &self.tokens
    }

    /// Adds `token`; returns the text it completes (possibly empty).
    pub fn push(&mut self, tokenizer: &Tokenizer, token: u32) -> Result<String, CliError> {
        self.tokens.push(token);
        let decode = |ids: &[u32]| {
            tokenizer
                .decode(ids)
                .map_err(|e| CliError::Tokenizer(e.to_string()))
        };
        let prefix = decode(&self.tokens[self.prefix_offset..self.read_offset])?;
        let text = decode(&self.tokens[self.prefix_offset..])?;
        match text.get(prefix.len()..) {
            Some(new) if !new.is_empty() && !text.ends_with('\u{FFFD}') => {
                let new = new.to_string();
                self.prefix_offset = self.read_offset;
                self.read_offset = self.tokens.len();
                Ok(new)
            }
            _ => Ok(String::new()),
        }
    }

    /// The text of the tokens not yet emitted (an incomplete character included).
    pub fn finish(&mut self, tokenizer: &Tokenizer) -> Result<String, CliError> {
        if self.read_offset == self.tokens.len() {
            return Ok(String::new());
        }
        let decode = |ids: &[u32]| {
            tokenizer
                .decode(ids)
                .map_err(|e| CliError::Tokenizer(e.to_string()))
        };
        let prefix = decode(&self.tokens[self.prefix_offset..self.read_offset])?;
        let text = decode(&self.tokens[self.prefix_offset..])?;
        self.prefix_offset = self.read_offset;
        self.read_offset = self.tokens.len();
        Ok(text.get(prefix.len()..).unwrap_or_default().to_string())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tokenizer() -> Tokenizer {
        let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("tests/fixtures/tokenizer/tokenizer.json");
        Tokenizer::from_file(path).unwrap()
    }

    /// Every prefix's pieces, joined, are the whole completion decoded at once.
    #[test]
    fn pieces_join_to_the_whole_decoding() {
        let tok = tokenizer();
        for text in ["hello world, again", "héllo wörld 日本語 ✓", " a  b\n\nc"] {
            let ids = tok.encode(text, false).unwrap();
            let mut d = Detokeniser::default();
            let mut joined = String::new();
            for (k, &id) in ids.iter().enumerate() {
                joined.push_str(&d.push(&tok, id).unwrap());
                let whole = tok.decode(&ids[..=k]).unwrap();
                // What was emitted is a prefix of the whole decoding.
                assert!(whole.starts_with(&joined), "{whole:?} vs {joined:?}");
            }
            joined.push_str(&d.finish(&tok).unwrap());
            assert_eq!(joined, tok.decode(&ids).unwrap());
            assert_eq!(d.tokens(), &ids[..]);
        }
    }

    /// A byte-level token that leaves a character incomplete emits nothing; the one
    /// completing it emits the character; `finish` emits an incomplete tail.
    #[test]
    fn incomplete_characters_wait() {
        let tok = tokenizer();
        let ids = tok.encode("日", false).unwrap();
        let mut d = Detokeniser::default();
        let mut pieces = Vec::new();
        for &id in &ids {
            pieces.push(d.push(&tok, id).unwrap());
        }
        assert_eq!(pieces.concat(), "日");
        assert!(pieces.iter().all(|p| !p.contains('\u{FFFD}')));
        if ids.len() > 1 {
            let mut d = Detokeniser::default();
            assert_eq!(d.push(&tok, ids[0]).unwrap(), "");
            assert_eq!(d.finish(&tok).unwrap(), tok.decode(&ids[..1]).unwrap());
        }
    }
}
