//! Multi-round-trip requests (MRTR): a tool that may ask the client for input before it acts
//! returns a [`Step`]; [`confirm`] and [`confirmed`] make the common case — "confirm this
//! charge?" — one line each; and the check a continuation passes inside its claim before the
//! tool runs.
//!
//! Guarantees: an input request never completes an operation (it is "nothing happened": the
//! claim is released and the continuation claims afresh); the `requestState` it carries is
//! sealed to the operation; a continuation runs the tool only with a state that opens for it —
//! and, under `single_use_state`, only the first time.

use std::collections::BTreeMap;
use std::marker::PhantomData;
use std::time::Duration;

use rmcp::ErrorData;
use rmcp::handler::server::tool::IntoCallToolResult;
use rmcp::model::{
    CallToolResponse, ElicitRequest, ElicitRequestParams, ElicitResult, ElicitationAction, ElicitationSchema,
    InputRequest, InputRequiredResult, InputResponses,
};
use serde::Deserialize;

use super::context::ToolContext;
use crate::idem::Ran;
use crate::idem::{EchoedState, Idem, current_operation};
use crate::macro_support::{HandlerResult, Unrecorded};
use crate::rejection::Rejection;

/// One round of a tool that may ask for input before it acts: its result, or an input request.
///
/// An idempotent tool returns `Result<Step<S>, E>` where it would return `Result<S, E>`; what
/// is stored and replayed is what `S` would store (`Step<rmcp::Json<T>>` stores `T`). An
/// [`InputRequired`](Step::InputRequired) answer is never stored: the operation is not done, so
/// its claim is released, and the continuation (the same arguments with `inputResponses` and
/// the echoed `requestState`) runs the tool again. The `requestState` the client sees is idem's
/// seal around the tool's own (which the tool gets back through rmcp's `RequestState`).
///
/// ```
/// use idem_runtime::mcp::{self, Step, ToolError};
/// use rmcp::model::InputResponses;
///
/// // A tool's body, given its `InputResponses(responses)` parameter: ask first, then act on an
/// // accepted confirmation (`examples/mcp_server.rs` has the whole tool).
/// fn charge(responses: Option<&InputResponses>, cents: u64) -> Result<Step<String>, ToolError> {
///     match mcp::confirmed(responses, "confirm") {
///         None => Ok(Step::InputRequired(mcp::confirm("confirm", format!("Charge {cents} cents?")))),
///         Some(false) => Err(ToolError::nothing_happened("declined; nothing was charged")),
///         Some(true) => Ok(Step::Done(format!("charged {cents} cents"))),
///     }
/// }
///
/// assert!(matches!(charge(None, 24_000), Ok(Step::InputRequired(_))));
/// let accepted = InputResponses::from([("confirm".to_owned(), serde_json::json!({ "action": "accept" }))]);
/// assert!(matches!(charge(Some(&accepted), 24_000), Ok(Step::Done(_))));
/// ```
#[derive(Debug, Clone)]
#[non_exhaustive]
pub enum Step<S> {
    /// The tool acted: its result.
    Done(S),
    /// The tool asks the client for input before it acts.
    InputRequired(InputRequiredResult),
}

/// The [`HandlerResult`] shape of `Result<Step<S>, E>`: stored as `Result<S, E>` would be (its
/// own shape `M`), and an input request when it is one.
pub struct StepOf<M>(PhantomData<M>);

impl<S, E, M> HandlerResult<StepOf<M>> for Result<Step<S>, E>
where
    Result<S, E>: HandlerResult<M, Err = E>,
{
    type Success = <Result<S, E> as HandlerResult<M>>::Success;
    type Ok = <Result<S, E> as HandlerResult<M>>::Ok;
    type Err = E;

    fn into_result(self) -> Result<<Result<S, E> as HandlerResult<M>>::Ok, E> {
        match self {
            Ok(Step::Done(success)) => Ok(success).into_result(),
            Err(error) => Err(error),
            // Never asked: `request_state` says this is an input request first.
            Ok(Step::InputRequired(_)) => {
                unreachable!("an input request is answered, never split into an outcome")
            }
        }
    }

    fn from_result(result: Result<<Result<S, E> as HandlerResult<M>>::Ok, E>) -> Self {
        <Result<S, E>>::from_result(result).map(Step::Done)
    }

    fn request_state(&mut self) -> Option<&mut Option<String>> {
        match self {
            Ok(Step::InputRequired(request)) => Some(&mut request.request_state),
            _ => None,
        }
    }
}

