// Reads the gateway test fixtures (tests/gateway/server/fixtures, README.md there): whole files,
// and the data payloads of an SSE recording.
#pragma once

#include <fstream>
#include <sstream>
#include <stdexcept>
#include <string>
#include <vector>

#include "common/sse.hpp"

namespace servedeck::test {

/// The text of tests/gateway/server/fixtures/`name`. Throws naming the path when unreadable.
inline std::string read_gateway_fixture(const std::string& name) {
  const std::string path = std::string(SERVEDECK_SOURCE_DIR) + "/tests/gateway/server/fixtures/" + name;
  std::ifstream in(path, std::ios::binary);
  if (!in) throw std::runtime_error("cannot read fixture " + path);
  std::ostringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

/// The data payloads of the SSE fixture `name`, in order ("[DONE]" included).
inline std::vector<std::string> gateway_fixture_events(const std::string& name) {
  sse::Parser p;
  std::vector<std::string> out;
  for (auto& e : p.feed(read_gateway_fixture(name)))
    if (!e.comment) out.push_back(e.data);
  if (auto last = p.finish()) out.push_back(last->data);
  return out;
}

}  // namespace servedeck::test
