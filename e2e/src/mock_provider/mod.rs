//! `iop-mock-provider`: a deterministic mock LLM provider that speaks both the
//! Ollama API (`/api/*`) and the OpenAI API (`/v1/*`), with fault knobs.
//!
//! # Endpoints
//!
//! | Route                       | Answer                                                   |
//! |-----------------------------|----------------------------------------------------------|
//! | `GET /api/tags`             | one model, `mock`                                        |
//! | `POST /api/chat`            | Ollama chat; NDJSON stream unless `"stream": false`      |
//! | `GET /v1/models`            | one model, `mock` (whatever chat asked for)              |
//! | `POST /v1/chat/completions` | OpenAI chat; SSE stream only with `"stream": true`       |
//! | `POST /v1/responses`        | OpenAI Responses, the same replies (see *Responses*)     |
//! | `POST /api/embed`           | Ollama embeddings (see *Embeddings*)                     |
//! | `POST /v1/embeddings`       | OpenAI embeddings (see *Embeddings*)                     |
//! | `POST /apply-template`      | llama.cpp's chat template (see *Tokenize*)               |
//! | `POST /tokenize`            | llama.cpp's tokenizer, one token per word (*Tokenize*)   |
//! | `GET /mock/stats`           | [`MockStats`] as JSON                                    |
//! | `GET /mock/requests`        | the request log (see *Request log*)                      |
//! | `POST /mock/requests/reset` | empties the request log                                  |
//! | `POST /mock/health`         | `{"healthy": bool}`: metadata endpoints answer 503 or not|
//! | `POST /mock/faults`         | `k=v,k=v`: replaces the process default knobs            |
//! | `POST /mock/api-key`        | the body becomes the required API key (empty: none)      |
//! | `POST /mock/scripts/reset`  | rewinds every script cursor (see *Scripted turns*)       |
//! | `GET /api/ps`               | Ollama's loaded models (see *Residency*)                 |
//! | `GET /props`                | llama.cpp's server properties (see *Residency*)          |
//! | `GET /api/v0/models`        | LM Studio's models with `state` (see *Residency*)        |
//! | `GET /api/v0/models/{model}`| LM Studio's model (see *Residency*)                      |
//! | `POST /mock/residency`      | `{"loaded": bool, "load_delay_ms"?: N}` (*Residency*)    |
//! | `GET /healthz`              | `ok`                                                     |
//!
//! With an API key (`--api-key`, [`MockConfig::api_key`]) every route but
//! `/mock/*` and `/healthz` answers `401` without `Authorization: Bearer <key>`.
//!
//! # Content
//!
//! The reply is `Hello from the IOP mock provider. You said: <last user message>`
//! (the echo is cut to 200 chars), or `w1 w2 … wN` with the `words=N` knob. It is
//! split at spaces into pieces that keep their leading space, one piece per
//! streamed chunk. `prompt_tokens` is the number of whitespace-separated words
//! in all messages, `completion_tokens` the number of pieces. `max_tokens`
//! (OpenAI) / `options.num_predict` (Ollama) truncate the pieces (finish reason
//! `length`). If the request has tools and the last message is a user message
//! containing `call tool`, the answer is one call to the first tool instead,
//! its arguments made from the tool's `parameters` schema by
//! [`crate::schema_example::example_for_schema`] (the required properties, or
//! all when none is, strings `"mock"`: `{"query":"mock"}` for a `query`
//! string; `{}` without a schema).
//!
//! When the request carries images (Ollama: `messages[].images`, an array of
//! base64 strings; OpenAI: content parts `{"type": "image_url", ...}`; either
//! form counts on either API), the echo ends in ` [images: N]`, N the number
//! of images in all messages: `… You said: <last user message> [images: 2]`.
//! `words`, `call tool` and scripted replies do not change. `POST /api/show`
//! lists the model's `capabilities` as Ollama does: `completion`, `tools`,
//! and `vision` unless the model is text-only: its name starts with `text`,
//! or it has the `text_only` knob (the chat endpoints still answer it, but
//! `text_only` refuses its images).
//!
//! # Structured output
//!
//! A chat request whose answer must follow a JSON Schema (Ollama: `format`
//! is an object, `"json"` changes nothing; OpenAI Chat: `response_format:
//! {"type": "json_schema", "json_schema": {"schema"}}`) is answered, as a
//! provider's grammar would force, with a value that satisfies it
//! ([`crate::schema_example::example_for_schema`]), as pretty-printed JSON
//! text split into pieces like the echo, instead of the echo or the `call
//! tool` call (a scripted turn still wins).
//!
//! # Prefill continuation
//!
//! Like Ollama and llama.cpp's server, the mock continues a prefilled
//! assistant turn: with `words=N`, when the request's last message is an
//! assistant message whose text's last word is `wK`, the reply is exactly
//! the rest, ` w(K+1) … wN` (with its leading space, none when the prefill
//! already ends in whitespace), so prefill + reply is `w1 … wN` by plain
//! concatenation; nothing when K ≥ N. With `repeat_prefill`, as llama.cpp's
//! server does, the reply starts with the prefill itself (prefill +
//! continuation, split into pieces like any reply). Pieces, usage and the fault knobs
//! apply to the continuation as to any reply. Without `words`, or when the
//! prefill does not end in such a word, the reply is the usual one.
//!
//! # Reasoning
//!
//! A request that asks for reasoning (Ollama: `"think": true` or a level
//! string such as `"high"`; OpenAI: `reasoning_effort` present and not null)
//! gets `Thinking about: <last user message>` (cut like the echo) before its
//! reply, whatever the reply is (echo, `words`, tool call or scripted turn),
//! split into pieces like the reply. Ollama carries them in `message.thinking`
//! (one NDJSON chunk per piece, with an empty `content`; the whole text in the
//! non-streaming `message`), the OpenAI API in `delta.reasoning_content`
//! (after the role chunk) / `message.reasoning_content`, as llama.cpp, vLLM
//! and DeepSeek do. Reasoning pieces are content chunks for the fault knobs
//! and count into `completion_tokens` / `eval_count`; `max_tokens` /
//! `num_predict` truncate only the reply. Without the switch (or with
//! `"think": false`) nothing changes.
//!
//! # Responses
//!
//! `POST /v1/responses` reads `instructions` as the system message and
//! `input` (a string, or message items whose `content` is a string or
//! `input_text` parts, and `function_call_output` items, read as tool
//! messages) as the conversation, then plans the same reply as the chat
//! endpoints (`max_output_tokens` truncates, `reasoning` asks for
//! reasoning, `call tool` calls the first of `tools`). It answers a
//! `response` object (`output`: a `reasoning` item if asked, then a
//! `message` with one `output_text`, or `function_call` items; `usage` in
//! input/output tokens; `status` `incomplete` when truncated, the message's
//! too), or with
//! `"stream": true` its typed events: `response.created`, each item's
//! `response.output_item.added`, its deltas (`response.reasoning_text.delta`,
//! `response.output_text.delta`, `response.function_call_arguments.delta`)
//! and `.done` events, then `response.completed` (or
//! `response.incomplete`) carrying the whole response. The fault knobs
//! apply as on the chat endpoints (the deltas, and a call's first event, are
//! the content chunks).
//!
//! # Embeddings
//!
//! `POST /api/embed` takes `{"model", "input": string | [string]}` and answers
//! `{"model", "embeddings": [[8 floats] per input], "total_duration": 0,
//! "load_duration": 0, "prompt_eval_count": <words in all inputs>}`.
//! `POST /v1/embeddings` takes `{"model", "input": string | [string],
//! "encoding_format"?: "float" | "base64", "dimensions"?: 1..=8}` and answers
//! `{"object": "list", "data": [{"object": "embedding", "index": i,
//! "embedding": [floats] | "<base64>"}], "model", "usage": {"prompt_tokens":
//! <words>, "total_tokens": <words>}}`.
//!
//! A vector depends on its text alone ([`embedding`]): 8 floats from a hash of
//! the text, scaled to unit length, so equal texts give equal vectors and
//! different texts different ones. `dimensions` keeps the first n floats and
//! scales them to unit length again (as OpenAI shortens its vectors);
//! `base64` is the base64 of the floats' little-endian `f32` bytes. A missing
//! `model`, an `input` that is not a string or a non-empty array of strings
//! (token arrays included), or a bad `encoding_format` / `dimensions` is a 400
//! in the API's error shape. The model is echoed; of the fault knobs (from
//! all three sources) only `exit`, `hold`, `headers_delay_ms`, `never_answer`
//! and `status` (+ `retry_after`, `fail_times`) apply. Embeddings do not count in
//! `requests_total`.
//!
//! # Tokenize
//!
//! `POST /tokenize` takes `{"content": "..."}` and answers `{"tokens": [ints]}`
//! like llama.cpp's server: one token per whitespace-separated word, a hash of
//! the word ([`tokenize`]). `POST /apply-template` takes an OpenAI chat body
//! and answers `{"prompt": "..."}`, the mock's chat template: every
//! message's text, joined by newlines. Tokenizing that prompt gives exactly
//! the `prompt_tokens` the chat endpoints report for the same messages. A
//! body of the wrong shape is a 400 in the OpenAI error shape; no fault
//! knobs apply. Ollama has no such endpoints, so neither has `/api/*`.
//!
//! # Request log
//!
//! Every request to a provider route (any path but `/mock/*` and `/healthz`,
//! unknown paths and requests the API key refuses included) is logged with its
//! body as it arrives, before anything else happens. `GET /mock/requests`
//! answers the last [`REQUEST_LOG_LIMIT`] (100), oldest first, as
//! `[{"method": "POST", "path": "/api/chat", "body": <body>}]` ([`RecordedRequest`]):
//! the body as JSON (parsed, so equal to what was sent but with its object
//! keys sorted), or as a string (lossy UTF-8; `""` when empty) when it is not
//! JSON; the path without the query. `POST /mock/requests/reset` empties
//! it; [`MockHandle::requests`] reads it in-process. Each body is bounded by
//! the server's body limit, so the log is bounded too.
//!
//! # Scripted turns
//!
//! With a script file ([`MockConfig::scripts`], `--script-file FILE`, loaded
//! once by [`Scripts::load`]), a request whose messages contain the marker
//! `iop-mock-script:<name>` (anywhere in any message's text; the name is
//! `[A-Za-z0-9_-]+`; the first marker counts) gets the next turn of script
//! `<name>` instead of the echo:
//!
//! ```yaml
//! scripts:
//!   fix-readme:
//!     - tool_calls: [{name: workspace_read, arguments: {path: README.md}}]
//!     - text: "I read it."
//! ```
//!
//! A turn is `{text}` or `{tool_calls: [{name, arguments: <object>}]}`,
//! exactly one of them. Each script has a cursor that advances by one on
//! every request that takes a turn; past the end the last turn repeats;
//! `POST /mock/scripts/reset` rewinds them all, and `GET /mock/stats` lists
//! the turns taken per script (`scripts`, omitted while empty). A marker
//! naming no loaded script is a 400 in the API's error shape.
//!
//! Text is split into pieces like the echo (so `max_tokens` / `num_predict`
//! truncate it); tool calls are rendered like `call tool`'s, several per
//! turn, with ids `call_<n>` (`n` counts scripted calls since start, so ids
//! are unique across turns), finish reason `tool_calls` (OpenAI) and the
//! arguments' keys sorted.
//! `completion_tokens` is the number of pieces, or 1 per tool call. Every
//! fault knob applies to a scripted reply as to the echo, except `words`
//! (the turn's text wins). A request answered by `status` or `never_answer`
//! takes no turn (a retry gets the same one); one that is held or delayed
//! takes its turn when it goes on.
//!
//! # Residency
//!
//! Like a Mac's model server, the mock has its model in memory or not
//! ([`ResidencyConfig`], process state, not per-request knobs):
//!
//! | Flag                     | Effect                                                        |
//! |--------------------------|---------------------------------------------------------------|
//! | `--loaded true\|false`   | whether the model is resident at start (default `true`)       |
//! | `--load-delay-ms N`      | how long a load takes (default 0)                             |
//! | `--residency-api API`    | `all` (default), `ollama`, `llama_cpp`, `lm_studio` or `none`: which residency endpoints answer; the others answer 404 like a server that lacks them |
//!
//! A chat, responses or embeddings request while the model is not resident
//! waits for a load before its headers (after its body is checked, before
//! the fault knobs act): the first one starts a load of `load-delay-ms`,
//! every request arriving meanwhile waits for that same load, and then the
//! model is resident ([`MockStats::loads`] counts loads). `POST
//! /mock/residency {"loaded": false}` evicts it (`true` makes it resident
//! without a load; `load_delay_ms` changes the delay of later loads).
//!
//! The endpoints, in each server's shape, answer for every model name a
//! request named (`/api/show`, chat, embeddings, LM Studio's per-model
//! call; by its base name, without the `@knobs` suffix: [`base_model`]),
//! and for `mock` from the start:
//!
//! - Ollama `GET /api/ps`: while resident, each as Ollama lists a loaded
//!   model (`name` and `model` with the tag, `:latest` when it has none;
//!   `size` and `size_vram` [`MODEL_SIZE_BYTES`], `expires_at` five minutes
//!   ahead, `details`, `digest`, `context_length`); `{"models": []}` while not.
//! - llama.cpp `GET /props`: while resident `200` with
//!   `default_generation_settings`, `total_slots`, `model_path`,
//!   `modalities` (`vision` false once a text-only model was named); while not
//!   `503 {"error": {"code": 503, "message": "Loading model", "type":
//!   "unavailable_error"}}`.
//! - LM Studio `GET /api/v0/models` (`{"object": "list", "data": [..]}`)
//!   and `GET /api/v0/models/{model}` (any name, learned): `{"id", "object":
//!   "model", "type": "vlm" (`llm` for a text-only model), "state": "loaded" | "not-loaded",
//!   "max_context_length", ..}`.
//!
//! # Fault knobs
//!
//! A [`Faults`] set is merged from three sources, later ones winning: the
//! process defaults ([`MockConfig::defaults`], command-line flags of the binary),
//! the model name suffix after `@` (`mock@stall_after=2,chunk_delay_ms=10`; the
//! full model string is echoed back), and the `x-mock-faults: k=v,k=v` header.
//! Unknown knobs or bad values give a 400 in the API's error shape.
//!
//! | Knob                     | Effect                                                        |
//! |--------------------------|---------------------------------------------------------------|
//! | `headers_delay_ms=MS`    | wait before sending the response headers                      |
//! | `first_token_delay_ms=MS`| headers go out, then wait before the first content chunk      |
//! | `chunk_delay_ms=MS`      | wait between content chunks                                   |
//! | `end_delay_ms=MS`        | streams: after the last bytes (`[DONE]` too), keep the body open MS before it ends |
//! | `stall_after=N`          | send N content chunks, then send nothing more (until shutdown)|
//! | `cut_after=N`            | send N content chunks, then abort the body (see below)        |
//! | `malformed_at=N`         | the Nth (1-based) content chunk becomes `{"broken":`          |
//! | `malformed_run=N`        | N content chunks in a row from `malformed_at` (default 1) become `{"broken":` |
//! | `malformed_end[=BOOL]`   | the reply's end (finish, usage, `[DONE]`; Ollama's done line) becomes one `{"broken":` event and the body ends there |
//! | `no_done[=BOOL]`         | OpenAI only: omit the final `data: [DONE]`                    |
//! | `status=CODE`            | answer at once with this 4xx/5xx status and an error body     |
//! | `retry_after=SECS`       | with `status`: add a `Retry-After` header                     |
//! | `error_code=CODE`        | with `status`: the OpenAI error body's `code` (Ollama: none)  |
//! | `fail_times=N`           | with `status`: only the first N requests with this exact knob set fail; later ones answer normally (counted per mock process) |
//! | `never_answer[=BOOL]`    | never send headers (until the client leaves or shutdown)      |
//! | `exit[=BOOL]`            | the process exits with status 3 upon receiving the request    |
//! | `words=N`                | the reply is `w1 w2 … wN` (a prefill's rest: *Prefill continuation*) |
//! | `hold=NAME`              | before anything else, wait until `POST /mock/release/NAME`    |
//! | `context_window=N`       | a prompt of more than N words gets a 400 context-length error |
//! | `repeat_prefill[=BOOL]`  | a continued prefill (`words`) is repeated before its continuation |
//! | `text_only[=BOOL]`       | a request with an image gets llama.cpp's 500 `image input is not supported` |
//! | `sse_line_end=lf\|crlf\|cr`| OpenAI streams only: how SSE lines end (all three are valid)  |
//!
//! `stall_after` / `cut_after` with N at or beyond the number of content chunks
//! act just before the final chunk (done line / finish reason), so the reply
//! never completes. `cut_after` makes the body stream yield an error: hyper then
//! drops the connection without the terminating zero-length chunk, so an
//! HTTP/1.1 client sees an incomplete chunked body (an error), not a clean end.
//!
//! Non-streaming requests honour the knobs too: the delays add up
//! (`first_token_delay_ms + chunk_delay_ms × (chunks − 1)`) before the
//! response, and when set (any N) `stall_after` holds the response,
//! `cut_after` sends half of the body then aborts it and `malformed_at`,
//! `malformed_run` and `malformed_end` replace the body with `{"broken":`.
//!
//! All waiting uses `tokio::time`, and streaming bodies are produced lazily, so
//! delays and stalls are real on the wire and a client disconnect drops the
//! body (counted in [`MockStats::aborted_streams`]).

mod answer;
mod api;
mod control;
mod embeddings;
mod faults;
mod ollama;
mod openai;
mod plan;
mod residency;
mod responses;
mod scripts;
mod server;
mod state;
mod streaming;

pub use embeddings::{EMBEDDING_DIMENSIONS, TOKEN_VOCABULARY, embedding, tokenize};
pub use faults::{FAULTS_HEADER, FaultError, Faults, KNOBS, LineEnd, parse_faults};
pub use residency::{MODEL_CONTEXT_LENGTH, MODEL_NAME, MODEL_SIZE_BYTES, ResidencyApi, ResidencyConfig, base_model};
pub use scripts::{SCRIPT_MARKER, ScriptError, ScriptToolCall, ScriptTurn, Scripts};
pub use server::{MockConfig, MockHandle, serve, start};
pub use state::{MockStats, REQUEST_LOG_LIMIT, RecordedRequest};

#[cfg(test)]
mod tests;
