//! Client-facing APIs: parse each API into the normalized run shape and render
//! normalized run events back into that API's wire format.

pub mod error;
pub mod openai_chat;
