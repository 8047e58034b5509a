//! Corpus sample: Rust with lifetimes, traits, macros and error handling.
use std::collections::HashMap;
use std::fmt;

#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum Kind<'a> {
    Word(&'a str),
    Number(u64),
    Punct(char),
}

impl<'a> fmt::Display for Kind<'a> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Kind::Word(w) => write!(f, "word:{w}"),
            Kind::Number(n) => write!(f, "num:{n:08}"),
            Kind::Punct(c) => write!(f, "punct:{c:?}"),
        }
    }
}

pub fn classify(s: &str) -> Result<Vec<Kind<'_>>, Box<dyn std::error::Error>> {
    let mut out = Vec::with_capacity(s.len() / 4);
    for piece in s.split_whitespace() {
        if let Ok(n) = piece.parse::<u64>() {
            out.push(Kind::Number(n));
        } else if piece.chars().all(|c| c.is_alphabetic()) {
            out.push(Kind::Word(piece));
        } else {
            out.extend(piece.chars().filter(|c| !c.is_alphanumeric()).map(Kind::Punct));
        }
    }
    Ok(out)
}

fn main() {
    let mut counts: HashMap<String, usize> = HashMap::new();
    for k in classify("let x = 42 ; y != z && über 18446744073709551615").unwrap_or_default() {
        *counts.entry(k.to_string()).or_insert(0) += 1;
    }
    println!("{:#?}", counts);
}
