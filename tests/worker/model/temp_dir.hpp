// A temporary directory (mkdtemp) removed with its contents at scope exit.
#pragma once

#include <cstdlib>
#include <filesystem>
#include <stdexcept>
#include <string>

namespace servedeck::test {

class TempDir {
 public:
  TempDir() {
    const auto base = std::filesystem::temp_directory_path() / "servedeck-model-XXXXXX";
    std::string tmpl = base.string();
    if (!::mkdtemp(tmpl.data())) throw std::runtime_error("mkdtemp failed for " + tmpl);
    path_ = tmpl;
  }
  ~TempDir() {
    std::error_code ec;
    std::filesystem::remove_all(path_, ec);
  }
  TempDir(const TempDir&) = delete;
  TempDir& operator=(const TempDir&) = delete;
  const std::string& path() const { return path_; }
  std::string operator/(const std::string& name) const { return (std::filesystem::path(path_) / name).string(); }

 private:
  std::string path_;
};

}  // namespace servedeck::test
