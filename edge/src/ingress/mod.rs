//! Client-facing APIs: parse each API into the normalized run shape and render
//! normalized run events back into that API's wire format.

#[cfg(test)]
mod answer_fuzz;
pub mod anthropic_messages;
mod documents;
pub mod embeddings;
pub mod error;
#[cfg(test)]
pub(crate) mod fuzz;
pub mod hosted_tools;
mod images;
mod json;
pub mod openai_chat;
mod openai_common;
pub mod openai_responses;
mod outcome;
#[cfg(test)]
mod test_events;
pub mod transcript;
