// Internal to the template value operations (ops.hpp): the helper shared by ops.cpp
// (lookup, iteration, ordering, arithmetic, printf) and ops_json.cpp (JSON in and out). Not
// part of the public API; include it from nowhere else.
#pragma once

#include <string>

#include "worker/template/value.hpp"

namespace servedeck::worker::tmpl::detail {

/// The Python type name of a value, as error messages print it ("int", "str", "dict").
inline std::string type_name(const Value& v) { return to_string(v.kind()); }

}  // namespace servedeck::worker::tmpl::detail
