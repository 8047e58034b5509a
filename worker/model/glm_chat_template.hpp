// GLM-4.5's chat template as the checkpoint ships it, for the tiny GLM checkpoint
// (make-tiny-model --model-type glm4_moe). The text is tests/worker/template/fixtures/glm_4_5.jinja
// (its source is named in that directory's README.md), embedded at build time, so the template
// the parity tests check is the one the tiny model serves.
#pragma once

#include <string_view>

namespace servedeck::worker {

/// GLM-4.5's chat_template.jinja, byte for byte.
std::string_view glm45_chat_template();

}  // namespace servedeck::worker
