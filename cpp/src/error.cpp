#include "pagedllm/error.h"

namespace pagedllm::detail {

void throw_error(ErrorKind kind, const char* file, int line, const std::string& msg) {
  // Keep only the file's base name: messages are read by users, not build systems.
  std::string path(file);
  const auto slash = path.find_last_of('/');
  if (slash != std::string::npos) path = path.substr(slash + 1);
  throw Error(kind, msg + " [" + path + ":" + std::to_string(line) + "]");
}

}  // namespace pagedllm::detail
