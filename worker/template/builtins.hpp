// The global functions a chat template can call: range, namespace, dict, raise_exception,
// strftime_now (jinja2's globals as Hugging Face chat templates use them).
#pragma once

#include <functional>
#include <string>
#include <utility>
#include <vector>

#include "worker/template/value.hpp"

namespace servedeck::worker::tmpl {

/// The builtins as (name, function value) pairs, for a render's root scope.
///   range(stop) / range(start, stop[, step]): integers (booleans count as 0/1); more than 100000
///     items throws EvalError (jinja2's sandbox MAX_RANGE), step 0 throws; `on_step` is called once
///     per item (the render's step budget).
///   namespace([mapping or pairs], **kw): a mutable namespace, passed to `on_namespace` (the
///     renderer clears it after the render, breaking reference cycles).
///   dict([mapping], **kw); raise_exception(msg) throws TemplateRaised(msg);
///   strftime_now(format): local time formatted with strftime (at most 511 bytes).
/// Argument errors throw EvalError naming the function and what it expected.
std::vector<std::pair<std::string, Value>> builtin_globals(std::function<void()> on_step,
                                                          std::function<void(const Value&)> on_namespace);

}  // namespace servedeck::worker::tmpl