impl<S: IntoCallToolResult> IntoCallToolResult for Step<S> {
    fn into_call_tool_result(self) -> Result<CallToolResponse, ErrorData> {
        match self {
            Self::Done(result) => result.into_call_tool_result(),
            Self::InputRequired(request) => Ok(CallToolResponse::InputRequired(request)),
        }
    }
}

/// An input request that asks the user to accept or decline: one elicitation, under `id`, whose
/// form has no fields (accepting is the answer). [`confirmed`] reads the answer.
#[must_use]
pub fn confirm(id: &str, message: impl Into<String>) -> InputRequiredResult {
    let params = ElicitRequestParams::FormElicitationParams {
        meta: None,
        message: message.into(),
        requested_schema: ElicitationSchema::new(BTreeMap::new()),
    };
    let request = InputRequest::Elicitation(ElicitRequest::new(params));
    InputRequiredResult::from_input_requests(BTreeMap::from([(id.to_owned(), request)]))
}

/// The answer to the confirmation [`confirm`] asked under `id`: `Some(true)` when the user
/// accepted, `Some(false)` when they declined or cancelled, `None` when there is no answer (the
/// first round, or a response that is not an elicitation result).
#[must_use]
pub fn confirmed<'a>(responses: impl Into<Option<&'a InputResponses>>, id: &str) -> Option<bool> {
    let response = responses.into()?.get(id)?;
    let result = ElicitResult::deserialize(response).ok()?;
    Some(result.action == ElicitationAction::Accept)
}

/// What a round of an rmcp tool checks before the tool runs, and seals after it asks.
pub(crate) struct Continuation<'a> {
    idem: &'a Idem,
    state: Option<&'a EchoedState>,
    answers: bool,
    single_use: bool,
    ttl: Duration,
}

impl<'a> Continuation<'a> {
    pub(crate) fn of(idem: &'a Idem, context: &'a ToolContext, single_use: bool, ttl: Duration) -> Self {
        Self { idem, state: context.echoed_state(), answers: context.input_responses().is_some(), single_use, ttl }
    }

    /// Inside the won claim, before the tool runs: the echoed state opens for this operation
    /// (and, single-use, is consumed now); input responses come with one.
    ///
    /// # Errors
    /// The refusal: nothing runs, and the claim is released as "nothing happened".
    async fn check(&self) -> Result<(), Rejection> {
        let Some(operation) = current_operation() else { return Ok(()) };
        let Some(state) = self.state else {
            if self.answers {
                return Err(Rejection::RequestStateInvalid {
                    why: "input responses came without the requestState of the input request they answer",
                });
            }
            return Ok(());
        };
        let (nonce, binding) = self.idem.open_state(operation.binding(), state)?;
        if self.single_use
            && let EchoedState::Sealed { expires, .. } = state
        {
            self.idem.consume_state(binding, nonce, *expires).await?;
        }
        Ok(())
    }

    /// One round of the tool under the claim: checked, run, and an input request sealed.
    pub(crate) async fn run<R, M, Fut>(self, handler: impl FnOnce() -> Fut) -> Ran<R::Ok, R::Err, Unrecorded<R>>
    where
        R: HandlerResult<M>,
        Fut: Future<Output = R>,
    {
        if let Err(rejection) = self.check().await {
            return Ran::Unrecorded(Unrecorded::Refused(rejection));
        }
        let mut result = handler().await;
        if let Some(state) = result.request_state() {
            if let Some(operation) = current_operation() {
                *state = Some(self.idem.seal_state(operation.binding(), state.as_deref(), self.ttl));
            }
            return Ran::Unrecorded(Unrecorded::Asked(result));
        }
        Ran::Outcome(result.into_result())
    }
}
